"""The jobs thread's looks: every poll while there is work, spaced out up to a bound while there is none."""
from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import celery_dlq
from celery_dlq.ops.jobs import LEASE
from celery_dlq.settings import DEFAULTS, DLQSettings
from celery_dlq.worker.leader.jobs import IDLE_POLLS, JobsThread, RedriveJobs, idle_most, next_wait
from celery_dlq.worker.leader.lease import BREAKER_SWEEP, DUTIES, REDRIVE_JOBS, polls_of


def test_looks_that_find_nothing_space_out_up_to_six_polls_and_never_past_a_lease():
    assert idle_most(5.0, 10.0) == 10.0               # the defaults: a worker's job lease is dlq_mover_lease
    assert idle_most(5.0, 60.0) == IDLE_POLLS * 5.0   # six polls
    assert idle_most(1.0, 60.0) == 6.0 and idle_most(10.0, 60.0) == LEASE   # jobs' default lease bounds it
    assert idle_most(5.0, 2.0) == 5.0                 # never below the poll
    waits, last = [], 2.5
    for busy in (False, False, False, True, False):
        last = next_wait(last, busy, 5.0, 20.0)
        waits.append(last)
    assert waits == [5.0, 10.0, 20.0, 5.0, 10.0]


class Waits:
    """The thread's stop event: records each wait, and stops it after ``n``."""

    def __init__(self, n):
        self.n, self.waits = n, []

    def is_set(self):
        return len(self.waits) >= self.n

    def set(self):
        self.n = 0

    def wait(self, seconds):
        self.waits.append(seconds)


class Runner:
    def __init__(self, answers):
        self.answers, self.stopping = list(answers), False

    def unfinished(self):
        return self.answers.pop(0)


def test_the_holder_looks_every_poll_while_a_job_or_a_held_delivery_exists_and_backs_off_otherwise():
    holder = threading.Event()
    holder.set()
    held = [0, 0, 0, 0, 2, 0, 0]
    thread = JobsThread(None, 1.0, holder, sweeps=(lambda: held.pop(0),), lease=60.0)
    thread.runner = Runner([False, False, False, True, False, False, False])
    thread._stop_event = Waits(7)
    thread.run()
    #          idle  idle  idle  a job  held  idle  idle
    assert thread._stop_event.waits == [1.0, 2.0, 4.0, 1.0, 1.0, 2.0, 4.0]


def test_a_worker_that_does_not_lead_never_looks():
    thread = JobsThread(None, 1.0, threading.Event(), sweeps=(lambda: 1 / 0,))
    thread.runner = Runner([])   # would raise if asked
    thread._stop_event = Waits(3)
    thread.run()
    assert thread._stop_event.waits == [1.0, 1.0, 1.0]


def settings(**conf):
    return DLQSettings.from_conf({f"dlq_{name}": value for name, value in conf.items()})


def test_each_setting_that_turns_a_duty_off_turns_off_that_duty_alone():
    assert {duty.name for duty in DUTIES} == {"mover", "fetch listener", "in-flight sweep", "redrive jobs",
                                              "breaker sweep"}
    assert all(duty.on(settings()) for duty in DUTIES)                   # the defaults: every duty runs
    root = Path(celery_dlq.__file__).parent
    for duty in DUTIES:
        assert duty.cadence == "" or duty.cadence in DEFAULTS, duty      # settings users can set
        assert (root / duty.runs.split(",")[0]).is_file(), duty          # where it runs, by its module
    offs = {duty.off for duty in DUTIES if duty.off}
    assert offs == {"dlq_jobs_poll", "dlq_fetch_listener"}
    for off in offs:
        value = 0 if off == "dlq_jobs_poll" else False
        assert [duty for duty in DUTIES if not duty.on(settings(**{off.removeprefix("dlq_"): value}))] \
            == [duty for duty in DUTIES if duty.off == off]
    assert not REDRIVE_JOBS.on(settings(jobs_poll=0)) and BREAKER_SWEEP.on(settings(jobs_poll=0))
    assert polls_of(settings(jobs_poll=0)) == 5.0 and polls_of(settings(jobs_poll=0.5)) == 0.5


def test_with_dlq_jobs_poll_0_the_leader_takes_no_job_and_still_sweeps_the_breakers():
    """Before, ``dlq_jobs_poll = 0`` left the step out, and the breaker sweep with it."""
    swept = []
    runtime = SimpleNamespace(config=SimpleNamespace(settings=settings(jobs_poll=0)), mover_holder=threading.Event(),
                              breakers=SimpleNamespace(sweep=lambda: swept.append(1) or 0))
    step = type("RedriveJobs", (RedriveJobs,), {"runtime": runtime})(SimpleNamespace())
    assert step.include_if(SimpleNamespace())                            # the step runs: it has a duty
    step.start(SimpleNamespace(app=None))
    try:
        thread = step.thread
        assert thread is not None and not thread.jobs and thread.poll == 5.0
        assert thread.sweeps == (runtime.breakers.sweep,)
    finally:
        step.stop(None)
    thread.holder.set()
    thread._stop_event = Waits(3)
    thread.run()
    assert swept == [1, 1, 1] and thread.runner is None                  # swept; never looked for a job
    assert thread._stop_event.waits == [5.0, 10.0, 10.0]                 # backing off while nothing is held
