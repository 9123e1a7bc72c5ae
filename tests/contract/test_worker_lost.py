"""A task that SIGKILLs its whole worker (an OOM kill looks like this) is counted and dead-lettered as worker_lost.

Its delivery is counted before it runs, so the third worker to receive it
dead-letters it instead of running it a third time. Needs a worker per
delivery: the first two are killed by the task.

The killed worker's message comes back as the next worker starts: a worker
process of the same host that is gone leaves its in-flight messages to it,
with no lease and no visibility timeout to wait for (kombu's default, an
hour, is left alone).
"""
from __future__ import annotations

import pytest

from celery_dlq import headers as H

pytestmark = [pytest.mark.contract, pytest.mark.integration]


def test_a_task_killing_the_whole_worker_is_dead_lettered_as_worker_lost(harness):
    poison = harness.send("proj.kills_worker")          # max_delivery_attempts 2
    for attempt in (1, 2):
        worker = harness.worker(concurrency=1, name=f"run{attempt}")
        harness.wait_until(lambda: len(harness.deliveries(poison.id)) == attempt, timeout=30,
                           message=f"delivery {attempt} of the worker-killing task")
        worker.proc.wait(timeout=30)
        assert worker.proc.returncode == -9, "the task SIGKILLs its worker's main process"
    survivor = harness.worker(concurrency=1, name="run3")
    harness.wait_until(lambda: len(harness.dead_letters()) == 1, timeout=30, message="the worker_lost dead letter")
    headers = harness.dead_letters()[0]["headers"]
    # The count of the last delivery that ran: the third is refused before it runs.
    assert (headers["id"], headers[H.REASON], headers[H.DELIVERY_COUNT]) == (poison.id, "worker_lost", 2)
    assert [row["delivery"] for row in harness.deliveries(poison.id)] == [1, 2], "never run a third time"
    after = harness.send("proj.noop", args=(3,))
    harness.wait_until(lambda: harness.deliveries(after.id), message="the next task runs")
    assert survivor.proc.poll() is None
