"""A busy worker's fetch moves its own queues' due retries while another worker holds the mover lease."""
from __future__ import annotations

import json
import threading
import time

import pytest

from celery_dlq.storage import totals
from celery_dlq.storage.keys import Keys, Stat
from celery_dlq.storage.store import ParkedStore
from celery_dlq.storage.totals import Metric

pytestmark = pytest.mark.integration


def hold_the_mover_elsewhere(harness) -> Keys:
    """The lease held by a mover that never moves (a minute): only a fetch can move."""
    keys = Keys(harness.prefix)
    harness.redis.set(keys.mover_lease, "elsewhere:1:lease", px=60_000)
    return keys


def redelivered_total(harness, keys: Keys) -> int:
    return sum(n for (name, _), n in totals.read(harness.redis, keys).items() if name == Metric.REDELIVERED)


def keep_fetching(harness, stop: threading.Event) -> threading.Thread:
    """A noop every 20 ms, so the worker keeps fetching."""
    def run():
        while not stop.is_set():
            harness.send("proj.noop", args=(-1,))
            stop.wait(0.02)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("moves", [True, False])
def test_a_fetching_worker_moves_its_due_retry_without_the_mover(harness, moves):
    keys = hold_the_mover_elsewhere(harness)
    harness.worker(concurrency=1, DLQ_TEST_CONF=json.dumps({"dlq_fetch_moves_due": moves}))
    stop = threading.Event()
    keep_fetching(harness, stop)
    try:
        task_id = harness.send("proj.flaky", args=(1,)).id      # fails once, then due 0.3 s later
        harness.wait_until(lambda: harness.deliveries(task_id), timeout=30, message="the first delivery")
        if moves:
            harness.wait_until(lambda: len(harness.deliveries(task_id)) == 2, timeout=10,
                               message="the retry, moved by a fetch")
            first, second = harness.deliveries(task_id)
            assert second["delivery"] == 2 and 0.3 <= second["at"] - first["at"] < 3.0
            assert int(harness.redis.hget(keys.stats, Stat.REDELIVERED)) == 1
            harness.wait_until(lambda: redelivered_total(harness, keys) == 1, timeout=5,
                               message="redelivered_total, written by the heartbeat thread (it flushes at every beat)")
        else:
            # Positive signal: once the retry is due, the worker took five more messages, each fetch after
            # one that took a message (when a fetch moves due retries, docs of worker/fetch/moves.py).
            store = ParkedStore(harness.redis, keys)
            due = store.next_due()
            assert due is not None
            harness.wait_until(lambda: time.time() > due, timeout=10, message="the retry due")
            after = [harness.send("proj.noop", args=(-2,)).id for _ in range(5)]
            harness.wait_until(lambda: all(harness.deliveries(i) for i in after), timeout=30,
                               message="five messages fetched after the retry was due")
            assert len(harness.deliveries(task_id)) == 1
            assert store.count() == 1
        assert harness.redis.get(keys.mover_lease) == b"elsewhere:1:lease"   # the mover never moved
    finally:
        stop.set()
