"""The archive's events: **the event schema, defined here once** (:data:`SCHEMA`), and building events.

The stream fields of :class:`Event`, the Parquet columns export writes and
the Spark DDL the report reads are all derived from :data:`SCHEMA`. A dead
letter's event carries the whole dead-letter record (:meth:`Envelope.dumps`:
headers, body base64), so the archive outlives a purge, a replay or a trim
of the DLQ. :func:`event_of` builds the event of any message;
:func:`letter_entry` the entry of a letter read from a DLQ, directly (a
replay writes one per letter). :mod:`celery_dlq.storage.archive` appends them
to the stream and reads them back.

The payload hash of each event is :func:`celery_dlq.message.payload_hash`.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from celery_dlq import headers as H
from celery_dlq.message import Envelope, RawMessage, decode_raw, payload_hash
from celery_dlq.message import as_text as _text

SCHEMA_VERSION = 1
#: ``Envelope.extra`` key: a parked copy carries its payload hash, so the mover's events need not hash again.
PAYLOAD_HASH = "payload_hash"


class EventType:
    """What happened to a message (the ``type`` of an event)."""

    PARKED = "parked"                # a failed delivery; the message waits in the parked store
    REDELIVERED = "redelivered"      # the mover published the parked copy back to its queue
    DEAD_LETTERED = "dead_lettered"  # published to its DLQ (carries the full record)
    DROPPED = "dropped"              # last delivery failed with dead_letter=False (carries the record)
    REPLAYED = "replayed"            # an operator moved it from its DLQ back to a queue
    TRIMMED = "trimmed"              # retention deleted it from its DLQ (reason: why)
    PURGED = "purged"                # an operator deleted it from its DLQ
    OPERATOR_ACTION = "operator_action"  # an operator's replay, purge, edit, pause, ... (the audit record)
    BREAKER = "breaker"              # a circuit breaker changed state (reason: the new state; record: group, who)

    ALL = (PARKED, REDELIVERED, DEAD_LETTERED, DROPPED, REPLAYED, TRIMMED, PURGED, OPERATOR_ACTION, BREAKER)


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
        """The texts of the stream entry, one per :data:`ENTRY_NAMES` ("" for none), as ``EventLog.append`` sends."""
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
    raise RuntimeError("celery_dlq.storage.events: Event's fields and SCHEMA disagree")


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
    """An Envelope of a dead letter: an Envelope, kombu's raw list element, or anything with ``raw``
    (``ops.DeadLetter``).

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
    message = decode_raw(bytes(raw) if isinstance(raw, bytearray) else raw)
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
    :class:`Envelope` and :class:`Event` led its profile (BENCHMARKS.md section 11). One text per
    :data:`ENTRY_NAMES`, in order (tests/unit/test_events.py holds it to :func:`event_of`'s)."""
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


def letter_entries(kind: str, letters: Iterable[Any], *, dlq: str, now: float | None,
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


def action_event(record: Mapping[str, Any], text: str) -> Event:
    """The ``operator_action`` event of an audit record (``storage/audit.py``): ``reason`` is the action,
    ``worker`` who took it, ``exception_message`` why, ``record`` the whole record (``text``, its JSON);
    ``queue`` (the export's partition) the queue it names, else its DLQ."""
    return Event(type=EventType.OPERATOR_ACTION, ts_us=to_us(record.get("at")) or to_us(time.time()) or 0,
                 task_id=str(record.get("task_id") or ""), dlq=str(record.get("dlq") or ""),
                 queue=str(record.get("queue") or record.get("dlq") or ""),
                 reason=str(record.get("action") or ""), exception_message=H.truncate(str(record.get("why") or ""),
                                                                                      H.MAX_SUMMARY),
                 worker=str(record.get("who") or ""), record=text)


def breaker_event(state: str, queue: str, task: str, *, group: str, ts: float, task_id: str = "",
                  exception_type: str = "", message: str = "", paused_by: str = "") -> Event:
    """A circuit breaker of ``task``'s failure ``group`` on ``queue`` is now ``state`` (``reason``); ``task_id``
    is its probe's, ``record`` names the group and who paused it."""
    record = json.dumps({"group": group, "paused_by": paused_by}, sort_keys=True)
    return Event(type=EventType.BREAKER, ts_us=to_us(ts) or 0, task_id=task_id, task_name=task, queue=queue,
                 reason=state, exception_type=exception_type, exception_message=message[:1024], record=record)
