"""The store split over shards (``dlq_store_shards``): written by task id, read as one, an earlier layout drained.

On fakeredis and a real redis-server; the Redis Cluster half is in
``tests/integration/test_cluster.py``.
"""
from __future__ import annotations

import os
import uuid
from collections import Counter

import fakeredis
import pyarrow.dataset as ds
import pytest
import redis

from celery_dlq.analytics import export as X
from celery_dlq.storage import totals
from celery_dlq.storage.archive import Event
from celery_dlq.storage.keys import Stat
from celery_dlq.storage.sharding import Shards
from celery_dlq.storage.shards import ShardedStore
from celery_dlq.storage.totals import Metric
from tests.redis_server import free_port

T0 = 1_700_000_000.0


def park(store: ShardedStore, task_id: str, due: float, queue: str = "orders", delivery: int = 2) -> str:
    entry_id = f"{task_id}:{delivery}"
    assert store.of(task_id).store.park(entry_id, f"payload of {task_id}".encode(), queue, due, task="t.x")
    return entry_id


@pytest.fixture
def prefix(any_redis):
    prefix = f"shards-{uuid.uuid4().hex[:8]}"
    yield prefix
    for key in any_redis.scan_iter(match=f"{{{prefix}*", count=1000):
        any_redis.delete(key)


def test_entries_spread_by_task_id_and_read_back_as_one_store(any_redis, prefix):
    store = ShardedStore(any_redis, Shards(prefix, count=4), clock=lambda: T0)
    tasks = [f"task-{n}" for n in range(40)] + ["app:chosen:id"]          # a task id may hold colons
    for n, task_id in enumerate(tasks):
        park(store, task_id, T0 + 100 + n, queue="orders" if n % 2 else "mail")

    per_shard = [shard.store.count() for shard in store.all]
    assert per_shard[0] == 0 and all(per_shard[1:]) and sum(per_shard) == len(tasks), per_shard
    for task_id in tasks:                                   # each in the shard its id picks, and only there
        assert store.of(task_id).store.get(f"{task_id}:2") is not None
    assert store.count() == len(tasks)
    assert store.counts_by_queue() == dict(Counter("orders" if n % 2 else "mail" for n in range(len(tasks))))
    assert [e.entry_id for e in store.entries()] == [f"{t}:2" for t in tasks]    # due order across shards
    assert [e.entry_id for e in store.entries("mail")] == [f"{t}:2" for n, t in enumerate(tasks) if n % 2 == 0]
    assert store.next_due() == T0 + 100
    assert store.stats()[Stat.PARKED] == len(tasks)

    assert store.get("app:chosen:id:2").queue == "mail"
    assert store.redeliver_now("app:chosen:id:2", now=T0) == 1
    assert store.of("app:chosen:id").store.get("app:chosen:id:2").due == T0
    assert store.remove("task-3:2") and not store.remove("task-3:2") and store.get("task-3:2") is None
    assert store.redeliver_now(now=T0) == len(tasks) - 2          # every other entry, every shard
    assert store.count() == len(tasks) - 1


def test_one_shard_is_exactly_the_plain_store(any_redis, prefix):
    store = ShardedStore(any_redis, Shards(prefix), clock=lambda: T0)
    park(store, "t1", T0 + 5)
    assert store.all == (store.home,) and store.of("t1") is store.home
    assert any_redis.zcard(f"{{{prefix}}}:delayed") == 1
    assert sorted(k.decode() for k in any_redis.scan_iter(match=f"{{{prefix}*")) == sorted(
        f"{{{prefix}}}:{name}" for name in ("delayed", "payloads", "queues", "parked", "stats", "metrics", "trends",
                                            "wake"))   # the mover's wake marker: the entry is the earliest


def test_a_new_shard_count_still_reads_and_serves_the_shards_of_the_old_one(any_redis, prefix):
    plain = ShardedStore(any_redis, Shards(prefix), clock=lambda: T0, register=True)
    park(plain, "before-sharding", T0 + 1)
    three = ShardedStore(any_redis, Shards(prefix, count=3), clock=lambda: T0, register=True)
    for n in range(12):
        park(three, f"t{n}", T0 + 10 + n)
    assert three.count() == 13                                     # the home set's entry is read too

    two = ShardedStore(any_redis, Shards(prefix, count=2), clock=lambda: T0, register=True)
    assert two.count() == 13 and len(two.all) == 1 + 2 + len(set(Shards(prefix, count=3).tags)
                                                                  - set(Shards(prefix, count=2).tags))
    moved = [entry.entry_id for shard in two.all for entry in shard.store.claim_due(limit=100, now=T0 + 60)]
    assert sorted(moved) == sorted(["before-sharding:2", *(f"t{n}:2" for n in range(12))])
    reader = ShardedStore(any_redis, Shards(prefix, count=2))      # a reader registers nothing
    assert {s.keys.base for s in reader.all} == {s.keys.base for s in two.all}
    assert len(any_redis.smembers(Shards(prefix).home.layout)) == len(set(Shards(prefix, count=3).tags)
                                                                     | set(Shards(prefix, count=2).tags))


def test_building_a_sharded_store_costs_no_round_trip():
    down = redis.Redis(port=free_port(), socket_connect_timeout=0.5)   # nothing listens there
    store = ShardedStore(down, Shards("p", count=3), register=True)   # an exporter starts while Redis is down
    assert len(store) == 3
    with pytest.raises(redis.ConnectionError):
        store.count()


def test_counters_of_every_shard_are_summed(any_redis, prefix):
    shards = Shards(prefix, count=3)
    for n, keys in enumerate(shards.all):
        totals.incr(any_redis, keys, Metric.REDELIVERED, n + 1, queue="orders", task="t.x")
    assert totals.read(any_redis, shards.all) == {(Metric.REDELIVERED, (("queue", "orders"), ("task", "t.x"))): 10}


def test_export_reads_every_shard_stream_once_with_unique_event_ids(tmp_path, monkeypatch):
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    store = ShardedStore(client, Shards("exp", count=3), events_max_length=1000)
    for n, shard in enumerate(store.all):             # the same stream id in every stream
        client.xadd(shard.keys.events, Event("parked", 1_710_460_800_000_000, task_id=f"t{n}", task_name="x",
                                             queue="orders", delivery=1).to_fields(), id="1710460800000-0")
    first = X.export_store(client, store, str(tmp_path))
    assert first.rows == 4 and first.last_id == "1710460800000-0" and first.events_lost == 0
    table = ds.dataset(str(tmp_path / "events"), format="parquet", partitioning="hive").to_table()
    ids = sorted(table.column("event_id").to_pylist())
    assert len(set(ids)) == 4 and ids[0] == "1710460800000-0"
    assert all(i.startswith("1710460800000-0-") for i in ids[1:])
    assert sorted(table.column("task_id").to_pylist()) == ["t0", "t1", "t2", "t3"]
    assert sorted(f for f in os.listdir(tmp_path) if f.startswith("_checkpoint")) == sorted(
        ["_checkpoint.json"] + [f"_checkpoint.shard-{X.shard_name('exp', k.prefix)}.json" for k in store.shards.shards])

    client.xadd(store.of("late").keys.events, Event("parked", 1_710_460_900_000_000, task_id="late",
                                                    task_name="x", queue="orders", delivery=1).to_fields())
    again = X.export_store(client, store, str(tmp_path))
    assert again.rows == 1                                  # only the new event: every stream kept its checkpoint
