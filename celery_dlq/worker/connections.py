"""One process's Redis half of the runtime: the app's Redis side, and what only a worker builds on it.

The Redis side (the store's client, the store over its shards, the broker
link, the chord ledger) comes from :func:`~celery_dlq.storage.factory.redis_side`,
the operator's builder too; a worker adds its delivery counters, its
dead-letterer and its chord members. Building :class:`Connections` makes
clients but sends no command (redis-py
connects on first use). A prefork child must never share a socket with
its parent, so :class:`PerProcess` builds one :class:`Connections` per
process, on first use in it.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from celery_dlq.message import Envelope
from celery_dlq.settings import DLQSettings
from celery_dlq.storage.archive import EventLog
from celery_dlq.storage.counters import DeliveryCounters
from celery_dlq.storage.factory import redis_side
from celery_dlq.storage.scripts import Scripts
from celery_dlq.storage.shards import Shard
from celery_dlq.storage.store import ParkedStore
from celery_dlq.worker.deadletter.dead_letterer import DeadLetterer
from celery_dlq.worker.features.chords import ChordMembers
from celery_dlq.worker.run.events import TaskEvents

T = TypeVar("T")


class Connections:
    """The store's client and everything built on it, for one process."""

    def __init__(self, app: Any, settings: DLQSettings, events: TaskEvents) -> None:
        self.app, self.settings = app, settings
        #: The store's client, the store, the broker link, the chord ledger: built as the operator's are
        #: (``storage/factory.py``), with a worker's client that registers the store's shard layout.
        self.side = redis_side(app, settings, worker=True)
        self.client = self.side.client
        self.shards = self.side.sharded.shards
        #: The home key set (the only one unless ``dlq_store_shards`` > 1): fetch sets, quarantines.
        self.keys = self.shards.home
        #: Every shard of the store (one unless ``dlq_store_shards`` > 1): the mover serves them all.
        self.sharded = self.side.sharded
        self.counters = DeliveryCounters(self.client, self.shards, Scripts(self.client), settings.delivery_count_ttl)
        self.deadletterer = DeadLetterer(app, self.client, self.sharded, audit_ttl=settings.audit_ttl,
                                         redis_url=settings.redis_url, events=events, link=self.side.link)
        #: Dead-lettered chord members: their rule, their replay (docs/workflows.md).
        self.chords = ChordMembers(app, self.client, self.keys)

    def shard(self, task_id: str | None) -> Shard:
        """The shard holding ``task_id``'s parked entries and archive events."""
        return self.sharded.of(task_id)

    @property
    def store(self) -> ParkedStore:
        """The home shard's store: the whole store unless ``dlq_store_shards`` > 1."""
        return self.sharded.home.store

    @property
    def archive(self) -> EventLog:
        """The home shard's archive stream: the whole archive unless ``dlq_store_shards`` > 1."""
        return self.side.archive

    @property
    def broker(self) -> Any:
        """The broker's Redis (the store's client when they are one server); only on a Redis broker."""
        return self.side.broker

    def dead_letter(self, envelope: Envelope, **kwargs: Any) -> str | None:
        """Dead-letter ``envelope`` (:meth:`DeadLetterer.dead_letter`); returns its DLQ, None when dropped."""
        return self.deadletterer.dead_letter(envelope, **kwargs)


class PerProcess(Generic[T]):
    """``make()``'s result for the calling process: made on the first call in each process, then kept."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._made: tuple[int, T] | None = None   # (pid, value)

    def __call__(self) -> T:
        made = self._made
        if made is None or made[0] != os.getpid():
            with self._lock:
                made = self._made
                if made is None or made[0] != os.getpid():
                    made = self._made = (os.getpid(), self._make())
        return made[1]
