"""Parked retries as an operator sees them: list, redeliver now, delete.

The parked store (:mod:`celery_dlq.storage.store`) holds each retry as an entry
(``<task id>:<next delivery>``) with its message; here an entry is shown
with what an operator asks first (which task, when due, what failed last)
and addressed by entry id or by task id, as Sidekiq's ``RetrySet`` is. It
lives in ``dlq_redis_url``, so it works whatever the broker is.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from celery_dlq import headers as H
from celery_dlq.errors import ForceRequired
from celery_dlq.message import Envelope, decode_raw
from celery_dlq.ops.audit import Actor, Audit
from celery_dlq.storage.shards import ShardedStore
from celery_dlq.storage.store import DirectPayload, to_ms


@dataclass(frozen=True)
class ParkedRetry:
    """A retry waiting in the parked store; ``delivery_count`` is the delivery it will be."""

    entry_id: str
    queue: str
    due: float | None
    lease_until: float | None
    task_id: str | None
    task_name: str | None
    delivery_count: int | None
    last_exception: str | None

    @classmethod
    def from_entry(cls, entry: Any) -> ParkedRetry:
        """From a store entry in either parked format (kombu's element, or the publish-format envelope)."""
        direct = DirectPayload.loads(entry.payload)
        try:
            message: Any = decode_raw(direct.element) if direct else Envelope.loads(entry.payload)
        except (ValueError, KeyError, TypeError):
            return cls(entry.entry_id, entry.queue, entry.due, entry.lease_until, None, None, None, None)
        return cls(entry.entry_id, entry.queue, entry.due, entry.lease_until, message.task_id,
                   message.task_name, H.delivery_count_of(message.headers),
                   message.headers.get(H.LAST_EXCEPTION))

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Overdue:
    """Overdue parked retries: the exact ``total``, and the queues of those sampled (``by_queue``)."""

    total: int
    by_queue: Counter[str] = field(default_factory=Counter)

    @property
    def unattributed(self) -> int:
        """Overdue retries past the sample, whose queue was not read."""
        return max(0, self.total - sum(self.by_queue.values()))


#: The due-time buckets of :meth:`ParkedRetries.due_histogram`.
DUE_BUCKETS = ("overdue", "< 1 min", "1-5 min", "5-15 min", "15-60 min", "1-6 h", "6-24 h", "> 24 h")


class ParkedRetries:
    """The parked store as an operator sees it (Sidekiq's ``RetrySet``), by entry or task id."""

    def __init__(self, sharded: ShardedStore) -> None:
        self.sharded = sharded

    def entries(self, queue: str | None = None, limit: int | None = None) -> Iterator[ParkedRetry]:
        for n, entry in enumerate(self.sharded.entries(queue)):
            if limit is not None and n >= limit:
                return
            yield ParkedRetry.from_entry(entry)

    def due_histogram(self, now: float) -> list[tuple[str, int]]:
        """How many parked retries come due when: overdue, within a minute, 5, 15 minutes, an hour, 6, 24 hours,
        later (the entries being delivered right now, leased, are not waiting and not counted)."""
        edges = [-float("inf"), 0, 60, 300, 900, 3600, 6 * 3600, 24 * 3600, float("inf")]
        ms = [int((now + e) * 1000) if abs(e) != float("inf") else (-2**62 if e < 0 else 2**62) for e in edges]
        return list(zip(DUE_BUCKETS, self.sharded.due_counts(ms)))

    def count(self) -> int:
        """Parked retries, waiting or being delivered, every shard."""
        return self.sharded.count()

    def counts_by_queue(self) -> dict[str, int]:
        """Queue -> its parked retries (one ``HGETALL`` per shard)."""
        return self.sharded.counts_by_queue()

    def overdue(self, now: float, older_than: float, sample: int) -> Overdue:
        """Parked retries (or leases) more than ``older_than`` seconds past due: no mover is moving them.

        ``total`` is exact; at most ``sample`` of them per shard are attributed
        to their queue (the store keeps no per-queue index by time).
        """
        total, by_queue = self.sharded.overdue(to_ms(now - older_than), sample)
        return Overdue(total, by_queue)

    def find(self, ident: str) -> list[str]:
        """Entry ids for an entry id, or for every entry of a task id."""
        if self.sharded.get(ident) is not None:
            return [ident]
        return [retry.entry_id for retry in self.entries() if retry.task_id == ident]

    def redeliver_now(self, ident: str | None = None, *, audit: Audit | None = None,
                      actor: Actor | None = None) -> int:
        """Make one entry (or a task's entries), or every parked entry, due now. With ``audit``, recorded first
        (the entries found, by ``actor``): a record that cannot be written refuses it, nothing moved."""
        if ident is None:
            self._record(audit, "redeliver", actor, None, [])
            return self.sharded.redeliver_now()
        found = self.find(ident)
        self._record(audit, "redeliver", actor, ident, found)
        return sum(self.sharded.redeliver_now(entry_id) for entry_id in found)

    def delete(self, ident: str, *, force: bool = False, audit: Audit | None = None,
               actor: Actor | None = None) -> int:
        """Delete a parked retry (or a task's) for good: its message is gone, so ``force=True`` is required. With
        ``audit``, recorded first (refused, nothing deleted, when the record cannot be written)."""
        if not force:
            raise ForceRequired(f"deleting parked retry {ident!r} loses the message: pass force=True")
        found = self.find(ident)
        self._record(audit, "delete", actor, ident, found)
        return sum(self.sharded.remove(entry_id) for entry_id in found)

    @staticmethod
    def _record(audit: Audit | None, action: str, actor: Actor | None, ident: str | None,
                entries: list[str]) -> None:
        if audit is not None and (entries or ident is None):
            audit.record(action, actor or Actor.of(), selection={"described": f"parked retry {ident}" if ident
                                                                 else "every parked retry", "all": ident is None},
                         entries=entries, counts={"matched": len(entries)} if ident else {})
