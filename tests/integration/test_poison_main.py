"""persist_delivery_count_before_delivery: the count survives the death of the whole worker."""
from __future__ import annotations

import json

import pytest

from celery_dlq import headers as H

pytestmark = pytest.mark.integration

FAST_RESTORE = json.dumps({"broker_transport_options": {
    "visibility_timeout": 1, "unacked_restore_interval": 1, "unacked_restore_throttle": 1}})


def test_task_killing_the_whole_worker_is_dead_lettered_after_max_attempts(harness):
    harness.extra_env["DLQ_TEST_CONF"] = FAST_RESTORE
    poison = harness.send("proj.kills_worker")
    for attempt in (1, 2):
        worker = harness.worker(concurrency=1, name=f"run{attempt}")
        harness.wait_until(lambda: len(harness.deliveries(poison.id)) == attempt, timeout=30)
        worker.proc.wait(timeout=20)  # SIGKILLed by its own task
        assert worker.proc.returncode == -9
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
