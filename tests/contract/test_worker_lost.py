"""A task that SIGKILLs its whole worker (an OOM kill looks like this) is counted and dead-lettered as worker_lost.

Its delivery is counted before it runs, so the third worker to receive it
dead-letters it instead of running it a third time. Needs a worker per
delivery: the first two are killed by the task.

The killed worker's message comes back through kombu's restore of unacked
messages older than ``visibility_timeout``. Each kombu sweeps once when a
worker starts polling; after that kombu 5.4 to 5.6 sweep every 100 s (a 10 s
timer, scanning on every 10th call: ``loop.call_repeatedly(10, ...)`` and
``restore_visible(interval=10)`` in kombu/transport/redis.py), which only
kombu 5.7's ``unacked_restore_interval``/``unacked_restore_throttle`` options
shorten. So the next worker starts once the message is past the visibility
timeout: its first sweep gives it back, on every kombu.
"""
from __future__ import annotations

import json
import time

import pytest

from celery_dlq import headers as H

pytestmark = [pytest.mark.contract, pytest.mark.integration]

VISIBILITY = 1
#: kombu restores the killed worker's unacked message after 1 s instead of the default hour (kombu 5.7 sweeps
#: every second; older kombu ignore the two sweep options).
FAST_RESTORE = json.dumps({"broker_transport_options": {
    "visibility_timeout": VISIBILITY, "unacked_restore_interval": 1, "unacked_restore_throttle": 1}})


def past_visibility(harness) -> bool:
    """Every unacknowledged message is older than the visibility timeout: a starting worker's sweep restores it."""
    return all(at < time.time() - VISIBILITY for _, at in harness.redis.zrange("unacked_index", 0, -1, withscores=True))


def test_a_task_killing_the_whole_worker_is_dead_lettered_as_worker_lost(harness):
    harness.extra_env["DLQ_TEST_CONF"] = FAST_RESTORE
    poison = harness.send("proj.kills_worker")          # max_delivery_attempts 2
    for attempt in (1, 2):
        worker = harness.worker(concurrency=1, name=f"run{attempt}")
        harness.wait_until(lambda: len(harness.deliveries(poison.id)) == attempt, timeout=30,
                           message=f"delivery {attempt} of the worker-killing task")
        worker.proc.wait(timeout=30)
        assert worker.proc.returncode == -9, "the task SIGKILLs its worker's main process"
        harness.wait_until(lambda: past_visibility(harness), message="the killed worker's message to be visible")
    survivor = harness.worker(concurrency=1, name="run3")
    harness.wait_until(lambda: len(harness.dead_letters()) == 1, timeout=30, message="the worker_lost dead letter")
    headers = harness.dead_letters()[0]["headers"]
    # The count of the last delivery that ran: the third is refused before it runs.
    assert (headers["id"], headers[H.REASON], headers[H.DELIVERY_COUNT]) == (poison.id, "worker_lost", 2)
    assert [row["delivery"] for row in harness.deliveries(poison.id)] == [1, 2], "never run a third time"
    after = harness.send("proj.noop", args=(3,))
    harness.wait_until(lambda: harness.deliveries(after.id), message="the next task runs")
    assert survivor.proc.poll() is None
