"""The dead-letter archive: one event per park, redelivery, dead letter, drop, replay, trim or purge.

Events go to a capped Redis Stream, ``{<prefix>}:events`` (``Keys.events``),
with ``XADD ... MAXLEN ~ dlq_events_max_length`` (0 turns the archive off).
``celery dlq export`` copies the stream to Parquet (:mod:`celery_dlq.export`),
and the Spark report (:mod:`celery_dlq.analytics`) reads that. A dead letter's
event carries the whole dead-letter record (:meth:`Envelope.dumps`: headers,
body base64), so the archive outlives a purge, a replay or a trim of the DLQ.

Appending never breaks the engine: each hook builds its events and sends
them in one command (one ``XADD``, or one pipeline for a mover's batch), and
any error is logged and swallowed. The engine's own write (the parked copy,
the dead letter) has already succeeded when a hook runs.

**The payload hash** (``payload_hash``) spots a payload that keeps failing:
SHA-256 over the task name and the message's arguments, 32 hex characters.
For a JSON body (Celery's default) the arguments are ``[args, kwargs]``
parsed with the standard ``json`` module and re-serialized canonically
(sorted keys, no whitespace), so the same call hashes the same whatever the
client's key order or Celery's ``embed`` (callbacks, chain) part. Any other
content type (pickle, yaml, msgpack, ...) is hashed as its raw body bytes:
decoding it would mean deserializing untrusted data, and pickle is never
loaded here. The two kinds never collide (the hash input says which it is).
"""
from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
import time
from dataclasses import dataclass, fields
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from celery_dlq import headers as H
from celery_dlq.envelope import Envelope

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
#: JSON bodies larger than this are hashed as raw bytes (bounds the hook's cost).
MAX_PARSED_BODY = 1024 * 1024
JSON_TYPES = ("application/json",)
#: ``Envelope.extra`` key: a parked copy carries its payload hash, so the mover's events need not hash again.
PAYLOAD_HASH = "payload_hash"


class EventType:
    """What happened to a message (the ``type`` of an event)."""

    PARKED = "parked"                # a failed delivery; the message waits in the delayed store
    REDELIVERED = "redelivered"      # the mover published the parked copy back to its queue
    DEAD_LETTERED = "dead_lettered"  # published to its DLQ (carries the full record)
    DROPPED = "dropped"              # last delivery failed with dead_letter=False (carries the record)
    REPLAYED = "replayed"            # an operator moved it from its DLQ back to a queue
    TRIMMED = "trimmed"              # retention deleted it from its DLQ (reason: why)
    PURGED = "purged"                # an operator deleted it from its DLQ

    ALL = (PARKED, REDELIVERED, DEAD_LETTERED, DROPPED, REPLAYED, TRIMMED, PURGED)


@dataclass(frozen=True)
class Event:
    """One archived event. Times are integer microseconds since the epoch (UTC).

    ``delivery`` is the delivery the event is about: the one that failed
    (parked, dead_lettered, dropped), or the one about to happen
    (redelivered). ``queue`` is the message's original queue, ``dlq`` its
    dead-letter queue. ``exception_message`` is cut to 1 kB here; the full
    text is in ``record`` (dead_lettered and dropped events only).
    """

    type: str
    ts_us: int
    task_id: str = ""
    task_name: str = ""
    queue: str = ""
    dlq: str = ""
    delivery: int = 0
    reason: str = ""
    exception_type: str = ""
    exception_message: str = ""
    first_failure_us: int | None = None
    due_us: int | None = None
    payload_size: int = 0
    payload_hash: str = ""
    worker: str = ""
    record: str = ""

    def to_fields(self) -> dict[str, str]:
        """The stream entry: every non-empty field as text, plus the schema version."""
        out = {"v": str(SCHEMA_VERSION)}
        for name in _FIELD_NAMES:  # not dataclasses.asdict: its deep copy was most of the mover's archiving time
            value = getattr(self, name)
            if value is not None and value != "":
                out[name] = str(value)
        return out

    @classmethod
    def from_fields(cls, entry: Mapping[Any, Any]) -> Event:
        """An event from a stream entry (bytes or text); unknown fields are ignored."""
        data = {_text(k): _text(v) for k, v in entry.items()}
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            value = data.get(f.name)
            if value is None:
                continue
            kwargs[f.name] = _int(value) if f.name in _INT_FIELDS else value
        kwargs["type"] = kwargs.get("type") or ""
        kwargs["ts_us"] = kwargs.get("ts_us") or 0
        kwargs["delivery"] = kwargs.get("delivery") or 0
        kwargs["payload_size"] = kwargs.get("payload_size") or 0
        return cls(**kwargs)


_FIELD_NAMES = tuple(f.name for f in fields(Event))
_INT_FIELDS = frozenset({"ts_us", "delivery", "first_failure_us", "due_us", "payload_size"})


def _int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def to_us(seconds: Any) -> int | None:
    """Unix seconds (a number or numeric text) to integer microseconds; None if not a time."""
    if isinstance(seconds, bool) or seconds in (None, ""):
        return None
    try:
        return int(round(float(seconds) * 1_000_000))
    except (TypeError, ValueError, OverflowError):
        return None


# -- the payload hash -----------------------------------------------------------

def payload_hash(task_name: str | None, body: bytes, content_type: str | None = None,
                 content_encoding: str | None = None) -> str:
    """A stable 32-hex-digit hash of task name + arguments (see the module docstring)."""
    canonical = _json_arguments(body, content_type, content_encoding)
    digest = hashlib.sha256()
    digest.update(b"json\0" if canonical is not None else b"raw\0")
    digest.update((task_name or "").encode("utf-8"))
    digest.update(b"\0")
    digest.update(canonical if canonical is not None else bytes(body or b""))
    return digest.hexdigest()[:32]


def _json_arguments(body: bytes, content_type: str | None, content_encoding: str | None) -> bytes | None:
    """``[args, kwargs]`` as canonical JSON bytes, or None when the body is not plain JSON."""
    if (content_type or "").split(";")[0].strip().lower() not in JSON_TYPES:
        return None
    if (content_encoding or "utf-8").lower().replace("_", "-") not in ("utf-8", "utf8", "binary"):
        return None
    if not body or len(body) > MAX_PARSED_BODY:
        return None
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if isinstance(doc, list) and len(doc) >= 2:          # protocol 2: [args, kwargs, embed]
        arguments = [doc[0], doc[1]]
    elif isinstance(doc, dict) and "args" in doc:         # protocol 1
        arguments = [doc.get("args"), doc.get("kwargs")]
    else:
        arguments = [doc, None]
    try:
        return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError, RecursionError):
        return None


# -- building events --------------------------------------------------------------

def letter_from_raw(raw: bytes | str) -> Envelope:
    """A dead letter as kombu's Redis transport stores it (a DLQ list element), as an Envelope.

    Its exchange, routing key and queue are the message's original ones (from
    the ``x-dlq-*`` headers), so :meth:`Envelope.publish` sends it home.
    """
    message = json.loads(raw)
    headers = message.get("headers") or {}
    properties = message.get("properties") or {}
    body = message.get("body") or ""
    if properties.get("body_encoding") == "base64":
        body_bytes = base64.b64decode(body)
    else:
        body_bytes = body.encode("utf-8") if isinstance(body, str) else bytes(body)
    queue = headers.get(H.ORIGINAL_QUEUE) or ""
    return Envelope(
        body=body_bytes, content_type=message.get("content-type"),
        content_encoding=message.get("content-encoding"), headers=headers,
        properties={k: properties[k] for k in ("correlation_id", "reply_to", "priority", "delivery_mode")
                    if properties.get(k) is not None},
        exchange=headers.get(H.ORIGINAL_EXCHANGE) or "",
        routing_key=headers.get(H.ORIGINAL_ROUTING_KEY) or queue, queue=queue)


def _as_envelope(letter: Any) -> Envelope:
    if isinstance(letter, Envelope):
        return letter
    if isinstance(letter, (bytes, bytearray, str)):
        return letter_from_raw(letter)
    raw = getattr(letter, "raw", None)          # celery_dlq.manage.DeadLetter
    if raw is not None:
        return letter_from_raw(raw)
    raise TypeError(f"not a dead letter: {type(letter).__name__}")


def event_of(kind: str, envelope: Envelope, *, ts: float | None = None, dlq: str = "",
             delivery: int | None = None, reason: str | None = None,
             failure: Mapping[str, str] | None = None, due: float | None = None,
             with_record: bool = False) -> Event:
    """The event of ``kind`` about ``envelope``; anything not given comes from its headers."""
    headers = envelope.headers or {}
    failure = failure or {}
    body = envelope.body or b""
    return Event(
        type=kind,
        ts_us=to_us(time.time() if ts is None else ts) or 0,
        task_id=str(envelope.task_id or ""),
        task_name=str(envelope.task_name or ""),
        queue=str(headers.get(H.ORIGINAL_QUEUE) or envelope.queue or ""),
        dlq=dlq or "",
        delivery=int(delivery if delivery is not None else H.delivery_count_of(headers)),
        reason=str(reason if reason is not None else headers.get(H.REASON) or ""),
        exception_type=str(failure.get("type") or headers.get(H.EXCEPTION_TYPE) or ""),
        exception_message=H.truncate(failure.get("message") or headers.get(H.EXCEPTION_MESSAGE) or "",
                                     H.MAX_SUMMARY),
        first_failure_us=to_us(headers.get(H.FIRST_FAILURE_AT)),
        due_us=to_us(due),
        payload_size=len(body),
        payload_hash=envelope.extra.get(PAYLOAD_HASH) or payload_hash(
            envelope.task_name, body, envelope.content_type, envelope.content_encoding),
        worker=str(headers.get(H.WORKER) or ""),
        record=envelope.dumps().decode("utf-8") if with_record else "",
    )


# -- the stream -----------------------------------------------------------------

class EventLog:
    """The archive stream of one key prefix: append (never raising) and read."""

    def __init__(self, client: Any, keys: Any, max_length: int) -> None:
        self.client = client
        self.key = keys.events
        self.max_length = int(max_length)

    @property
    def enabled(self) -> bool:
        return self.max_length > 0

    def append(self, events: Sequence[Event]) -> int:
        """Append ``events`` in one round trip; returns how many. Errors are logged, not raised."""
        if not self.enabled or not events:
            return 0
        try:
            if len(events) == 1:
                self._xadd(self.client, events[0])
            else:
                pipe = self.client.pipeline(transaction=False)
                for event in events:
                    self._xadd(pipe, event)
                pipe.execute()
        except Exception:
            logger.exception("celery-dlq: could not archive %d %s event(s) in %s; carrying on",
                             len(events), events[0].type, self.key)
            return 0
        return len(events)

    def _xadd(self, client: Any, event: Event) -> Any:
        return client.xadd(self.key, event.to_fields(), maxlen=self.max_length, approximate=True)

    def read(self, after: str | None = None, count: int = 10_000, until: str = "+") -> list[tuple[str, dict]]:
        """Up to ``count`` raw entries after stream id ``after`` (exclusive) up to ``until``, oldest first."""
        low = "-" if after is None else next_id(after)
        return [(_text(entry_id), fields_) for entry_id, fields_ in
                self.client.xrange(self.key, min=low, max=until, count=count)]

    def events(self, after: str | None = None, batch: int = 10_000) -> Iterator[tuple[str, Event]]:
        """Every event after ``after``, oldest first, read ``batch`` per round trip."""
        while True:
            rows = self.read(after, batch)
            for entry_id, fields_ in rows:
                yield entry_id, Event.from_fields(fields_)
            if len(rows) < batch:
                return
            after = rows[-1][0]


def parse_id(entry_id: str) -> tuple[int, int]:
    """A stream id ``"<ms>-<seq>"`` as a pair of integers, for ordering."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def next_id(entry_id: str) -> str:
    """The smallest stream id after ``entry_id`` (an exclusive XRANGE start on any Redis)."""
    ms, seq = parse_id(entry_id)
    return f"{ms}-{seq + 1}"


# -- hooks: one line each in the engine and the operator tools ------------------

def log_of(source: Any) -> EventLog:
    """The event log of ``source``: anything with ``client``, ``keys`` and ``settings`` or ``app``."""
    client = source.client
    settings = getattr(source, "settings", None)
    if settings is None:
        from celery_dlq.extension import get_dlq

        settings = get_dlq(source.app).settings
    return EventLog(client, source.keys, settings.events_max_length)


def _isolated(hook: Callable[..., list[Event]]) -> Callable[..., int]:
    """Run ``hook`` to build events, then append them; never raise (log and carry on)."""

    @functools.wraps(hook)
    def run(source: Any, *args: Any, **kwargs: Any) -> int:
        try:
            log = log_of(source)
            if not log.enabled:
                return 0
            return log.append(hook(source, *args, **kwargs))
        except Exception:
            logger.exception("celery-dlq: could not archive a %s event; carrying on", hook.__name__)
            return 0

    return run


def parked_fields(source: Any, copy: Envelope, *, failure: Mapping[str, str], delivery: int,
                  due: float, now: float) -> tuple[dict[str, str] | None, int]:
    """The ``parked`` event's stream fields and the archive's cap, for the park script to append.

    Delivery ``delivery`` failed; ``copy`` (the parked message) comes back at
    ``due``. The park script appends the event in the same round trip as the
    park. ``(None, 0)`` when the archive is off or the event cannot be built
    (logged: the archive never stops a park).
    """
    try:
        log = log_of(source)
        if not log.enabled:
            return None, 0
        event = event_of(EventType.PARKED, copy, ts=now, delivery=delivery, failure=failure, due=due)
        return event.to_fields(), log.max_length
    except Exception:
        logger.exception("celery-dlq: could not build a parked event; carrying on")
        return None, 0


@_isolated
def redelivered(source: Any, envelopes: Iterable[Envelope], now: float | None = None) -> list[Event]:
    """The mover published these messages (the parked copies, decoded) back to their queues."""
    now = time.time() if now is None else now
    return [event_of(EventType.REDELIVERED, envelope, ts=now) for envelope in envelopes]


@_isolated
def dead_lettered(source: Any, letter: Envelope, dlq: str) -> list[Event]:
    """``letter`` (with its dead-letter headers) was published to ``dlq``."""
    return [event_of(EventType.DEAD_LETTERED, letter, ts=letter.headers.get(H.DEAD_LETTERED_AT),
                     dlq=dlq, with_record=True)]


@_isolated
def dropped(source: Any, envelope: Envelope, *, reason: str, failure: Mapping[str, str],
            delivery: int, now: float | None = None) -> list[Event]:
    """The last delivery failed and the policy says ``dead_letter=False``: the message is gone."""
    return [event_of(EventType.DROPPED, envelope, ts=now, delivery=delivery, reason=reason,
                     failure=failure, with_record=True)]


@_isolated
def replayed(source: Any, letters: Iterable[Any], *, dlq: str, now: float | None = None) -> list[Event]:
    """Operator tools moved ``letters`` (Envelopes, ``manage.DeadLetter``s or raw DLQ elements) out of ``dlq``."""
    return [event_of(EventType.REPLAYED, _as_envelope(letter), ts=now, dlq=dlq) for letter in letters]


@_isolated
def trimmed(source: Any, letters: Iterable[Any], *, dlq: str, why: str, now: float | None = None) -> list[Event]:
    """Retention deleted ``letters`` from ``dlq``; ``why`` (``max_length``, ``ttl``) is the event's reason."""
    return [event_of(EventType.TRIMMED, _as_envelope(letter), ts=now, dlq=dlq, reason=why) for letter in letters]


@_isolated
def purged(source: Any, letters: Iterable[Any], *, dlq: str, now: float | None = None) -> list[Event]:
    """An operator deleted ``letters`` from ``dlq`` for good (the archive keeps their records)."""
    return [event_of(EventType.PURGED, _as_envelope(letter), ts=now, dlq=dlq) for letter in letters]
