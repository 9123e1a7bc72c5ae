"""The store on a Redis Cluster (``dlq_redis_cluster``): three masters on loopback ports, the broker a plain Redis.

Unsharded, every store key shares one hash tag, so the whole store sits on
one node; with ``dlq_store_shards = 6`` it spreads over every master, each
script still on one node. The worker parks, counts and moves through
redis-py's cluster client, and the operator tools and the export read the
same store.
"""
from __future__ import annotations

import json
import time
import uuid
from collections import Counter

import pyarrow.dataset as ds
import pytest
import redis
from redis.cluster import RedisCluster

from celery_dlq import headers as H
from celery_dlq.storage import totals, trends
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.sharding import Shards
from celery_dlq.storage.totals import Metric
from tests.redis_server import RedisClusterServers

pytestmark = pytest.mark.integration

TASKS = 200
SHARDED_TASKS = 3000
#: What Harness.after_a_mover_pass adds to the store's counts: its canary is parked once and moved once.
CANARY = 1


@pytest.fixture
def cluster():
    servers = RedisClusterServers().start()
    yield servers
    servers.stop()


def assert_the_tools_see_it_all(harness, conf: dict, waiting: list[str], parks: int, redeliveries: int) -> None:
    """``celery dlq parked``, ``stats`` and ``queues`` over the store: the waiting retries and every count."""
    assert sorted(row["task_id"] for row in harness.dlq_json("parked", conf=conf)) == sorted(waiting)
    counters = {row["name"]: row["value"] for row in harness.dlq_json("stats", conf=conf)}
    assert counters["parked"] == parks and counters["redelivered"] == redeliveries
    assert counters["parked_now"] == len(waiting)
    queues = {row["queue"]: row["parked"] for row in harness.dlq_json("queues", conf=conf)}
    assert queues[harness.queue] == len(waiting)


def test_a_store_on_a_redis_cluster_parks_and_redelivers_every_delivery_once(harness, cluster):
    conf = {"dlq_redis_url": cluster.url, "dlq_redis_cluster": True}
    harness.extra_env.update(DLQ_TEST_CONF=json.dumps(conf), DLQ_TEST_REDIS=harness.broker)
    harness.worker(concurrency=2)
    flaky = [harness.send("proj.flaky", args=(2, i)).id for i in range(TASKS)]
    waiting = [harness.send("proj.park_long", args=(i,)).id for i in range(3)]
    harness.wait_until(lambda: sum(1 for d in harness.deliveries() if d["task"] == "proj.flaky") >= 3 * TASKS,
                       timeout=120, message="every flaky task delivered three times")
    store = RedisCluster.from_url(cluster.url)
    harness.after_a_mover_pass(store_client=store)     # a duplicate would have run by now
    by_task: dict[str, list[int]] = {}
    for row in harness.deliveries():
        by_task.setdefault(row["id"], []).append(row["delivery"])
    assert all(sorted(by_task[t]) == [1, 2, 3] for t in flaky), "each delivery exactly once, none skipped"

    nodes = [redis.Redis(port=n.port) for n in cluster.nodes]
    tag = "{" + harness.prefix + "}"
    slot = nodes[0].execute_command("CLUSTER", "KEYSLOT", f"{tag}:stats")
    holding = [int(n.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)) for n in nodes]
    assert sum(1 for n in holding if n) == 1, f"one hash tag: the whole store on one node, {holding}"
    assert store.zcard(f"{tag}:delayed") == 3                    # the three waiting an hour
    assert int(store.hget(f"{tag}:stats", "parked")) == 2 * TASKS + 3 + CANARY
    assert store_keys_on_broker(harness, f"{tag}*") == [], "nothing of the store on the broker"

    assert_the_tools_see_it_all(harness, conf, waiting, parks=2 * TASKS + 3 + CANARY,
                                redeliveries=2 * TASKS + CANARY)


def test_a_store_on_a_redis_cluster_dead_letters_once_and_counts_every_trend(harness, cluster):
    """The counts that ride in a pipeline with a script (``trend.lua``; redis-py blocks scripts in a cluster
    pipeline): a dead letter is written once and acknowledged, a redelivery counted, both in the trends."""
    conf = {"dlq_redis_url": cluster.url, "dlq_redis_cluster": True}
    harness.extra_env.update(DLQ_TEST_CONF=json.dumps(conf), DLQ_TEST_REDIS=harness.broker)
    worker = harness.worker(concurrency=1)
    letter = harness.send("proj.not_retryable")
    flaky = harness.send("proj.flaky", args=(1, "trend"))
    harness.wait_until(lambda: harness.dead_letters() and len(harness.deliveries(flaky.id)) == 2
                       and harness.in_flight() == 0, timeout=60, message="the dead letter and the redelivery")
    store = RedisCluster.from_url(cluster.url)
    harness.after_a_mover_pass(store_client=store)        # a second dead letter would be there by now
    assert [(d["headers"]["id"], d["headers"][H.REASON]) for d in harness.dead_letters()] == \
        [(letter.id, "non_retryable")]
    counted = totals.read(store, Keys(harness.prefix))
    assert sum(n for (name, _), n in counted.items() if name == Metric.DEAD_LETTERED) == 1
    assert sum(n for (name, _), n in counted.items() if name == Metric.REDELIVERED) == 1 + CANARY
    seen = trends.read(store, [Keys(harness.prefix)], time.time())
    assert sum(seen.total("dead_lettered")) == 1 and sum(seen.total("redelivered")) == 1 + CANARY
    assert "could not" not in worker.log()


def two_task_ids_per_shard(shards: Shards) -> list[str]:
    """Task ids chosen so that every shard holds two of them."""
    ids: dict[int, list[str]] = {i: [] for i in range(len(shards))}
    while any(len(found) < 2 for found in ids.values()):
        task_id = str(uuid.uuid4())
        if len(ids[shards.index(task_id)]) < 2:
            ids[shards.index(task_id)].append(task_id)
    return [task_id for found in ids.values() for task_id in found]


def test_a_sharded_store_spreads_over_every_master_and_every_tool_reads_all_of_it(harness, cluster, tmp_path):
    conf = {"dlq_redis_url": cluster.url, "dlq_redis_cluster": True, "dlq_store_shards": 6}
    harness.extra_env.update(DLQ_TEST_CONF=json.dumps(conf), DLQ_TEST_REDIS=harness.broker)
    harness.worker(concurrency=2)
    shards = Shards(harness.prefix, count=6)
    waiting = two_task_ids_per_shard(shards)
    for i, task_id in enumerate(waiting):
        harness.send("proj.park_long", args=(i,), task_id=task_id)
    started = time.monotonic()
    flaky = [harness.send("proj.flaky", args=(2, i)).id for i in range(SHARDED_TASKS)]
    harness.wait_until(lambda: harness.redis.llen(f"{harness.prefix}:log") >= 3 * SHARDED_TASKS,
                       timeout=600, message="every flaky task delivered three times")
    seconds = time.monotonic() - started
    # The canary is parked in the home set, which every mover drains with its shards (storage/keys.py, Shards).
    harness.after_a_mover_pass(store_client=RedisCluster.from_url(cluster.url))   # a duplicate would have run
    by_task: dict[str, list[int]] = {}
    for row in harness.deliveries():
        by_task.setdefault(row["id"], []).append(row["delivery"])
    assert set(by_task) == set(flaky)
    assert all(sorted(by_task[t]) == [1, 2, 3] for t in flaky), "each delivery exactly once, none skipped"
    print(f"\n{SHARDED_TASKS} tasks x 3 deliveries over 6 shards on 3 masters: {seconds:.1f} s, "
          f"{3 * SHARDED_TASKS / seconds:.0f} deliveries/s")

    # Every master holds shards, parked entries and its shards' share of the 6,012 parks (the canary's park is
    # counted in the home set, whose keys the scan below leaves out).
    per_master = []
    for node in (redis.Redis(port=n.port) for n in cluster.nodes):
        local = {key.decode() for key in node.scan_iter(match="*{" + harness.prefix + ":*", count=1000)}
        delayed = [key for key in local if key.endswith(":delayed")]
        parked = sum(int(node.hget(key, "parked") or 0) for key in local if key.endswith(":stats"))
        per_master.append((len(delayed), sum(node.zcard(key) for key in delayed), parked))
    print(f"per master (shards with entries, entries parked now, parks counted): {per_master}")
    assert all(shards_here >= 1 and entries >= 1 and parks > 0 for shards_here, entries, parks in per_master)
    assert sum(parks for _, _, parks in per_master) == 2 * SHARDED_TASKS + len(waiting)
    assert sum(entries for _, entries, _ in per_master) == len(waiting)
    assert store_keys_on_broker(harness, "*{" + harness.prefix + "*") == [], "nothing of the store on the broker"

    assert_the_tools_see_it_all(harness, conf, waiting, parks=2 * SHARDED_TASKS + len(waiting) + CANARY,
                                redeliveries=2 * SHARDED_TASKS + CANARY)
    out = tmp_path / "archive"
    exported = harness.dlq_json("export", "--out", str(out), conf=conf)
    table = ds.dataset(str(out / "events"), format="parquet", partitioning="hive").to_table()
    kinds = Counter(table.column("event_type").to_pylist())
    assert kinds["parked"] == 2 * SHARDED_TASKS + len(waiting)   # the canary is parked with no event
    assert kinds["redelivered"] == 2 * SHARDED_TASKS + CANARY
    assert len(set(table.column("event_id").to_pylist())) == table.num_rows == exported["rows"]


def store_keys_on_broker(harness, pattern: str) -> list[bytes]:
    """Keys matching ``pattern`` on the broker but the fetch's own (its registry, listener set, markers, the
    in-flight records and the consumers' beats)."""
    fetch = (b":fetch:", b":marker:", b":fetchwake:", b":inflight:", b":consumers")
    return [key for key in harness.redis.keys(pattern) if not any(part in key for part in fetch)]
