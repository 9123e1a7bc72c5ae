"""Retention: a DLQ's length and age limits, applied as dead letters arrive.

A queue's policy may set ``dead_letter_max_length`` (messages) and
``dead_letter_ttl`` (seconds since ``x-dlq-dead-lettered-at``); both default
to none, so nothing is ever deleted unless asked (Sidekiq keeps 10,000 dead
jobs for 180 days). Trimming runs right after each dead letter is published,
in the worker that published it, so there is no sweeper to run or forget.

Oldest first: the right end of the DLQ's lists (kombu pushes on the left),
merged across priority sub-lists by dead-lettered time. Each message goes by
its exact value (``LREM``, in ``lua/remove_letters.lua``, which also takes it
off its failure group's count), so a concurrent replay or purge of the same
message makes one of them find it gone, never both act on it. Every trimmed
message is logged and counted (``stats`` hash, ``dead_letters_trimmed``;
the exporter's ``trimmed_total{dlq}``).
"""
from __future__ import annotations

import heapq
import logging
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from celery_dlq.message import decode_raw
from celery_dlq.policy import RedeliveryPolicy
from celery_dlq.storage import groups, totals
from celery_dlq.storage.archive import EventLog
from celery_dlq.storage.chords import ChordLedger, fail_purged
from celery_dlq.storage.client import BrokerLink
from celery_dlq.storage.keys import Keys, QueueLists, Stat
from celery_dlq.storage.lists import oldest_pages
from celery_dlq.storage.scripts import Scripts

logger = logging.getLogger(__name__)

#: Tail messages read per sub-list and round trip.
PAGE = 200
#: At most this many messages are trimmed after one dead letter, so lowering a
#: limit on a huge DLQ does not stall the worker: the backlog goes over time.
MAX_PER_CALL = 1000


class Retention:
    """Trims DLQs per their policy; one per :class:`~celery_dlq.worker.deadletter.DeadLetterer`.

    ``client`` holds the ``stats`` hash (``dlq_redis_url``); the DLQ lists
    are on the broker, which is the same client unless they differ.
    """

    def __init__(self, app: Any, client: Any, keys: Keys, *, archive: EventLog, redis_url: str = "",
                 broker: Any = None, link: BrokerLink | None = None) -> None:
        self.app, self.client, self.keys = app, client, keys
        self.redis_url, self.archive = redis_url, archive
        self.lists = QueueLists.of(app.conf.broker_transport_options)
        self._broker = link if link is not None else BrokerLink(app.conf, client, redis_url, broker)
        self.chords = ChordLedger(client, keys)

    @property
    def broker(self) -> Any:
        return self._broker.client

    @property
    def scripts(self) -> Scripts:
        return self._broker.scripts

    def after_dead_letter(self, dlq: str, policy: RedeliveryPolicy) -> int:
        """Apply ``policy``'s limits to ``dlq``; never raises (the dead letter is safe already)."""
        if policy.dead_letter_max_length is None and policy.dead_letter_ttl is None:
            return 0
        try:
            return self.trim(dlq, max_length=policy.dead_letter_max_length, ttl=policy.dead_letter_ttl)
        except Exception:
            logger.exception("celery-dlq: could not trim %s (max length %s, ttl %s s)",
                             dlq, policy.dead_letter_max_length, policy.dead_letter_ttl)
            return 0

    def trim(self, dlq: str, *, max_length: int | None = None, ttl: float | None = None,
             now: float | None = None) -> int:
        """Delete the oldest dead letters of ``dlq`` beyond ``max_length`` or older than ``ttl``."""
        cutoff = None if ttl is None else (time.time() if now is None else now) - ttl
        keys = self.lists.keys(dlq)
        trimmed = 0
        while trimmed < MAX_PER_CALL:
            victims = self._victims(keys, max_length, cutoff, MAX_PER_CALL - trimmed)
            if not victims:
                break
            args: list = []
            for key, raw, _ in victims:
                args += [keys.index(key) + 2, raw, *groups.membership(decode_raw(raw).headers)]
            gone: dict[str, list[bytes]] = {}
            removed_flags = self.scripts.run("remove_letters", [self.lists.groups(dlq), *keys], args)
            for (_key, raw, why), removed in zip(victims, removed_flags):
                if removed:
                    trimmed += 1
                    self._log(dlq, raw, why)
                    gone.setdefault(why, []).append(raw)
            for why, raws in gone.items():  # the archive keeps what retention deletes
                self.archive.trimmed(raws, dlq=dlq, why=why)
                self._fail_chords(dlq, raws, why)
        if trimmed:
            pipe = self.client.pipeline(transaction=False)
            pipe.hincrby(self.keys.stats, Stat.TRIMMED, trimmed)
            totals.incr(pipe, self.keys, totals.Metric.TRIMMED, trimmed, dlq=dlq)
            pipe.execute()
        return trimmed

    def _victims(self, keys: list[str], max_length: int | None, cutoff: float | None,
                 most: int) -> list[tuple[str, bytes, str]]:
        """The oldest messages to trim now: ``(key, raw, why)``, from each sub-list's right end."""
        read = oldest_pages(self.broker, keys, PAGE)
        lengths = {key: length for key, (length, _) in read.items()}
        pages = {key: page for key, (_, page) in read.items()}
        excess = max(0, sum(lengths.values()) - max_length) if max_length is not None else 0
        taken: Counter = Counter()
        victims: list[tuple[str, bytes, str]] = []
        for at, key, raw in heapq.merge(*(_oldest_first(key, pages[key]) for key in keys)):
            if len(victims) >= most:
                break
            if len(victims) < excess:
                why = "max_length"
            elif cutoff is not None and at < cutoff:
                why = "ttl"
            else:
                break
            victims.append((key, raw, why))
            taken[key] += 1
            if taken[key] == len(pages[key]) < lengths[key]:
                break  # this sub-list's next message is not read yet: read again
        return victims

    def _fail_chords(self, dlq: str, raws: list[bytes], why: str) -> None:
        """A chord waiting for a trimmed letter fails now, as on a purge (redis/chords.py)."""
        members = [(str(headers["id"]), str(headers.get("task") or "")) for headers in
                   (decode_raw(raw).headers for raw in raws) if headers.get("group") and headers.get("id")]
        if members:
            fail_purged(self.chords, self.app, members, dlq=dlq, why=f"dropped by retention ({why})")

    def _log(self, dlq: str, raw: bytes, why: str) -> None:
        headers = decode_raw(raw).headers
        limit = "over its dead_letter_max_length" if why == "max_length" else "older than its dead_letter_ttl"
        logger.warning("celery-dlq: trimmed dead letter %s[%s] from %s: %s", headers.get("task"),
                       headers.get("id"), dlq, limit)


def _oldest_first(key: str, page: list[bytes]) -> Iterator[tuple[float, str, bytes]]:
    """A page (oldest first) keyed by ``x-dlq-dead-lettered-at``; a message without one sorts oldest (0)."""
    for raw in page:
        yield decode_raw(raw).dead_lettered_at or 0.0, key, raw
