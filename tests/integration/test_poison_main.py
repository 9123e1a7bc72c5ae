"""persist_delivery_count_before_delivery: the count survives the death of the whole worker.

Each worker is started after the last one died, with kombu's default
visibility timeout (an hour): the new worker gives back what a gone worker
process of its host left in flight as it starts, waiting for no lease.
"""
from __future__ import annotations

import json

import pytest

from celery_dlq import headers as H

pytestmark = pytest.mark.integration

def test_task_killing_the_whole_worker_is_dead_lettered_after_max_attempts(harness):
    poison = harness.send("proj.kills_worker")
    for attempt in (1, 2):
        worker = harness.worker(concurrency=1, name=f"run{attempt}")
        harness.wait_until(lambda: len(harness.deliveries(poison.id)) == attempt, timeout=5,
                           message=f"delivery {attempt}, as the worker starts")
        worker.proc.wait(timeout=20)  # SIGKILLed by its own task
        assert worker.proc.returncode == -9
    survivor = harness.worker(concurrency=1, name="run3")
    harness.wait_until(lambda: len(harness.dead_letters()) == 1, timeout=5, message="dead letter, at once")
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
