"""A sharded store (``dlq_store_shards``) on one plain Redis, broker and store alike: real workers.

The mover serves every shard, inside Redis (the fast path), with several
workers; a new shard count strands nothing parked under the old one.
"""
from __future__ import annotations

import json
from collections import Counter

import pytest

from celery_dlq.storage.sharding import Shards

pytestmark = pytest.mark.integration

TASKS = 600


def parks_per_shard(harness, shards: Shards) -> list[int]:
    return [int(harness.redis.hget(keys.stats, "parked") or 0) for keys in shards.all]


def test_three_workers_serve_four_shards_every_delivery_once(harness):
    conf = {"dlq_store_shards": 4}
    harness.extra_env.update(DLQ_TEST_CONF=json.dumps(conf))
    for name in ("a", "b", "c"):
        harness.worker(name=name)
    ids = [harness.send("proj.flaky", args=(2, i)).id for i in range(TASKS)]
    harness.wait_until(lambda: len(harness.deliveries()) >= 3 * TASKS, timeout=240,
                       message="every task delivered three times")
    shards = Shards(harness.prefix, count=4)
    parks = parks_per_shard(harness, shards)
    redelivered = [int(harness.redis.hget(keys.stats, "redelivered") or 0) for keys in shards.all]
    counters = {row["name"]: row["value"] for row in harness.dlq_json("stats", conf=conf)}
    harness.after_a_mover_pass()   # then any duplicate would have shown up (the canary parks in the home set)
    by_task: dict[str, list[int]] = {}
    for row in harness.deliveries():
        by_task.setdefault(row["id"], []).append(row["delivery"])
    assert set(by_task) == set(ids) and all(sorted(d) == [1, 2, 3] for d in by_task.values())

    assert parks[0] == 0 and all(parks[1:]) and sum(parks) == 2 * TASKS, parks   # home empty, every shard used
    assert sum(redelivered) == 2 * TASKS
    assert all(harness.redis.zcard(keys.delayed) == 0 for keys in shards.all)
    assert sorted(m.decode() for m in harness.redis.smembers(shards.home.layout)) == sorted(shards.tags)
    assert counters["parked"] == 2 * TASKS and counters["redelivered"] == 2 * TASKS


def test_a_new_shard_count_moves_what_the_old_one_parked(harness):
    old = Shards(harness.prefix, count=4)
    harness.extra_env.update(DLQ_TEST_CONF=json.dumps({"dlq_store_shards": 4}))
    first = harness.worker(name="old")
    ids = [harness.send("proj.park_long", args=(i,)).id for i in range(16)]
    harness.wait_until(lambda: sum(harness.redis.zcard(k.delayed) for k in old.shards) == 16, timeout=60,
                       message="16 parked in the 4-shard layout")
    first.stop()

    conf = {"dlq_store_shards": 2}
    harness.extra_env.update(DLQ_TEST_CONF=json.dumps(conf))
    harness.worker(name="new")
    assert sorted(row["task_id"] for row in harness.dlq_json("parked", conf=conf)) == sorted(ids)
    redelivered = harness.dlq("redeliver", "--all", conf=conf)
    assert redelivered.returncode == 0 and "16 parked retries due now" in redelivered.stdout, redelivered.stderr
    # Delivery 2 of 2 fails again: each ends in the DLQ, moved by the new worker from the old layout's shards.
    harness.wait_until(lambda: len(harness.dead_letters()) == 16, timeout=60, message="16 dead letters")
    letters = harness.dead_letters()
    assert sorted(letter["headers"]["id"] for letter in letters) == sorted(ids)
    assert Counter(letter["headers"]["x-dlq-delivery-count"] for letter in letters) == {2: 16}
    assert all(harness.redis.zcard(k.delayed) == 0 and harness.redis.zcard(k.leases) == 0 for k in old.shards)
