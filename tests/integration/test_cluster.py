"""The store on a Redis Cluster (``dlq_redis_cluster``): three masters on loopback ports, the broker a plain Redis.

Every store key shares one hash tag, so each script runs on one node; the
worker parks, counts and moves through redis-py's cluster client, and the
operator tools read the same store.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import redis
from redis.cluster import RedisCluster

from tests.integration.conftest import ROOT
from tests.redis_server import RedisClusterServers

pytestmark = pytest.mark.integration

TASKS = 200


@pytest.fixture
def cluster():
    servers = RedisClusterServers().start()
    yield servers
    servers.stop()


def dlq(harness, conf: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "celery", "-A", "tests.integration.ops_app", "dlq", *args],
                          cwd=ROOT, env=harness.env(DLQ_TEST_OPS_CONF=json.dumps(conf)), capture_output=True,
                          text=True, timeout=120)


def test_a_store_on_a_redis_cluster_parks_and_redelivers_every_delivery_once(harness, cluster):
    conf = {"dlq_redis_url": cluster.url, "dlq_redis_cluster": True}
    harness.extra_env.update(DLQ_TEST_CONF=json.dumps(conf), DLQ_TEST_REDIS=harness.broker)
    harness.worker(concurrency=2)
    flaky = [harness.send("proj.flaky", args=(2, i)).id for i in range(TASKS)]
    waiting = [harness.send("proj.park_long", args=(i,)).id for i in range(3)]
    harness.wait_until(lambda: sum(1 for d in harness.deliveries() if d["task"] == "proj.flaky") >= 3 * TASKS,
                       timeout=120, message="every flaky task delivered three times")
    by_task: dict[str, list[int]] = {}
    for row in harness.deliveries():
        by_task.setdefault(row["id"], []).append(row["delivery"])
    assert all(sorted(by_task[t]) == [1, 2, 3] for t in flaky), "each delivery exactly once, none skipped"

    nodes = [redis.Redis(port=n.port) for n in cluster.nodes]
    tag = "{" + harness.prefix + "}"
    slot = nodes[0].execute_command("CLUSTER", "KEYSLOT", f"{tag}:stats")
    holding = [int(n.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)) for n in nodes]
    assert sum(1 for n in holding if n) == 1, f"one hash tag: the whole store on one node, {holding}"
    store = RedisCluster.from_url(cluster.url)
    assert store.zcard(f"{tag}:delayed") == 3                    # the three waiting an hour
    assert int(store.hget(f"{tag}:stats", "parked")) == 2 * TASKS + 3
    assert harness.redis.keys(f"{tag}*") == [], "nothing of the store on the broker"

    delayed = dlq(harness, conf, "delayed", "--json")
    assert delayed.returncode == 0, delayed.stderr
    assert sorted(row["task_id"] for row in json.loads(delayed.stdout)) == sorted(waiting)
    stats = dlq(harness, conf, "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    counters = {row["name"]: row["value"] for row in json.loads(stats.stdout)}
    assert counters["parked"] == 2 * TASKS + 3 and counters["redelivered"] == 2 * TASKS
    queues = dlq(harness, conf, "queues", "--json")
    assert queues.returncode == 0, queues.stderr
    assert {row["queue"]: row["parked"] for row in json.loads(queues.stdout)}[harness.queue] == 3
