"""The RedriveJobs bootstep: the leader's polled duties, redrive jobs and the breaker sweep.

Both are duties of the leader (``worker/leader/lease.py``'s ``DUTIES``: one worker at a time, so the cost does
not grow with the number of workers), run in one thread of their own, because a job runs for minutes.

- **Redrive jobs.** A job (``ops/jobs.py``) is run by whichever process holds its lease. When that
  process dies (a dashboard restarted, a ``celery dlq jobs run`` killed, another worker gone), its lease
  expires. The leader looks for such orphans (one ``ZRANGE``: the first lease to run out) and takes one,
  the claim being atomic (``job_claim.lua``), then runs it to its end in this thread through the operator
  API, so each letter still moves once (``ops/queue.py``). ``dlq_jobs_poll = 0`` turns this duty off.
- **Breaker sweep.** What the fetch holds for breakers that are gone is released (``worker/features/breaker.py``).
  No setting turns it off.

It looks every ``dlq_jobs_poll`` seconds (the default where it is 0) while a job is unfinished or the fetch
holds deliveries; while neither, each look waits twice as long as the last, up to :func:`idle_most`. A job
is orphaned a lease after it starts at the earliest, so with a lease at least that long (the defaults) a
look comes before that and the takeover still comes within ``dlq_jobs_poll`` of its lease's end.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from celery import bootsteps

from celery_dlq.ops.jobrun import JobRunner
from celery_dlq.ops.jobs import LEASE, Jobs
from celery_dlq.ops.operator import Operator
from celery_dlq.worker.leader.lease import REDRIVE_JOBS, polls_of
from celery_dlq.worker.park.mover import Mover
from celery_dlq.worker.runtime import Runtime

logger = logging.getLogger(__name__)


#: While looks find nothing, they space out up to this many polls.
IDLE_POLLS = 6


def idle_most(poll: float, lease: float) -> float:
    """The longest wait between two looks that find nothing: at most ``IDLE_POLLS`` polls, and no longer than
    the lease of a job a worker runs (``lease``) or jobs' default lease, so a job started meanwhile is seen
    before its lease can run out."""
    return max(poll, min(IDLE_POLLS * poll, lease, LEASE))


def next_wait(last: float, busy: bool, poll: float, most: float) -> float:
    """The wait before the next look: ``poll`` after a look that found a job or held deliveries; else twice
    the last wait, up to ``most``."""
    return poll if busy else max(poll, min(last * 2, most))


class JobsThread(threading.Thread):
    """Looks for orphaned jobs (where ``jobs``) and held deliveries (see the module docstring) and runs each job
    it takes, until stopped. Each of ``sweeps`` returns whether it found anything held."""

    def __init__(self, app: Any, poll: float, holder: threading.Event,
                 sweeps: tuple[Callable[[], Any], ...] = (), lease: float = LEASE, jobs: bool = True) -> None:
        super().__init__(name="celery-dlq-jobs", daemon=True)
        self.app, self.poll, self.holder, self.sweeps, self.lease = app, poll, holder, sweeps, lease
        self.jobs = jobs
        self.most = idle_most(poll, lease)
        self._stop_event = threading.Event()
        self.runner: JobRunner | None = None

    def run(self) -> None:
        wait = self.poll / 2   # the first look that finds nothing waits one poll
        while not self._stop_event.is_set():
            if not self.holder.is_set():   # another worker leads: its duty
                wait = self.poll / 2
                self._stop_event.wait(self.poll)
                continue
            busy = True
            try:
                busy = self.jobs and self._look_for_jobs()
                for sweep in self.sweeps:   # deliveries the fetch held that no breaker holds now
                    busy = bool(sweep()) or busy
            except Exception:   # Redis down, or a bug of ours: logged, and looked at again next time
                logger.exception("celery-dlq: looking for redrive jobs to take over")
            wait = next_wait(wait, busy, self.poll, self.most)
            self._stop_event.wait(wait)

    def _look_for_jobs(self) -> bool:
        if self.runner is None:   # connects on first use, in this thread
            self.runner = JobRunner(Jobs(Operator(self.app), lease=self.lease))
        return self.runner.unfinished()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop_event.set()
        if self.runner is not None:
            self.runner.stopping = True   # after the batch it is moving: its lease lets another carry on
        self.join(timeout)


class RedriveJobs(bootsteps.StartStopStep):
    """Consumer bootstep: one thread per worker running the leader's polled duties while the worker leads (after
    the Mover step, whose leader says so): redrive jobs nobody runs (unless ``dlq_jobs_poll`` is 0) and the
    breaker sweep (always)."""

    requires = ("celery.worker.consumer.connection:Connection", Mover)
    runtime: Runtime

    def __init__(self, c: Any, **kwargs: Any) -> None:
        self.thread: JobsThread | None = None
        super().__init__(c, **kwargs)

    def start(self, c: Any) -> None:
        settings = self.runtime.config.settings
        # A job this worker runs is leased as the leader is: another worker takes it over as soon after a death.
        self.thread = JobsThread(c.app, polls_of(settings), self.runtime.mover_holder, (self.runtime.breakers.sweep,),
                                 lease=settings.mover_lease, jobs=REDRIVE_JOBS.on(settings))
        self.thread.start()

    def stop(self, c: Any) -> None:
        if self.thread is not None:
            self.thread.stop()
            self.thread = None

    shutdown = stop
