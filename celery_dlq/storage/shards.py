"""The parked store and archive split over shards (``dlq_store_shards``), and read as one.

Each shard is a key set with its own hash tag (:class:`~celery_dlq.storage.sharding.Shards`),
so on a Redis Cluster the shards spread over the masters while every Lua
script still touches one slot. A task's entries, delivery counters, audit
markers and archive events live in the shard its id picks; the home set
(``{<prefix>}``) keeps what belongs to no task, and whatever was parked there
before sharding was turned on.

:class:`ShardedStore` gives the readers (operator tools, exporter, web) the
read and manage half of :class:`~celery_dlq.storage.store.ParkedStore` over
every shard at once; the worker writes to ``of(task_id)`` and its mover
serves :attr:`ShardedStore.all`. With one shard it is the plain store.
"""
from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from celery_dlq.message import as_text as _text
from celery_dlq.settings import DLQSettings
from celery_dlq.storage import totals
from celery_dlq.storage.archive import EventLog
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.replication import Replication
from celery_dlq.storage.scripts import Scripts
from celery_dlq.storage.sharding import Shards
from celery_dlq.storage.store import Entry, ParkedStore

#: How often a long-running reader or mover looks for the shards of another shard count (seconds).
LAYOUT_EVERY = 60.0


def shards_of(settings: DLQSettings) -> Shards:
    """The store's key sets of these settings
    (``dlq_key_prefix``, kombu's ``global_keyprefix``, ``dlq_store_shards``)."""
    return Shards(settings.key_prefix, settings.global_keyprefix, settings.store_shards)


@dataclass(frozen=True)
class Shard:
    """One shard: its keys, its part of the parked store, its archive stream."""

    keys: Keys
    store: ParkedStore
    archive: EventLog

    def raise_counts(self, stats: Sequence[str], metric: str, labels: Mapping[str, Any], series: Sequence[str] = (),
                     pipe: Any = None) -> None:
        """Raise each of ``stats`` (fields of the ``stats`` hash), ``metric`` with ``labels`` and the trends'
        ``series`` by one, in one round trip with what the caller queued on ``pipe`` (a pipeline on this
        shard's client)."""
        pipe = self.store.client.pipeline(transaction=False) if pipe is None else pipe
        for stat in stats:
            pipe.hincrby(self.keys.stats, stat, 1)
        totals.incr(pipe, self.keys, metric, **labels)
        if series:
            self.store.trend(pipe, list(series))
        pipe.execute()


class ShardedStore:
    """Every shard of the store on one client, and the store's read API over all of them.

    The shards of an earlier ``dlq_store_shards`` (recorded in the home
    set's ``layout`` SET by every worker, ``register=True``) are read and
    served too, until they are empty: changing the shard count strands
    nothing. That set is read on first use and every :data:`LAYOUT_EVERY`
    seconds after, never at construction, so building a store costs no
    round trip and an exporter starts while Redis is down.
    """

    def __init__(self, client: Any, shards: Shards, *, events_max_length: int = 0,
                 clock: Callable[[], float] = time.time, replication: Replication | None = None,
                 register: bool = False) -> None:
        self.client, self.shards, self.register = client, shards, register
        self._make = lambda keys: Shard(keys, ParkedStore(client, keys, clock=clock, replication=replication),
                                        EventLog(client, keys, events_max_length))
        self._made: dict[str, Shard] = {}
        self._by_index = tuple(self._shard(keys) for keys in shards.shards)
        self.home = self._shard(shards.home)
        self._all: tuple[Shard, ...] | None = None
        self._layout_at = 0.0

    def _shard(self, keys: Keys) -> Shard:
        if keys.base not in self._made:
            self._made[keys.base] = self._make(keys)
        return self._made[keys.base]

    @property
    def all(self) -> tuple[Shard, ...]:
        """Every shard readers read and movers serve: the home set first, then the shards, then an earlier
        shard count's (read from Redis on first use, again every :data:`LAYOUT_EVERY` s)."""
        if self._all is None or time.monotonic() - self._layout_at >= LAYOUT_EVERY:
            layout = self.shards.home.layout
            if self.register and self.shards.tags and self._all is None:
                self.client.sadd(layout, *self.shards.tags)
            earlier = sorted(_text(tag) for tag in self.client.smembers(layout))
            self._all = tuple(self._shard(keys) for keys in self.shards.with_earlier(earlier).all)
            self._layout_at = time.monotonic()
        return self._all

    def __len__(self) -> int:
        return len(self._by_index)

    def of(self, task_id: str | None) -> Shard:
        """The shard of ``task_id``'s entries, counters and events."""
        return self._by_index[self.shards.index(task_id)]

    # -- the read and manage API of ParkedStore, over every shard -----------------

    def entries(self, queue: str | None = None, batch: int = 500) -> Iterator[Entry]:
        """Parked and leased entries of every shard, earliest first (``ParkedStore.entries``)."""
        if len(self.all) == 1:
            return self.home.store.entries(queue, batch)
        return heapq.merge(*(shard.store.entries(queue, batch) for shard in self.all),
                           key=lambda entry: entry.next_time)

    def get(self, entry_id: str) -> Entry | None:
        for shard in self._looking_for(entry_id):
            entry = shard.store.get(entry_id)
            if entry is not None:
                return entry
        return None

    def remove(self, entry_id: str) -> bool:
        return any(shard.store.remove(entry_id) for shard in self._looking_for(entry_id))

    def redeliver_now(self, entry_id: str | None = None, now: float | None = None) -> int:
        if entry_id is not None:
            return next((1 for shard in self._looking_for(entry_id) if shard.store.redeliver_now(entry_id, now)), 0)
        return sum(shard.store.redeliver_now(None, now) for shard in self.all)

    def reschedule(self, dues: Mapping[str, float]) -> int:
        """Bring parked entries forward to their due time (unix seconds) in ``dues``: one pipeline per shard.

        Returns how many are parked (``redeliver_one.lua``: unknown or leased entries are left alone)."""
        by_shard: dict[int, dict[str, float]] = {}
        shards: dict[int, Shard] = {}
        for entry_id, due in dues.items():
            shard = self._looking_for(entry_id)[0]
            shards[id(shard)] = shard
            by_shard.setdefault(id(shard), {})[entry_id] = due
        script = Scripts(self.client).get("redeliver_one")
        parked = 0
        for k, part in by_shard.items():
            keys = shards[k].keys
            pipe = self.client.pipeline(transaction=False)
            for entry_id, due in part.items():   # an entry due sooner keeps its time; a leased one is left
                script(keys=[keys.delayed, keys.due_wake], args=[entry_id, int(due * 1000)], client=pipe)
            parked += sum(int(n) for n in pipe.execute())
        return parked

    def count(self) -> int:
        return sum(shard.store.count() for shard in self.all)

    def counts_by_queue(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for shard in self.all:
            total.update(shard.store.counts_by_queue())
        return dict(total)

    def due_counts(self, edges_ms: list[int]) -> list[int]:
        """Entries waiting (not leased) with a due time in each ``[edges[i], edges[i+1])`` (ms), every shard
        added up: one ``ZCOUNT`` per shard and bucket, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        shards = self.all
        for shard in shards:
            for low, high in zip(edges_ms, edges_ms[1:]):
                pipe.zcount(shard.keys.delayed, low, f"({high}")
        replies = pipe.execute()
        width = len(edges_ms) - 1
        return [sum(replies[n * width + i] for n in range(len(shards))) for i in range(width)]

    def overdue(self, cutoff_ms: int, sample: int) -> tuple[int, Counter[str]]:
        """Entries parked or leased with a time before ``cutoff_ms``: the exact total, and the queues of at most
        ``sample`` of them per shard (waiting ones first, longest overdue first). Each shard in one transaction
        (one slot), so its count and sample are of one instant."""
        total, by_queue = 0, Counter[str]()
        for shard in self.all:
            k, cutoff = shard.keys, f"({cutoff_ms}"
            pipe = self.client.pipeline(transaction=True)
            for key in (k.delayed, k.leases):
                pipe.zcount(key, "-inf", cutoff)
            for key in (k.delayed, k.leases):
                pipe.zrangebyscore(key, "-inf", cutoff, start=0, num=sample)
            waiting, leased, due_ids, leased_ids = pipe.execute()
            total += int(waiting) + int(leased)
            ids = (due_ids + leased_ids)[:sample]
            queues = self.client.hmget(k.queues, ids) if ids else []
            by_queue.update(_text(queue) for queue in queues if queue is not None)
        return total, by_queue

    def next_due(self, claims_recheck: float | None = None, announce: float | None = None) -> float | None:
        """The earliest over every shard; ``announce`` only with one shard (the worker blocks on its marker)."""
        if len(self.all) == 1:
            return self.all[0].store.next_due(claims_recheck, announce)
        due = [d for d in (shard.store.next_due(claims_recheck) for shard in self.all) if d is not None]
        return min(due) if due else None

    def stats(self) -> dict[str, int]:
        """The ``stats`` counters summed over every shard."""
        return sum_hashes(self.client, [shard.keys.stats for shard in self.all])

    def _looking_for(self, entry_id: str) -> list[Shard]:
        """The shards to look in for ``entry_id`` (``<task id>:<delivery>[:<tag>]``), likeliest first.

        A task id may itself hold colons, so every split is a candidate; the
        remaining shards follow (the home set keeps entries parked before
        sharding), so nothing parked is out of reach.
        """
        if len(self.all) == 1:
            return [self.home]
        first: list[Shard] = []
        parts = entry_id.split(":")
        for cut in range(len(parts) - 1, 0, -1):
            shard = self.of(":".join(parts[:cut]))
            if shard not in first:
                first.append(shard)
        return first + [shard for shard in self.all if shard not in first]


def sum_hashes(client: Any, keys: list[str]) -> dict[str, int]:
    """Field -> integer summed over the hashes ``keys`` (one pipeline; each key its own slot is fine)."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hgetall(key)
    total: Counter[str] = Counter()
    for row in pipe.execute():
        for field, value in (row or {}).items():
            name = field.decode() if isinstance(field, bytes) else str(field)
            total[name] += int(value)
    return dict(total)
