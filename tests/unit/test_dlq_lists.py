"""A DLQ's lists on the broker (storage/dlq.py): each operation, and the batch scripts' KEYS and ARGV.

Run on fakeredis here and on a real redis-server by tests/integration/on_redis.
"""
from __future__ import annotations

import json
import uuid

import pytest

from celery_dlq import headers as H
from celery_dlq.storage.dlq import Batch, DeadLetterLists, count, forget
from celery_dlq.storage.keys import Keys, QueueLists, Stat
from celery_dlq.storage.scripts import Scripts
from celery_dlq.storage.totals import Metric, read

GID = "0123456789abcdef"


def letter(task_id: str, group: str = GID) -> bytes:
    return json.dumps({"headers": {"id": task_id, H.GROUP: group, H.REASON: "max_delivery_attempts"}}).encode()


@pytest.fixture
def world(any_redis):
    lists = QueueLists(f"t{uuid.uuid4().hex}:")
    dlq = "DLQ.orders"
    return any_redis, DeadLetterLists(any_redis, Scripts(any_redis), lists), lists, dlq


def group_count(client, lists, dlq) -> int:
    return int(client.hget(lists.groups(dlq), f"n:{GID}") or 0)


def test_batch_names_each_list_once_after_the_group_index():
    batch = Batch("groups")
    batch.remove("a", b"1", {})
    batch.move("b", "a", b"2", "{}", {H.GROUP: GID, H.REASON: "r"})
    assert batch.keys == ["groups", "a", "b"]
    assert batch.args == [2, b"1", "", "", 3, 2, b"2", "{}", GID, "r"]


def test_lengths_tails_reads_and_finds(world):
    client, dlqs, lists, dlq = world
    zero, nine = lists.key(dlq, 0), lists.key(dlq, 9)
    client.lpush(zero, letter("a"), letter("b"), letter("c"))   # a is the oldest
    client.lpush(nine, letter("d"))
    assert dlqs.lengths(lists.keys(dlq)) == [3, 0, 0, 1]
    assert dlqs.depths({dlq: lists.keys(dlq), "none": []}) == {dlq: 4, "none": 0}
    tails = dlqs.tails({dlq: [zero, nine]})[dlq]
    assert [(n, json.loads(raw)["headers"]["id"]) for n, raw in tails] == [(3, "a"), (1, "d")]
    assert dlqs.tails({"DLQ.empty": [lists.key("DLQ.empty")]}) == {"DLQ.empty": [(0, None)]}
    assert dlqs.length(zero) == 3 and [json.loads(r)["headers"]["id"] for r in dlqs.read(zero, -2, -1)] == ["b", "a"]
    assert [(at, json.loads(raw)["headers"]["id"]) for at, raw in dlqs.find(zero, '"b"', 0, -1)] == [(1, "b")]
    assert {key: (n, len(page)) for key, (n, page) in dlqs.oldest([zero, nine], 2).items()} == {zero: (3, 2),
                                                                                               nine: (1, 1)}
    assert sorted(dlqs.scan(lists.global_keyprefix + "DLQ.*")) == sorted([zero, nine])


def test_remove_replay_and_delete_keep_the_group_index(world):
    client, dlqs, lists, dlq = world
    zero, target = lists.key(dlq, 0), lists.key("orders")
    raws = [letter(t) for t in "abc"]
    client.lpush(zero, *raws)
    client.hset(lists.groups(dlq), f"n:{GID}", 3)
    removal = dlqs.batch(dlq)
    removal.remove(zero, raws[0], json.loads(raws[0])["headers"])
    removal.remove(zero, b"gone", {})
    assert dlqs.remove(removal) == [1, 0] and group_count(client, lists, dlq) == 2
    replay = dlqs.batch(dlq)
    replay.move(zero, target, raws[1], "moved", json.loads(raws[1])["headers"])
    assert dlqs.replay(replay) == [1] and client.lrange(target, 0, -1) == [b"moved"]
    assert group_count(client, lists, dlq) == 1
    assert dlqs.delete(dlq, lists.keys(dlq)) == 1
    assert not client.exists(zero, lists.groups(dlq))


def test_forget_and_count_write_the_store(any_redis):
    keys = Keys(f"c{uuid.uuid4().hex}")
    any_redis.set(keys.delivery_count("t1"), 3)
    forget(any_redis, [[keys.delivery_count("t1"), keys.delivery_count("t2")]])
    assert not any_redis.exists(keys.delivery_count("t1"))
    count(any_redis, keys, Stat.PURGED, Metric.PURGED, 0, dlq="DLQ.x")   # nothing for 0
    assert not any_redis.exists(keys.stats, keys.metrics)
    count(any_redis, keys, Stat.PURGED, Metric.PURGED, 2, dlq="DLQ.x")
    assert any_redis.hget(keys.stats, Stat.PURGED) == b"2"
    assert read(any_redis, keys) == {(Metric.PURGED, (("dlq", "DLQ.x"),)): 2}
