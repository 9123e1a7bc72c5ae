"""The Redis side of one app as the operator reaches it: clients, list keys, the store, scripts, counters.

:class:`Backend` is what every part of :mod:`celery_dlq.ops` works through
(a DLQ's :class:`~celery_dlq.ops.queue.DeadLetterQueue`, its failure groups,
a page of it); :class:`~celery_dlq.ops.operator.Operator` adds finding DLQs
on top. Keeping the two apart keeps the imports of ``ops/`` one way:
``operator`` -> ``queue``/``groups`` -> ``backend``, never back.

Building one reads settings and connects to Redis; it never installs worker
bootsteps, so a CLI process is not a worker.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kombu.serialization import prepare_accept_content

from celery_dlq.message import decode_raw
from celery_dlq.ops.parked import ParkedRetries
from celery_dlq.settings import DLQSettings
from celery_dlq.storage.chords import ChordLedger
from celery_dlq.storage.client import BrokerLink, connect
from celery_dlq.storage.keys import QueueLists
from celery_dlq.storage.scripts import Scripts
from celery_dlq.storage.shards import ShardedStore, shards_of

if TYPE_CHECKING:
    from celery_dlq.ops.letters import DeadLetter

#: The operator's name of a queue's raw quarantine (``celery dlq list quarantine:orders``).
QUARANTINE = "quarantine:"


def quarantined_queue(name: str | None) -> str | None:
    """The queue whose quarantine ``name`` is, or None when it is not a quarantine's name."""
    return name[len(QUARANTINE):] if name and name.startswith(QUARANTINE) and len(name) > len(QUARANTINE) else None


@dataclass(frozen=True)
class Size:
    """A DLQ's dead letters now, and when its oldest one was dead-lettered (None: empty, or undated)."""

    dead_letters: int
    oldest_at: float | None

    def age(self, now: float) -> float | None:
        """Seconds since the oldest dead letter was dead-lettered; None when there is none dated."""
        return None if self.oldest_at is None else max(0.0, now - self.oldest_at)


class Backend:
    """One app's Redis as the operator uses it.

    ``broker`` (the broker's Redis) and ``client`` (``dlq_redis_url``) may be
    given, as tests do; by default they are connected on first use, so the
    parked-retry half works even when the broker is not Redis.
    """

    def __init__(self, app: Any, *, broker: Any = None, client: Any = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.app, self.clock = app, clock
        self.settings = DLQSettings.from_conf(app.conf)
        self.lists = QueueLists.of(app.conf.broker_transport_options)
        self.client = client if client is not None else connect(self.settings.redis_url, self.settings.redis_cluster)
        #: Every shard of the store (``dlq_store_shards``); ``keys``/``archive`` are the home set's,
        #: where what the operator does (replays, purges) is counted and archived.
        self.sharded = ShardedStore(self.client, shards_of(self.settings),
                                  events_max_length=self.settings.events_max_length, clock=clock)
        self.keys = self.sharded.home.keys
        self.archive = self.sharded.home.archive
        self.parked = ParkedRetries(self.sharded)
        #: Dead-lettered chord members and the chords waiting for them (docs/workflows.md).
        self.chords = ChordLedger(self.client, self.keys)
        self.accept = frozenset(prepare_accept_content(app.conf.accept_content))
        self._broker = BrokerLink(app.conf, self.client, self.settings.redis_url, broker)

    @property
    def broker(self) -> Any:
        """The broker's Redis, where DLQs are lists; :class:`BrokerNotSupported` on another broker."""
        return self._broker.client

    @property
    def scripts(self) -> Scripts:
        return self._broker.scripts

    def list_keys(self, name: str) -> list[str]:
        """The Redis lists of ``name``: a DLQ's priority sub-lists, or a quarantine's one list."""
        queue = quarantined_queue(name)
        return [self.keys.quarantine(queue)] if queue is not None else self.lists.keys(name)

    def depth(self, name: str) -> int:
        """Dead letters in ``name``, every priority sub-list counted."""
        pipe = self.broker.pipeline(transaction=False)
        for key in self.list_keys(name):
            pipe.llen(key)
        return sum(pipe.execute())

    def sizes(self, names: Iterable[str]) -> dict[str, Size]:
        """Each DLQ's depth and oldest dead letter, in one pipeline: ``LLEN`` and ``LINDEX -1`` of each sub-list.

        What the dashboard's overview and the exporter show; never O(depth).
        """
        lists = {name: self.list_keys(name) for name in names}
        pipe = self.broker.pipeline(transaction=False)
        for keys in lists.values():
            for key in keys:
                pipe.llen(key)
                pipe.lindex(key, -1)   # kombu pushes on the left: the oldest is last
        replies = iter(pipe.execute())
        out = {}
        for name, keys in lists.items():
            count, oldest = 0, None
            for _ in keys:
                length, tail = next(replies), next(replies)
                count += int(length)
                at = decode_raw(tail).dead_lettered_at if tail is not None else None
                if at is not None and (oldest is None or at < oldest):
                    oldest = at
            out[name] = Size(count, oldest)
        return out

    def forget(self, letters: list[DeadLetter]) -> None:
        """Delete the delivery counters and dead-letter audit of messages about to be replayed.

        Otherwise the replayed copy would start at the old count, and failing
        again at the same delivery it would meet a ``done`` audit and be
        acknowledged as "already dead-lettered": lost. Idempotent, and done
        before the move, so an interruption in between loses nothing.
        """
        self.forget_keys(self.counter_keys(letters))

    def counter_keys(self, letters: list[DeadLetter]) -> list[list[str]]:
        """What :meth:`forget` deletes for ``letters``, one list per shard (no Redis: a replay builds it ahead)."""
        by_shard: dict[str, list[str]] = {}
        for letter in letters:
            task_id, tag = letter.task_id, letter.properties.get("delivery_tag")
            if task_id:
                keys = self.sharded.of(task_id).keys
                by_shard.setdefault(keys.base, []).extend((
                    keys.delivery_count(task_id), keys.delivery_count(f"{task_id}:{tag}"),
                    keys.audit(task_id, letter.delivery_count or 1)))
        return list(by_shard.values())

    def forget_keys(self, by_shard: list[list[str]]) -> None:
        """Delete :meth:`counter_keys`' keys in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for keys in by_shard:   # one DEL per shard: its keys share a hash tag, so one slot on a cluster
            for start in range(0, len(keys), 1000):
                pipe.delete(*keys[start:start + 1000])
        pipe.execute()

    def count(self, stat: str, n: int) -> None:
        if n:
            self.client.hincrby(self.keys.stats, stat, n)
