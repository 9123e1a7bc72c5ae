"""persist_delivery_count_before_delivery: the count survives the death of the whole worker."""
from __future__ import annotations

import json
import time

import pytest

from celery_dlq import headers as H

pytestmark = pytest.mark.integration

FAST_RESTORE = json.dumps({"broker_transport_options": {
    "visibility_timeout": 1, "unacked_restore_interval": 1, "unacked_restore_throttle": 1}})
VISIBILITY_TIMEOUT = 1.0


def wait_until_restorable(harness) -> None:
    """Until every unacknowledged message is older than the visibility timeout.

    A worker restores those when it starts polling, on every kombu; kombu >= 5.7
    also sweeps every ``unacked_restore_interval``, older kombu only every ~100 s.
    So the next worker is started once the dead one's message can be restored.
    """
    harness.wait_until(lambda: all(score < time.time() - VISIBILITY_TIMEOUT - 0.2 for _, score in
                                   harness.redis.zrange("unacked_index", 0, -1, withscores=True)),
                       timeout=10, message="the dead worker's message past its visibility timeout")


def test_task_killing_the_whole_worker_is_dead_lettered_after_max_attempts(harness):
    harness.extra_env["DLQ_TEST_CONF"] = FAST_RESTORE
    poison = harness.send("proj.kills_worker")
    for attempt in (1, 2):
        worker = harness.worker(concurrency=1, name=f"run{attempt}")
        harness.wait_until(lambda: len(harness.deliveries(poison.id)) == attempt, timeout=30)
        worker.proc.wait(timeout=20)  # SIGKILLed by its own task
        assert worker.proc.returncode == -9
        wait_until_restorable(harness)
    survivor = harness.worker(concurrency=1, name="run3")
    harness.wait_until(lambda: len(harness.dead_letters()) == 1, timeout=30, message="dead letter")
    headers = harness.dead_letters()[0]["headers"]
    assert headers[H.REASON] == "worker_lost"
    assert headers["id"] == poison.id
    assert [r["delivery"] for r in harness.deliveries(poison.id)] == [1, 2], "never run a third time"
    after = harness.send("proj.noop", args=(3,))
    harness.wait_until(lambda: harness.deliveries(after.id))
    assert survivor.proc.poll() is None
    failures = [json.loads(r) for r in harness.redis.lrange(f"{harness.prefix}:failures", 0, -1)]
    assert [(f["id"], f["exception"]) for f in failures] == [(poison.id, "WorkerLostError")], \
        "FAILURE recorded (with its callbacks), not left PENDING"
