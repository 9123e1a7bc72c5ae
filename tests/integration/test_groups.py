"""Failure-group counts stay exact against the letters themselves, with a real redis-server and real workers:
through dead-lettering, a worker SIGKILLed mid-run (its pool too), a replay of one group, a purge by filter
and retention trims. Each check recounts the DLQ's letters (what redis-cli shows) and compares them with
what ``celery dlq groups --json`` prints and with the index hash."""
from __future__ import annotations

import json
import time
from collections import Counter

import psutil
import pytest

from celery_dlq import headers as H
from celery_dlq.fingerprint import group_id
from celery_dlq.storage import groups
from celery_dlq.storage.keys import Keys, QueueLists
from celery_dlq.storage.store import ParkedStore

pytestmark = pytest.mark.integration


def recount(harness) -> Counter:
    return Counter(letter["headers"][H.GROUP] for letter in harness.dead_letters())


def assert_exact(harness) -> Counter:
    dlq = f"DLQ.{harness.queue}"
    truth = recount(harness)
    index = {g.group_id: g.count for g in groups.parse(dlq, harness.redis.hgetall(QueueLists().groups(dlq)),
                                                        time.time())}
    assert index == dict(truth)
    shown = harness.dlq_json("groups", dlq)
    assert {row["group"]: row["count"] for row in shown if row["group"]} == dict(truth)
    assert all(row["group"] for row in shown), "every letter a worker wrote has a group"
    return truth


#: A killed worker's unacknowledged messages are restored after 1 s, not kombu's hour.
FAST_RESTORE = {"broker_transport_options": {"visibility_timeout": 1, "unacked_restore_interval": 1,
                                             "unacked_restore_throttle": 1}}


def kill_hard(worker) -> None:
    """SIGKILL the worker's main process and its pool children at once (as the OOM killer would)."""
    main = psutil.Process(worker.proc.pid)
    family = [main, *main.children(recursive=True)]
    for proc in family:
        proc.kill()
    psutil.wait_procs(family, timeout=20)
    worker.stop()


def test_group_counts_stay_exact_through_kill_replay_purge_and_trims(harness):
    q = harness.queue
    key_group = group_id("proj.charge", "KeyError", "'user_1'")
    value_group = group_id("proj.charge", "ValueError", "card 1 declined after 7 ms")
    fails_group = group_id("proj.always_fails", "ValueError", "always fails #1")
    sent = {key_group: [], value_group: [], fails_group: []}
    harness.extra_env["DLQ_TEST_CONF"] = json.dumps(FAST_RESTORE)
    first = harness.worker(concurrency=2)
    for n in range(60):
        kind = "key" if n % 2 else "value"
        sent[key_group if kind == "key" else value_group].append(harness.send("proj.charge", args=(n, kind)).id)
    for n in range(20):
        sent[fails_group].append(harness.send("proj.always_fails", args=(n,)).id)
    harness.wait_until(lambda: harness.redis.llen(f"DLQ.{q}") >= 12, timeout=60, message="some dead letters")
    kill_hard(first)   # mid-run: some letters written, others being written or not yet
    harness.worker(concurrency=2, name="w2")
    every = {task_id for ids in sent.values() for task_id in ids}
    harness.wait_until(lambda: {l["headers"]["id"] for l in harness.dead_letters()} >= every, timeout=120,
                       message="every task dead-lettered")
    harness.wait_until(lambda: harness.redis.llen(q) == 0, timeout=30, message="the queue drained")
    truth = assert_exact(harness)
    lost = {l["headers"][H.GROUP] for l in harness.dead_letters() if l["headers"][H.REASON] == "worker_lost"}
    assert set(truth) == set(sent) | lost   # the kill's interrupted deliveries: WorkerLostError, a group of its own
    assert sum(truth.values()) >= len(every)   # a kill may duplicate a letter, never lose one

    for worker in harness.workers:
        worker.stop()
    done = harness.dlq("replay", q, "--group", key_group)
    assert done.returncode == 0, done.stderr
    replayed = Counter(json.loads(raw)["headers"]["id"] for raw in harness.redis.lrange(q, 0, -1))
    assert set(replayed) <= set(sent[key_group]) and sum(replayed.values()) == truth[key_group] > 0
    assert key_group not in assert_exact(harness)

    done = harness.dlq("purge", q, "--task", "proj.always_fails", "--force")
    assert done.returncode == 0, done.stderr
    assert assert_exact(harness) == {gid: n for gid, n in truth.items() if gid not in (key_group, fails_group)}

    # The replayed KeyErrors fail again under a 20-letter limit: retention trims, counts follow.
    harness.extra_env["DLQ_TEST_CONF"] = json.dumps({**FAST_RESTORE,
                                                    "dlq_queue_policies": {q: {"dead_letter_max_length": 20}}})
    harness.worker(concurrency=2, name="w3")
    harness.wait_until(lambda: harness.redis.llen(q) == 0 and harness.redis.llen(f"DLQ.{q}") == 20
                       and recount(harness)[key_group] > 0, timeout=120, message="the replayed ones back, trimmed")
    # Each message is acknowledged after its dead letter and its retention: nothing queued, parked or in
    # flight, the last trims are done (the store counted before the queue, as entries move store -> queue).
    store = ParkedStore(harness.redis, Keys(harness.prefix))
    harness.wait_until(lambda: store.count() == 0 and harness.redis.llen(q) == 0 and harness.in_flight() == 0
                       and harness.redis.llen(f"DLQ.{q}") == 20, timeout=30, message="settled, 20 left")
    after = assert_exact(harness)
    assert sum(after.values()) == 20 and set(after) <= {key_group, value_group} | lost
    assert int(harness.redis.hget(f"{{{harness.prefix}}}:stats", "dead_letters_trimmed") or 0) > 0
