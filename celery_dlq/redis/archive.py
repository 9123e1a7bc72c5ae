"""The dead-letter archive: one event per park, redelivery, dead letter, drop, replay, trim or purge.

Events go to a capped Redis Stream, ``{<prefix>}:events`` (``Keys.events``),
with ``XADD ... MAXLEN ~ dlq_events_max_length`` (0 turns the archive off).
``celery dlq export`` copies the stream to Parquet (:mod:`celery_dlq.analytics.export`),
and the Spark report (:mod:`celery_dlq.analytics`) reads that.

**The event schema is defined here once** (:data:`SCHEMA`): the stream
fields of :class:`Event`, the Parquet columns export writes and the Spark
DDL the report reads are all derived from it. A dead letter's
event carries the whole dead-letter record (:meth:`Envelope.dumps`: headers,
body base64), so the archive outlives a purge, a replay or a trim of the DLQ.

Appending never breaks the engine: each hook builds its events and sends
them in one command (one ``XADD``, or one pipeline for a mover's batch), and
any error is logged and swallowed. The engine's own write (the parked copy,
the dead letter) has already succeeded when a hook runs.

The payload hash of each event is :func:`celery_dlq.message.payload_hash`.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, fields
from typing import Any, Iterable, Iterator, Mapping, Sequence

from celery_dlq import headers as H
from celery_dlq.message import Envelope, RawMessage, as_text as _text, decode_raw, payload_hash
from celery_dlq.redis.scripts import Scripts

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
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
class Field:
    """One field of an event: its name in the stream (and on :class:`Event`), its exported column, its kind.

    Kinds: ``string``, ``int`` (32 bits), ``bigint`` (64 bits), ``timestamp``
    (integer microseconds since the epoch in the stream; a UTC timestamp as a
    column). ``partition`` fields are directories of the export, not columns
    of its files.
    """

    name: str
    column: str
    kind: str
    partition: bool = False


#: THE event schema, in :class:`Event`'s field order. Export's Arrow schema and the report's Spark DDL derive from it.
SCHEMA: tuple[Field, ...] = (
    Field("type", "event_type", "string"),
    Field("ts_us", "ts", "timestamp"),
    Field("task_id", "task_id", "string"),
    Field("task_name", "task_name", "string"),
    Field("queue", "queue", "string", partition=True),   # the original queue
    Field("dlq", "dlq", "string"),
    Field("delivery", "delivery", "int"),
    Field("reason", "reason", "string"),
    Field("exception_type", "exception_type", "string"),
    Field("exception_message", "exception_message", "string"),
    Field("first_failure_us", "first_failure_at", "timestamp"),
    Field("due_us", "due_at", "timestamp"),
    Field("payload_size", "payload_size", "bigint"),
    Field("payload_hash", "payload_hash", "string"),
    Field("worker", "worker", "string"),
    Field("record", "record", "string"),                # the dead-letter record, JSON (Envelope.dumps)
)
#: The exported event's id column: the stream id, ``<ms>-<seq>`` (unique and ordered).
ID_COLUMN = "event_id"
#: The export's date partition: the event's UTC date, ``YYYY-MM-DD``.
DATE_PARTITION = "dt"


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
        return fields_of(self.entry())

    def entry(self) -> list[str]:
        """The texts of the stream entry, one per :data:`ENTRY_NAMES` ("" for none), as :meth:`EventLog.append` sends them."""
        # not dataclasses.asdict: its deep copy was most of the mover's archiving time
        return entry_of([getattr(self, name) for name in _FIELD_NAMES])

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
_INT_FIELDS = frozenset(f.name for f in SCHEMA if f.kind != "string")
if _FIELD_NAMES != tuple(f.name for f in SCHEMA):  # pragma: no cover - a schema edit must change both
    raise RuntimeError("celery_dlq.redis.archive: Event's fields and SCHEMA disagree")


#: The names of a stream entry's fields, in order: the schema version, then :data:`SCHEMA`'s.
ENTRY_NAMES = ("v", *_FIELD_NAMES)
_VERSION = str(SCHEMA_VERSION)


def entry_of(values: Sequence[Any]) -> list[str]:
    """An event's values (in :data:`SCHEMA` order) as its entry's texts, after the version; "" for none."""
    return [_VERSION, *("" if value is None else str(value) for value in values)]


def fields_of(entry: Sequence[str]) -> dict[str, str]:
    """The stream fields of an entry (:meth:`Event.entry`): its non-empty texts, named."""
    return {name: text for name, text in zip(ENTRY_NAMES, entry) if text}


def _int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def to_us(seconds: Any) -> int | None:
    """Unix seconds (a number or numeric text) to integer microseconds; None if not a time."""
    if isinstance(seconds, bool) or seconds in (None, ""):
        return None
    try:
        return int(round(float(seconds) * 1_000_000))
    except (TypeError, ValueError, OverflowError):
        return None


# -- building events --------------------------------------------------------------

def _as_envelope(letter: Any) -> Envelope:
    """An Envelope of a dead letter: an Envelope, kombu's raw list element, or anything with ``raw`` (``ops.DeadLetter``).

    A letter in a DLQ carries the hash of its payload from when it was
    dead-lettered (``x-dlq-payload-hash``; its body has not changed since):
    it is used as it is rather than parsed again.
    """
    if isinstance(letter, Envelope):
        return letter
    decoded = getattr(letter, "decoded", None)   # an ops.DeadLetter: its JSON is decoded already
    if isinstance(decoded, RawMessage) and decoded.doc:
        return _hashed(decoded.as_envelope())
    raw = letter if isinstance(letter, (bytes, bytearray, str)) else getattr(letter, "raw", None)
    if raw is None:
        raise TypeError(f"not a dead letter: {type(letter).__name__}")
    message = decode_raw(raw)
    if not message.doc:
        raise ValueError("not a kombu message (not a JSON object)")
    return _hashed(message.as_envelope())


def _hashed(envelope: Envelope) -> Envelope:
    """``envelope`` (just built by ``as_envelope``: its ``extra`` is its own) with the hash its letter carries."""
    known = envelope.headers.get(H.PAYLOAD_HASH)
    if isinstance(known, str) and len(known) == 32:
        envelope.extra.setdefault(PAYLOAD_HASH, known)
    return envelope


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


def letter_entry(kind: str, message: RawMessage, ts_us: str, dlq: str, reason: str | None = None) -> list[str]:
    """The entry :func:`event_of` gives for a dead letter read from ``dlq`` (``message``, decoded; ``ts_us``
    as text), built straight from its headers: a replay writes one per letter, and the round trip through
    :class:`Envelope` and :class:`Event` was 40% of its CPU. One text per :data:`ENTRY_NAMES`, in order
    (tests/unit/test_events.py holds it to :func:`event_of`'s)."""
    headers = message.headers
    body = message.body
    task_name = headers.get("task")
    known = headers.get(H.PAYLOAD_HASH)
    first = to_us(headers.get(H.FIRST_FAILURE_AT))
    return [
        _VERSION, kind, ts_us, str(headers.get("id") or message.properties.get("correlation_id") or ""),
        str(task_name or ""), str(headers.get(H.ORIGINAL_QUEUE) or ""), dlq, str(H.delivery_count_of(headers)),
        str(reason if reason is not None else headers.get(H.REASON) or ""), str(headers.get(H.EXCEPTION_TYPE) or ""),
        H.truncate(headers.get(H.EXCEPTION_MESSAGE) or "", H.MAX_SUMMARY), "" if first is None else str(first),
        "", str(len(body)),
        known if isinstance(known, str) and len(known) == 32 else
        payload_hash(task_name, body, message.content_type, message.content_encoding),
        str(headers.get(H.WORKER) or ""), ""]


def _letter_entries(kind: str, letters: Iterable[Any], *, dlq: str, now: float | None,
                    reason: str | None = None) -> list[list[str]]:
    """The entries of ``kind`` about ``letters`` (as :func:`_as_envelope` takes them), all stamped ``now``."""
    now = time.time() if now is None else now
    ts_us = str(to_us(now) or 0)
    out = []
    for letter in letters:
        decoded = getattr(letter, "decoded", None)   # an ops.DeadLetter: read from a DLQ, its JSON decoded
        if isinstance(decoded, RawMessage) and decoded.doc:
            out.append(letter_entry(kind, decoded, ts_us, dlq, reason))
        else:
            out.append(event_of(kind, _as_envelope(letter), ts=now, dlq=dlq, reason=reason).entry())
    return out


# -- the stream -----------------------------------------------------------------

class _Hooks:
    """The archive's hooks, one call in the engine or the operator tools each: build events, append, never raise."""

    def _hook(self, kind: str, build: Any) -> int:
        """Build the events (Events, or their entries) and append them; 0 when off or on any error."""
        try:
            if not self.enabled:  # type: ignore[attr-defined]
                return 0
            built = build()
            entries = [event.entry() if isinstance(event, Event) else event for event in built]
            return self.append_entries(entries, kind)  # type: ignore[attr-defined]
        except Exception:
            logger.exception("celery-dlq: could not archive a %s event; carrying on", kind)
            return 0

    def parked_fields(self, copy: Envelope, *, failure: Mapping[str, str], delivery: int,
                      due: float, now: float) -> tuple[dict[str, str] | None, int]:
        """The ``parked`` event's stream fields and the archive's cap, for the park script to append.

        Delivery ``delivery`` failed; ``copy`` (the parked message) comes back
        at ``due``. ``(None, 0)`` when the archive is off or the event cannot
        be built (logged: the archive never stops a park).
        """
        if not self.enabled:  # type: ignore[attr-defined]
            return None, 0
        try:
            event = event_of(EventType.PARKED, copy, ts=now, delivery=delivery, failure=failure, due=due)
            return event.to_fields(), self.max_length  # type: ignore[attr-defined]
        except Exception:
            logger.exception("celery-dlq: could not build a parked event; carrying on")
            return None, 0

    def redelivered(self, envelopes: Iterable[Envelope], now: float | None = None) -> int:
        """The mover published these messages (the parked copies, decoded) back to their queues."""
        now = time.time() if now is None else now
        return self._hook(EventType.REDELIVERED,
                          lambda: [event_of(EventType.REDELIVERED, envelope, ts=now) for envelope in envelopes])

    def dead_lettered(self, letter: Envelope, dlq: str) -> int:
        """``letter`` (with its dead-letter headers) was published to ``dlq``."""
        return self._hook(EventType.DEAD_LETTERED, lambda: [event_of(
            EventType.DEAD_LETTERED, letter, ts=letter.headers.get(H.DEAD_LETTERED_AT), dlq=dlq, with_record=True)])

    def dropped(self, envelope: Envelope, *, reason: str, failure: Mapping[str, str], delivery: int,
                now: float | None = None) -> int:
        """The last delivery failed and the policy says ``dead_letter=False``: the message is gone."""
        return self._hook(EventType.DROPPED, lambda: [event_of(
            EventType.DROPPED, envelope, ts=now, delivery=delivery, reason=reason, failure=failure,
            with_record=True)])

    def replayed(self, letters: Iterable[Any], *, dlq: str, now: float | None = None) -> int:
        """Operator tools moved ``letters`` (Envelopes, ``ops.DeadLetter``s or raw DLQ elements) out of ``dlq``."""
        return self._hook(EventType.REPLAYED, lambda: _letter_entries(EventType.REPLAYED, letters, dlq=dlq, now=now))

    def trimmed(self, letters: Iterable[Any], *, dlq: str, why: str, now: float | None = None) -> int:
        """Retention deleted ``letters`` from ``dlq``; ``why`` (``max_length``, ``ttl``) is the event's reason."""
        return self._hook(EventType.TRIMMED,
                          lambda: _letter_entries(EventType.TRIMMED, letters, dlq=dlq, now=now, reason=why))

    def purged(self, letters: Iterable[Any], *, dlq: str, now: float | None = None) -> int:
        """An operator deleted ``letters`` from ``dlq`` for good (the archive keeps their records)."""
        return self._hook(EventType.PURGED, lambda: _letter_entries(EventType.PURGED, letters, dlq=dlq, now=now))


class EventLog(_Hooks):
    """The archive stream of one key prefix: append (never raising) and read."""

    def __init__(self, client: Any, keys: Any, max_length: int) -> None:
        self.client = client
        self.key = keys.events
        self.max_length = int(max_length)
        self._scripts: Scripts | None = None

    @property
    def enabled(self) -> bool:
        return self.max_length > 0

    def append(self, events: Sequence[Event]) -> int:
        """Append ``events`` in one round trip; returns how many. Errors are logged, not raised."""
        if not self.enabled or not events:
            return 0
        return self.append_entries([event.entry() for event in events], events[0].type)

    def append_entries(self, entries: Sequence[list[str]], kind: str = "") -> int:
        """Append stream entries (:meth:`Event.entry`) in one command; returns how many, 0 on an error (logged).

        One event is one ``XADD``; a batch is one ``append_events.lua`` with
        the entries as one JSON argument (a pipeline of one ``XADD`` each cost the
        client more than building the events did).
        """
        if not self.enabled or not entries:
            return 0
        try:
            if len(entries) == 1:
                self.client.xadd(self.key, fields_of(entries[0]), maxlen=self.max_length, approximate=True)
            else:
                if self._scripts is None:
                    self._scripts = Scripts(self.client)
                self._scripts.run("append_events", [self.key], [self.max_length, _NAMES_JSON, json.dumps(
                    entries, ensure_ascii=False, separators=(",", ":"))])
        except Exception:
            logger.exception("celery-dlq: could not archive %d %s event(s) in %s; carrying on",
                             len(entries), kind or "", self.key)
            return 0
        return len(entries)

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


_NAMES_JSON = json.dumps(ENTRY_NAMES)


def parse_id(entry_id: str) -> tuple[int, int]:
    """A stream id ``"<ms>-<seq>"`` as a pair of integers, for ordering."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def next_id(entry_id: str) -> str:
    """The smallest stream id after ``entry_id`` (an exclusive XRANGE start on any Redis)."""
    ms, seq = parse_id(entry_id)
    return f"{ms}-{seq + 1}"



