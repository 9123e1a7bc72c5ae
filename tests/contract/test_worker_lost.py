"""A task that SIGKILLs its whole worker (an OOM kill looks like this) is counted and dead-lettered as worker_lost.

Its delivery is counted before it runs, so the third worker to receive it
dead-letters it instead of running it a third time. Needs a worker per
delivery: the first two are killed by the task.

The killed worker's message comes back as the next worker starts: a worker
process of the same host that is gone leaves its in-flight messages to it,
with no lease and no visibility timeout to wait for (kombu's default, an
hour, is left alone). "A restart waits for nothing" (README.md, docs/worker-death.md)
is timed: the in-flight lease is set to a minute here, so a message that
waited for it would come back a minute after its worker died; after a
restart it runs within RESTART_BOUND of the new worker being ready.
"""
from __future__ import annotations

import json
import time

import pytest

from celery_dlq import headers as H

pytestmark = [pytest.mark.contract, pytest.mark.integration]

#: ``dlq_inflight_lease`` in this test: what a message would wait for if a restart did not give it back.
LEASE = 60.0
#: From the restarted worker's "ready." to the message running again: its first fetch (at most one
#: ``dlq_fetch_wait``, 1 s, after it starts consuming) gives back and takes the message, and the pool starts it.
#: Five fetch waits leave room for a loaded machine and stay a twelfth of the lease.
RESTART_BOUND = 5 * 1.0


def test_a_task_killing_the_whole_worker_is_dead_lettered_as_worker_lost(harness):
    harness.extra_env["DLQ_TEST_CONF"] = json.dumps({"dlq_inflight_lease": LEASE})
    poison = harness.send("proj.kills_worker")          # max_delivery_attempts 2
    killed_at = None
    for attempt in (1, 2):
        worker = harness.worker(concurrency=1, name=f"run{attempt}")
        ready_at = time.time()
        harness.wait_until(lambda n=attempt: len(harness.deliveries(poison.id)) == n, timeout=30,
                           message=f"delivery {attempt} of the worker-killing task")
        if killed_at is not None:   # the second worker took the first one's message without waiting for the lease
            ran_at = harness.deliveries(poison.id)[-1]["at"]
            assert ran_at - ready_at <= RESTART_BOUND, f"ran {ran_at - ready_at:.1f} s after the restart"
            assert ran_at - killed_at < LEASE
            assert "left in flight by" in worker.log()
        worker.proc.wait(timeout=30)
        killed_at = time.time()
        assert worker.proc.returncode == -9, "the task SIGKILLs its worker's main process"
    survivor = harness.worker(concurrency=1, name="run3")
    ready_at = time.time()
    harness.wait_until(lambda: len(harness.dead_letters()) == 1, timeout=30, message="the worker_lost dead letter")
    assert time.time() - ready_at <= RESTART_BOUND, "the third delivery, refused, without waiting for the lease"
    headers = harness.dead_letters()[0]["headers"]
    # The count of the last delivery that ran: the third is refused before it runs.
    assert (headers["id"], headers[H.REASON], headers[H.DELIVERY_COUNT]) == (poison.id, "worker_lost", 2)
    assert [row["delivery"] for row in harness.deliveries(poison.id)] == [1, 2], "never run a third time"
    after = harness.send("proj.noop", args=(3,))
    harness.wait_until(lambda: harness.deliveries(after.id), message="the next task runs")
    assert survivor.proc.poll() is None
