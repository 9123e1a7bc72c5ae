"""The one builder of an app's Redis side (storage/factory.py): what the worker and the operator each get."""
from __future__ import annotations

import fakeredis
from celery import Celery

import celery_dlq
from celery_dlq.ops import Operator
from celery_dlq.storage.factory import redis_side
from celery_dlq.storage.sharding import Shards
from celery_dlq.storage.shards import ShardedStore


def app_with(**conf) -> Celery:
    app = Celery("side", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.update(conf)
    return app


def test_a_workers_side_waits_for_replicas_and_registers_its_layout_an_operators_does_neither():
    app = app_with(dlq_store_min_replicas=1, dlq_store_replica_timeout=0.5, dlq_key_prefix="fx")
    worker, operator = redis_side(app, worker=True), redis_side(app)
    assert worker.sharded.register and not operator.sharded.register
    replication = worker.sharded.home.store.replication
    assert replication is not None and replication.min_replicas == 1 and replication.client is worker.client
    assert operator.sharded.home.store.replication is None
    assert worker.client.connection_pool.connection_kwargs.get("health_check_interval") == 30
    assert operator.client.connection_pool.connection_kwargs.get("socket_timeout") == 30
    for side in (worker, operator):   # the parts share the store's client and home key set
        assert side.keys.prefix == "fx" and side.chords.client is side.client and side.chords.keys is side.keys
        assert side.archive is side.sharded.home.archive


def test_the_worker_and_the_operator_take_their_side_from_the_factory_and_connect_nothing():
    app = app_with()
    runtime = celery_dlq.install(app)
    connections = runtime.redis()   # nothing listens on port 1: building must send no command
    assert connections.sharded is connections.side.sharded and connections.client is connections.side.client
    assert connections.deadletterer.link is connections.side.link
    op = Operator(app)
    assert op.sharded is op.side.sharded and op.chords is op.side.chords and op.keys is op.side.keys


def test_parts_given_are_used_as_they_are():
    fake = fakeredis.FakeRedis()
    store = ShardedStore(fake, Shards("given"), events_max_length=10)
    side = redis_side(app_with(), client=fake, broker=fake, sharded=store)
    assert side.client is fake and side.sharded is store and side.broker is fake
    assert side.keys is store.home.keys and side.dlqs.client is fake
