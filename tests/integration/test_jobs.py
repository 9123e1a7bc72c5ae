"""Redrive jobs with real processes: paused, resumed and cancelled from another process; a runner SIGKILLed
mid-job and a worker finishing it, every letter delivered exactly once; an edited replay run by a worker."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter

import pytest

from celery_dlq.ops import Operator, Selection
from celery_dlq.ops.jobs import Jobs
from celery_dlq.ops.velocity import Velocity
from celery_dlq.storage.keys import Keys
from tests.integration.conftest import ROOT

pytestmark = pytest.mark.integration

#: fixed_by_flag fails twice (max_delivery_attempts 2) before it is dead-lettered, then runs once replayed.
ORIGINAL_DELIVERIES = 2


def dead_letters_of_fixed_by_flag(h, n: int) -> list[str]:
    """``n`` real dead letters of proj.fixed_by_flag (its flag set), then the flag cleared ("the fix deployed");
    the worker that made them is stopped, so the caller says which worker runs the replays."""
    h.redis.set(f"{h.prefix}:broken", 1)
    worker = h.worker(DLQ_TEST_CONF=json.dumps({"dlq_jobs_poll": 0}))
    ids = [h.send("proj.fixed_by_flag", kwargs={"order_id": i}).id for i in range(n)]
    h.wait_until(lambda: len(h.dead_letters()) == n, timeout=90, message=f"{n} dead letters")
    h.redis.delete(f"{h.prefix}:broken")
    worker.stop()
    h.workers.remove(worker)
    return ids


def runs(h) -> Counter:
    return Counter(row["id"] for row in h.deliveries())


def jobs_of(h) -> Jobs:
    h.app.conf.dlq_key_prefix = h.prefix
    return Jobs(Operator(h.app, broker=h.redis, client=h.redis))


def cli(h, *args: str) -> subprocess.Popen:
    """``celery dlq ARGS`` as a process of its own (the operator's app), its output unbuffered."""
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", "tests.integration.ops_app", "dlq", *args],
                            cwd=ROOT, env=h.env(DLQ_TEST_OPS_CONF="{}", PYTHONUNBUFFERED="1"),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_job_paused_resumed_and_cancelled_from_another_process_moves_each_letter_once(harness):
    h = harness
    ids = dead_letters_of_fixed_by_flag(h, 12)
    h.worker(DLQ_TEST_CONF=json.dumps({"dlq_jobs_poll": 0}))   # runs the replays; takes no job
    # 1 a second: the cancel below must come before the last of the 12, even from a CLI slow to start
    runner = cli(h, "jobs", "start", h.queue, "--all", "--rate", "1", "--run", "--why", "gateway back")
    try:
        job_id = runner.stdout.readline().split()[1]
        jobs = jobs_of(h)
        h.wait_until(lambda: jobs.get(job_id).counts["done"] >= 2, message="two letters replayed")
        paused = h.dlq("jobs", "pause", job_id, "--why", "looks wrong")
        assert paused.returncode == 0 and "paused" in paused.stdout, paused.stderr
        seen = jobs.get(job_id).lease_until
        # the runner renews its lease while paused: two renewals, and it has looked at the state since
        h.wait_until(lambda: jobs.get(job_id).lease_until > seen + 0.5, message="a renewal while paused")
        depth = len(h.dead_letters())
        seen = jobs.get(job_id).lease_until
        h.wait_until(lambda: jobs.get(job_id).lease_until > seen, message="another renewal while paused")
        assert len(h.dead_letters()) == depth and jobs.get(job_id).state == "paused"
        assert h.dlq("jobs", "resume", job_id).returncode == 0
        h.wait_until(lambda: len(h.dead_letters()) <= depth - 2, message="two more letters after the resume")
        cancelled = h.dlq("jobs", "cancel", job_id, "--why", "enough")
        assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout
        assert runner.wait(timeout=30) == 0
    finally:
        runner.kill()
        runner.wait()
    job = jobs.get(job_id)
    left = {letter["headers"]["id"] for letter in h.dead_letters()}
    assert job.state == "cancelled" and 4 <= len(ids) - len(left) < len(ids)
    h.wait_until(lambda: all(runs(h)[i] == ORIGINAL_DELIVERIES + 1 for i in set(ids) - left),
                 message="each replayed letter run")
    h.after_a_mover_pass()
    counted = runs(h)
    assert {i: counted[i] for i in ids} == {i: ORIGINAL_DELIVERIES + (i not in left) for i in ids}
    trail = h.dlq_json("audit")
    assert [(r["action"], r["why"]) for r in trail if r.get("job_id") == job_id] == [
        ("cancel", "enough"), ("resume", ""), ("pause", "looks wrong"), ("start", "gateway back")]


def test_a_runner_killed_mid_job_is_taken_over_by_a_worker_and_each_letter_is_delivered_once(harness):
    h = harness
    ids = dead_letters_of_fixed_by_flag(h, 20)
    jobs = jobs_of(h)
    job = jobs.start(f"DLQ.{h.queue}", Selection.of(everything=True), velocity=Velocity(4.0))
    runner = cli(h, "jobs", "run", job.id, "--lease", "2")
    try:
        h.wait_until(lambda: jobs.get(job.id).owner != "", message="the CLI took the job")
        first_owner = jobs.get(job.id).owner
        h.worker(DLQ_TEST_CONF=json.dumps({"dlq_jobs_poll": 0.2}))   # runs replays; takes orphans
        h.wait_until(lambda: jobs.get(job.id).counts["done"] >= 4, message="four letters replayed")
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=10)
        h.wait_until(lambda: jobs.get(job.id).state == "done", timeout=90, message="the worker finished the job")
    finally:
        runner.kill()
        runner.wait()
    ended = jobs.get(job.id)
    assert ended.owner != first_owner and ended.takeovers == 1 and h.dead_letters() == []
    h.wait_until(lambda: all(runs(h)[i] == ORIGINAL_DELIVERIES + 1 for i in ids), message="every letter run")
    h.after_a_mover_pass()
    counted = runs(h)
    assert {i: counted[i] for i in ids} == {i: ORIGINAL_DELIVERIES + 1 for i in ids}


def test_a_worker_killed_mid_job_leaves_it_to_another_worker_and_each_letter_is_delivered_once(harness):
    """Worker A (consuming another queue) holds the mover lease and runs an orphaned job; it is SIGKILLed
    mid-way; worker B takes the mover lease, then the job (leased for ``dlq_mover_lease``), and ends it."""
    h = harness
    ids = dead_letters_of_fixed_by_flag(h, 20)
    jobs = jobs_of(h)
    job = jobs.start(f"DLQ.{h.queue}", Selection.of(everything=True), velocity=Velocity(4.0))
    conf = json.dumps({"dlq_jobs_poll": 0.2, "dlq_mover_lease": 2.0})
    a = h.worker(name="a", DLQ_TEST_QUEUE=f"{h.queue}.elsewhere", DLQ_TEST_CONF=conf)
    h.wait_until(lambda: jobs.get(job.id).counts["done"] >= 4, message="worker A replays four letters")
    first_owner = jobs.get(job.id).owner
    assert f":{a.proc.pid}:" in first_owner
    h.worker(name="b", DLQ_TEST_CONF=conf)                      # runs the replays; takes the job when A is gone
    a.stop(signal.SIGKILL)
    h.wait_until(lambda: jobs.get(job.id).state == "done", timeout=90, message="worker B finished the job")
    ended = jobs.get(job.id)
    assert ended.owner != first_owner and ended.takeovers == 1 and h.dead_letters() == []
    h.wait_until(lambda: all(runs(h)[i] == ORIGINAL_DELIVERIES + 1 for i in ids), message="every letter run")
    h.after_a_mover_pass()
    counted = runs(h)
    assert {i: counted[i] for i in ids} == {i: ORIGINAL_DELIVERIES + 1 for i in ids}


def test_an_edited_replay_runs_the_new_arguments_and_the_audit_keeps_the_original(harness):
    h = harness
    (task_id,) = dead_letters_of_fixed_by_flag(h, 1)
    h.worker(DLQ_TEST_CONF=json.dumps({"dlq_jobs_poll": 0}))
    done = h.dlq("replay", task_id, "--kwargs", '{"order_id": 4242}', "--why", "wrong order id")
    assert done.returncode == 0, done.stderr
    h.wait_until(lambda: len(h.deliveries(task_id)) == ORIGINAL_DELIVERIES + 1, message="the edited replay ran")
    last = h.deliveries(task_id)[-1]
    assert last["kwargs"] == {"order_id": 4242} and last["task"] == "proj.fixed_by_flag"
    (record,) = [r for r in h.dlq_json("audit") if r["action"] == "edit"]
    assert record["original"]["kwargs"] == {"order_id": 0} and record["edited"]["kwargs"] == {"order_id": 4242}
    assert record["why"] == "wrong order id" and record["task_id"] == task_id
    assert h.redis.xlen(Keys(h.prefix).operator_log) == 1
