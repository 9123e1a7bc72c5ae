"""The dashboard's jobs: replays and purges kept in Redis as jobs (:mod:`celery_dlq.ops.jobs`), run in a thread.

A POST starts a job and redirects to its page, which follows it live (it reloads while the job runs)
with its pause, resume and cancel buttons. The job is in Redis, not in this process: any dashboard
process shows it, pauses or cancels it, and when this one dies a worker, ``celery dlq jobs run`` or
another dashboard (``take_over_jobs``) takes it over; each letter still moves once. Pages of the
jobs and of the audit trail are here too.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from celery_dlq.errors import DLQError
from celery_dlq.ops import Operator, Outcome, Selection
from celery_dlq.ops.audit import Actor, Audit, AuditNotWritten
from celery_dlq.ops.jobrun import JobRunner
from celery_dlq.ops.jobs import Job, Jobs, JobStateError, Velocity
from celery_dlq.web.actions import posted
from celery_dlq.web.render import href, render
from celery_dlq.web.roles import require

logger = logging.getLogger(__name__)

#: The job actions a page may post, each needing the ``job`` role action (an operator) and the role the job's own
#: action needed to start (:func:`require_job`: an admin for a purge's).
JOB_ACTIONS = ("pause", "resume", "cancel")
NO_SUCH_JOB = "no such job (ended jobs are kept for a week)"


class WebJob:
    """A job as the pages read it: every attribute read from Redis when asked (any process may change it)."""

    def __init__(self, jobs: Jobs, job_id: str, job: Job | None = None) -> None:
        self._jobs, self.job_id, self._job = jobs, job_id, job

    def refresh(self) -> Job:
        job = self._jobs.get(self.job_id) if self._job is None else self._job
        if job is None:
            raise HTTPException(404, NO_SUCH_JOB)
        return job

    def __getattr__(self, name: str) -> Any:
        return getattr(self.refresh(), name)

    @property
    def verb(self) -> str:
        return job_verb(self.refresh().kind)

    @property
    def user(self) -> str:
        return self.refresh().who

    @property
    def started(self) -> float:
        return self.refresh().created

    @property
    def total(self) -> int | None:
        return self.refresh().expected

    @property
    def done(self) -> int:
        return int(self.refresh().counts.get("done", 0))

    @property
    def running(self) -> bool:
        return not self.refresh().ended

    @property
    def error(self) -> str | None:
        job = self.refresh()
        return job.reason if job.state == "failed" else None

    @property
    def outcome(self) -> Outcome | None:
        """What it did, once it ended (None while it runs)."""
        job = self.refresh()
        if not job.ended:
            return None
        c = job.counts
        missing = c["missing"] + max(0, c["not_found"] - len(job.not_found_ids))
        return Outcome(matched=c["matched"], done=c["done"], missing=missing, failed=list(job.errors),
                       not_found=list(job.not_found_ids))


class DashboardJobs:
    """This dashboard's handle on the app's jobs: start one (and run it in a thread here), read, act."""

    def __init__(self, op: Operator) -> None:
        self.jobs = Jobs(op)
        self.runner = JobRunner(self.jobs)
        self._taker: threading.Thread | None = None

    def start(self, name: str, selection: Selection, *, verb: str, actor: Actor, to: str | None,
              title: str, total: int | None, rate: float | None = None) -> WebJob:
        job = self.jobs.start(name, selection, kind=verb, actor=actor, to=to, title=title, expected=total,
                              velocity=Velocity(rate))
        threading.Thread(target=self._run, args=(job.id,), name=f"dlq-web-{job.id}", daemon=True).start()
        return WebJob(self.jobs, job.id)

    def _run(self, job_id: str) -> None:
        try:
            self.runner.run(job_id)
        except Exception:   # the runner records a job's failure; this is a bug of ours: logged, the server lives
            logger.exception("celery-dlq web: job %s", job_id)

    def take_over(self, every: float = 10.0) -> None:
        """Run jobs nobody runs (their owner died), looking every ``every`` seconds, in a daemon thread."""
        def loop() -> None:
            while not self.runner.stopping:
                try:
                    self.runner.take_orphans()
                except Exception:
                    logger.exception("celery-dlq web: taking over jobs")
                threading.Event().wait(every)
        self._taker = threading.Thread(target=loop, name="dlq-web-jobs", daemon=True)
        self._taker.start()

    def stop(self) -> None:
        """Stop taking over jobs (and this process's runs, after the batch each is moving)."""
        self.runner.stopping = True

    def get(self, job_id: str) -> WebJob | None:
        return WebJob(self.jobs, job_id) if self.jobs.get(job_id) is not None else None

    def recent(self, limit: int = 50) -> list[WebJob]:
        return [WebJob(self.jobs, job.id, job) for job in self.jobs.recent(limit)]

    def wait(self, job_id: str, timeout: float = 30) -> WebJob:
        """Block until a job ended (tests and scripts)."""
        self.jobs.wait(job_id, timeout)
        return WebJob(self.jobs, job_id)


def require_job(request: Request, job_id: str) -> None:
    """Go on if the request's role may act on job ``job_id``: the ``job`` action, and the action the job runs
    (a purge's job is paused, resumed or cancelled by an admin only, as it was started); else 403. No such
    job: 404."""
    require(request, "job")
    job = request.app.state.jobs.jobs.get(job_id)
    if job is None:
        raise HTTPException(404, NO_SUCH_JOB)
    require(request, job_verb(job.kind))


def job_verb(kind: str) -> str:
    """The role action a job of ``kind`` needed to start: ``purge`` for a purge, ``replay`` for the rest."""
    return "purge" if kind == "purge" else "replay"


def jobs_page(request: Request) -> Response:
    """Every job kept, newest first; reloads while one runs."""
    jobs = request.app.state.jobs.recent()
    return render(request, "jobs.html", jobs=jobs, live=any(not j.ended for j in jobs))


def job_page(request: Request) -> Response:
    job = request.app.state.jobs.get(request.path_params["job_id"])
    if job is None:
        raise HTTPException(404, NO_SUCH_JOB)
    return render(request, "job.html", job=job, snapshot=job.refresh(), actions=JOB_ACTIONS)


async def job_action(request: Request) -> Response:
    """Pause, resume or cancel a job (an operator, CSRF checked), whichever process runs it."""
    action, job_id = request.path_params["action"], request.path_params["job_id"]
    form = await posted(request, "job")
    await run_in_threadpool(require_job, request, job_id)
    if action not in JOB_ACTIONS:
        raise HTTPException(400, f"unknown job action {action!r}")
    actor = Actor(request.state.user, str(form.get("why") or "").strip())
    handle = request.app.state.jobs.jobs
    try:
        await run_in_threadpool(getattr(handle, action), job_id, actor)
    except JobStateError as exc:
        raise HTTPException(409, str(exc)) from None
    except AuditNotWritten:
        raise
    except DLQError as exc:   # no such job
        raise HTTPException(404, str(exc)) from None
    logger.info("celery-dlq web: %s job %s by %s", action, job_id, request.state.user)
    return RedirectResponse(href(request, f"/jobs/{job_id}"), 303)


def audit_page(request: Request) -> Response:
    """The audit trail, newest first (``?before=<id>`` pages on)."""
    before = request.query_params.get("before") or None
    rows = Audit(request.app.state.op).recent(100, before)
    return render(request, "audit.html", rows=rows, before=rows[-1]["id"] if len(rows) == 100 else None)


ROUTES = [
    Route("/jobs", jobs_page, name="jobs"),
    Route("/jobs/{job_id}", job_page, name="job"),
    Route("/jobs/{job_id}/{action}", job_action, methods=["POST"], name="job_action"),
    Route("/audit", audit_page, name="audit"),
]
