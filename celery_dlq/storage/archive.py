"""The dead-letter archive: one event per park, redelivery, dead letter, drop, replay, trim or purge.

Events go to a capped Redis Stream, ``{<prefix>}:events`` (``Keys.events``),
with ``XADD ... MAXLEN ~ dlq_events_max_length`` (0 turns the archive off).
``celery dlq export`` copies the stream to Parquet (:mod:`celery_dlq.analytics.export`),
and the Spark report (:mod:`celery_dlq.analytics`) reads that. The event
schema and the building of events are :mod:`celery_dlq.storage.events`
(its names are re-exported here, where the archive's readers import them).

Appending never breaks the engine: each hook builds its events and sends
them in one command (one ``XADD``, or one ``append_events.lua`` for a batch), and
any error is logged and swallowed. The engine's own write (the parked copy,
the dead letter) has already succeeded when a hook runs.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from celery_dlq import headers as H
from celery_dlq.message import Envelope
from celery_dlq.message import as_text as _text
from celery_dlq.storage.events import (
    DATE_PARTITION,
    ENTRY_NAMES,
    ID_COLUMN,
    PAYLOAD_HASH,
    SCHEMA,
    SCHEMA_VERSION,
    Event,
    EventType,
    Field,
    event_of,
    fields_of,
    letter_entries,
    to_us,
)
from celery_dlq.storage.scripts import Scripts

__all__ = ["DATE_PARTITION", "ENTRY_NAMES", "ID_COLUMN", "PAYLOAD_HASH", "SCHEMA", "SCHEMA_VERSION", "Event",
           "EventLog", "EventType", "Field", "event_of", "next_id", "parse_id", "to_us"]

logger = logging.getLogger(__name__)


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
        return self._hook(EventType.REPLAYED, lambda: letter_entries(EventType.REPLAYED, letters, dlq=dlq, now=now))

    def replayed_entries(self, letters: Iterable[Any], *, dlq: str, now: float) -> list[list[str]] | None:
        """The ``replayed`` entries of ``letters``, built before they move (a replay builds a batch's while Redis
        moves the one before), for :meth:`EventLog.append_entries`; None when off or on an error (logged)."""
        if not self.enabled:  # type: ignore[attr-defined]
            return None
        try:
            return letter_entries(EventType.REPLAYED, letters, dlq=dlq, now=now)
        except Exception:
            logger.exception("celery-dlq: could not build replayed events; carrying on")
            return None

    def trimmed(self, letters: Iterable[Any], *, dlq: str, why: str, now: float | None = None) -> int:
        """Retention deleted ``letters`` from ``dlq``; ``why`` (``max_length``, ``ttl``) is the event's reason."""
        return self._hook(EventType.TRIMMED,
                          lambda: letter_entries(EventType.TRIMMED, letters, dlq=dlq, now=now, reason=why))

    def purged(self, letters: Iterable[Any], *, dlq: str, now: float | None = None) -> int:
        """An operator deleted ``letters`` from ``dlq`` for good (the archive keeps their records)."""
        return self._hook(EventType.PURGED, lambda: letter_entries(EventType.PURGED, letters, dlq=dlq, now=now))


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

    def info(self) -> dict | None:
        """The stream's ``XINFO STREAM`` (one command, atomic), or None when there is no stream."""
        try:
            return self.client.xinfo_stream(self.key)
        except Exception as exc:  # no such key
            if "no such key" in str(exc).lower():
                return None
            raise

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



