"""Replays and purges run in a background thread, so a request never waits for 10,000 moves.

A POST starts a :class:`Job` and redirects to its page, which refreshes
itself and shows progress until the :class:`~celery_dlq.ops.queue.Outcome`
is in. The operator API does the work (each message moved atomically), so a
job interrupted by a restart is simply run again: nothing is lost or moved
twice. Jobs live in this process only; the last :data:`KEEP` are kept.
"""
from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from celery_dlq.ops.queue import Outcome

logger = logging.getLogger(__name__)

KEEP = 100


@dataclass
class Job:
    """One action: what it does (``title``), how far it got, and its outcome or error once finished."""

    job_id: str
    title: str
    verb: str
    dlq: str
    total: int | None
    user: str
    started: float = field(default_factory=time.time)
    done: int = 0
    outcome: Outcome | None = None
    error: str | None = None
    finished: float | None = None

    @property
    def running(self) -> bool:
        return self.finished is None

    def advance(self, n: int) -> None:
        self.done += n


class Jobs:
    """The jobs of one dashboard, newest last; each runs in its own daemon thread."""

    def __init__(self) -> None:
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._lock = threading.Lock()

    def start(self, title: str, verb: str, dlq: str, total: int | None, user: str,
              work: Callable[[Callable[[int], None]], Outcome]) -> Job:
        job = Job(secrets.token_hex(8), title, verb, dlq, total, user)
        with self._lock:
            self._jobs[job.job_id] = job
            while len(self._jobs) > KEEP:
                self._jobs.popitem(last=False)
        threading.Thread(target=self._run, args=(job, work), name=f"dlq-web-{job.job_id}", daemon=True).start()
        return job

    @staticmethod
    def _run(job: Job, work: Callable[[Callable[[int], None]], Outcome]) -> None:
        try:
            job.outcome = work(job.advance)
            logger.info("celery-dlq web: %s by %s: %d done, %d gone already, %d failed", job.title, job.user,
                        job.outcome.done, job.outcome.missing, len(job.outcome.failed))
        except Exception as exc:  # the job page shows it; the server carries on
            logger.exception("celery-dlq web: %s failed", job.title)
            job.error = f"{type(exc).__name__}: {exc}"
        finally:
            job.finished = time.time()

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def recent(self) -> list[Job]:
        with self._lock:
            return list(reversed(self._jobs.values()))

    def wait(self, job_id: str, timeout: float = 30) -> Job:
        """Block until a job finished (tests and scripts)."""
        deadline = time.monotonic() + timeout
        job = self._jobs[job_id]
        while job.running and time.monotonic() < deadline:
            time.sleep(0.01)
        return job
