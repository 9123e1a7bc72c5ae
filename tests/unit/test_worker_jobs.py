"""The jobs thread's looks: every poll while there is work, spaced out up to a bound while there is none."""
from __future__ import annotations

import threading

from celery_dlq.ops.jobs import LEASE
from celery_dlq.worker.jobs import IDLE_POLLS, JobsThread, idle_most, next_wait


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


def test_a_worker_that_does_not_hold_the_mover_lease_never_looks():
    thread = JobsThread(None, 1.0, threading.Event(), sweeps=(lambda: 1 / 0,))
    thread.runner = Runner([])   # would raise if asked
    thread._stop_event = Waits(3)
    thread.run()
    assert thread._stop_event.waits == [1.0, 1.0, 1.0]
