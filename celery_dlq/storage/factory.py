"""The one builder of an app's Redis side: the store's client, the store over its shards, the broker link, the
chord ledger and the DLQs' lists, for a worker and for the operator alike.

:func:`redis_side` reads the app's settings and builds each part that is not
given; it sends no command (redis-py connects on first use, the broker is
reached on first use of :attr:`RedisSide.broker`). A worker asks for its
own client (``worker=True``: health-checked, and WAIT for replicas when
``dlq_store_min_replicas`` asks) and registers the store's shard layout;
the operator gets a client that fails fast and registers nothing. What only
a worker needs (delivery counters, the dead-letterer) is built by the worker
(``worker/connections.py``) on top of this.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from celery_dlq.settings import DLQSettings
from celery_dlq.storage.archive import EventLog
from celery_dlq.storage.chords import ChordLedger
from celery_dlq.storage.client import BrokerLink, connect, worker_client
from celery_dlq.storage.dlq import DeadLetterLists
from celery_dlq.storage.keys import Keys, QueueLists
from celery_dlq.storage.replication import Replication
from celery_dlq.storage.scripts import Scripts
from celery_dlq.storage.shards import ShardedStore, shards_of


@dataclass(frozen=True)
class RedisSide:
    """One app's Redis as celery-dlq reaches it (see the module docstring); built by :func:`redis_side`."""

    app: Any
    #: The store's client (``dlq_redis_url``).
    client: Any
    #: Every shard of the store; its home shard's keys and archive are where a DLQ operation counts and archives.
    sharded: ShardedStore
    #: The broker's Redis, where DLQs are kombu lists, and the scripts on it (connected on first use).
    link: BrokerLink
    #: Dead-lettered chord members and the chords waiting for them (docs/workflows.md).
    chords: ChordLedger
    #: Where kombu keeps a queue on the broker (``broker_transport_options``).
    lists: QueueLists

    @property
    def keys(self) -> Keys:
        """The home key set: ``stats``, the exporter's counters, quarantines, the chord ledger."""
        return self.sharded.home.keys

    @property
    def archive(self) -> EventLog:
        """The home shard's archive stream."""
        return self.sharded.home.archive

    @property
    def broker(self) -> Any:
        """The broker's Redis; :class:`~celery_dlq.errors.BrokerNotSupported` on another broker."""
        return self.link.client

    @property
    def scripts(self) -> Scripts:
        """The scripts on the broker's Redis."""
        return self.link.scripts

    @cached_property
    def dlqs(self) -> DeadLetterLists:
        """The DLQs' lists on the broker (connects to the broker on first use)."""
        return DeadLetterLists(self.broker, self.scripts, self.lists)


def redis_side(app: Any, settings: DLQSettings | None = None, *, client: Any = None, broker: Any = None,
               sharded: ShardedStore | None = None, link: BrokerLink | None = None, worker: bool = False,
               clock: Callable[[], float] = time.time) -> RedisSide:
    """``app``'s Redis side, each part built here unless given (tests give clients; a worker's dead-letterer
    gives the store and the broker link it already holds). ``settings`` are read from ``app.conf`` when needed
    and not given."""
    if settings is None and (client is None or sharded is None or link is None):
        settings = DLQSettings.from_conf(app.conf)
    if client is None:
        assert settings is not None
        client = (worker_client if worker else connect)(settings.redis_url, settings.redis_cluster)
    if sharded is None:
        assert settings is not None
        replication = (Replication(client, settings.store_min_replicas, settings.store_replica_timeout)
                       if worker and settings.store_min_replicas else None)
        sharded = ShardedStore(client, shards_of(settings), events_max_length=settings.events_max_length,
                               clock=clock, replication=replication, register=worker)
    if link is None:
        assert settings is not None
        link = BrokerLink(app.conf, client, settings.redis_url, broker)
    return RedisSide(app, client, sharded, link, ChordLedger(client, sharded.home.keys),
                     QueueLists.of(app.conf.broker_transport_options))
