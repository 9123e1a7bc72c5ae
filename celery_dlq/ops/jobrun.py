"""Running redrive jobs: one process holds a job by its lease and moves its letters batch by batch.

After each batch the runner counts its progress and renews its lease in one script
(``job_claim.lua``), which also tells it the job's state: paused (it waits, renewing), cancelled or
taken over (it stops), running (the next batch). A redrive job first reads its group's breaker
(``Keys.breaker``) and stops when it is open. A runner that dies leaves its lease to expire; then
:meth:`JobRunner.take_orphans` in any process (the dashboard's, ``celery dlq jobs run``, a worker's
``worker/leader/jobs.py``) takes the job and carries on from what is left in the DLQ: each letter moves
atomically (``ops/queue.py``), so none is delivered twice.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery_dlq.ops.audit import Actor
from celery_dlq.ops.jobs import Job, Jobs
from celery_dlq.ops.letters import DeadLetter, Selector
from celery_dlq.ops.queue import PAGE, DeadLetterQueue, Outcome
from celery_dlq.ops.velocity import batch_size, next_rate, step_due, wait
from celery_dlq.storage.jobs import PAUSED, JobStateError

logger = logging.getLogger(__name__)

#: Seconds a paused job's runner waits between looks at its state; failed letters' ids a job remembers.
POLL, MAX_SKIPPED, MAX_ERRORS = 1.0, 1000, 100


class JobPass:
    """A job's selector: letters dead-lettered before the job was created (a letter it replays that fails again
    is not its to replay again), less those it could not replay (no target): a later batch must not meet
    them again, or a job paced at one letter a batch would never get past one."""

    def __init__(self, inner: Selector | None, skipped: set[str], before: float) -> None:
        self.inner, self.skipped, self.before = inner, skipped, before
        self.last: JobPass | None = None   # the pass started last: the ids it did not take
        self.unknown: list[str] = []       # keys of letters without a task id it took

    def start(self) -> JobPass:
        start = getattr(self.inner, "start", None)
        self.last = JobPass(start() if callable(start) else self.inner, self.skipped, self.before)
        return self.last

    def matches(self, letter: DeadLetter) -> bool:
        key = letter_key(letter)
        at = letter.dead_lettered_at
        if key in self.skipped or (at is not None and at >= self.before):
            return False
        if self.inner is not None and not self.inner.matches(letter):
            return False
        if not letter.task_id:
            self.unknown.append(key)
        return True

    @property
    def missing(self) -> list[str]:
        return list(getattr(self.inner, "missing", []))


def letter_key(letter: DeadLetter) -> str:
    """What a job remembers a letter by: its task id, or a hash of what is stored (an element without one)."""
    return letter.task_id or "raw:" + hashlib.blake2b(bytes(letter.raw), digest_size=8).hexdigest()


@dataclass
class _Pace:
    rate: float | None
    since: float
    sent: int = 0


class JobRunner:
    """Runs the jobs of :class:`~celery_dlq.ops.jobs.Jobs` in this process, one at a time per call."""

    def __init__(self, jobs: Jobs, *, poll: float = POLL, page: int = PAGE,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.jobs, self.op, self.store = jobs, jobs.op, jobs.store
        self.poll, self.page, self.sleep = poll, page, sleep
        self.stopping = False   # set from another thread (a worker's shutdown): stop after this batch

    def _now_ms(self) -> int:
        return int(self.op.clock() * 1000)

    def _claim(self, job_id: str, *, take: bool, counts: dict | None = None) -> str | None:
        return self.store.claim(job_id, self.jobs.owner, self._now_ms(), int(self.jobs.lease * 1000), take=take,
                                counts=counts)

    def unfinished(self) -> bool:
        """Whether any job is unfinished; if one is orphaned, run it (as :meth:`take_orphans` with ``limit=1``).
        One command when every lease is live or there is no job."""
        first = self.store.first_lease()
        if first is not None and first <= self._now_ms():
            for job_id in self.take_orphans(limit=1):
                logger.info("celery-dlq: ran redrive job %s (taken over)", job_id)
        return first is not None

    def take_orphans(self, limit: int = 10) -> list[str]:
        """Run every job (at most ``limit``) whose owner's lease expired, one after another; the ids it ran."""
        ran = []
        for job_id in self.store.orphans(self._now_ms(), limit):
            if self.stopping:
                break
            if (self.store.get(job_id) or {}).get("state") == PAUSED:
                continue   # a paused job needs no runner: whoever looks after its resume takes it
            if self.run(job_id) is not None:
                ran.append(job_id)
        return ran

    def run(self, job_id: str) -> Job | None:
        """Take the job (when its lease expired or it has none) and run it until it ends, is cancelled, is taken
        over or this runner is stopped; the job as it is then, or None when another process holds it."""
        state = self._claim(job_id, take=True)
        if state is None:
            return None
        job = self.jobs.get(job_id)
        if job is None:
            return None
        logger.info("celery-dlq: running job %s (%s of %s) as %s", job_id, job.kind, job.dlq, self.jobs.owner)
        try:
            self._loop(job, state)
        except Exception as exc:   # the job says why it failed; the process carries on
            logger.exception("celery-dlq: job %s failed", job_id)
            self._end(job, "fail", f"{type(exc).__name__}: {exc}")
        if self.stopping:   # stopped with the job unfinished: its lease ends now, another takes it at once
            self.store.claim(job_id, self.jobs.owner, self._now_ms(), 0, take=False)
        return self.jobs.get(job_id)

    def _loop(self, job: Job, state: str | None) -> None:
        dead = DeadLetterQueue(self.op, job.dlq)
        pace = _Pace(job.rate, self.op.clock())
        errors = list(job.errors)
        skipped, ids_left, moved = set(job.skipped), job.ids_left, sum(job.counts.get(n, 0) for n in ("done",
                                                                                                           "missing"))
        while state is not None and not self.stopping:
            if state == PAUSED:
                self.sleep(self.poll)
                state = self._claim(job.id, take=False)
                pace = _Pace(pace.rate, self.op.clock())
                continue
            if job.group and self._breaker(job) == "open":
                return self._end(job, "stop", f"the breaker of group {job.group} on {job.queue} opened again")
            selection = job.where() if ids_left is None else Job(**{**vars(job), "ids_left": ids_left}).where()
            n = batch_size(pace.rate, self.page)
            if job.limit is not None:
                n = min(n, job.limit - moved)
            if selection is None or n <= 0:
                return self._end(job, "finish", "")
            where = JobPass(selection.selector(every=job.kind == "purge"), skipped, job.created)
            out = self._batch(dead, job, where, n)
            out.not_found = where.last.missing if where.last is not None else []
            moved += out.done + out.missing
            exhausted = out.matched < n
            fields = self._remember(job, out, where, skipped, errors, exhausted)
            if fields.get("ids_left") is not None:
                ids_left = json.loads(fields["ids_left"])
            self.store.set(job.id, fields)
            state = self._claim(job.id, take=False, counts=_counts(out, exhausted))
            if exhausted or (job.limit is not None and moved >= job.limit):
                return self._end(job, "finish", "")
            pace.sent += out.matched
            pause = wait(pace.since, pace.sent, pace.rate, self.op.clock())
            pace = self._step(job, pace, self.op.clock() + pause)
            if pause > 0:   # paused or cancelled while it waited: seen before the next batch
                self.sleep(pause)
                state = self._claim(job.id, take=False)
        return None

    def _batch(self, dead: DeadLetterQueue, job: Job, where: JobPass, n: int) -> Outcome:
        if job.kind == "purge":
            return dead.purge(where, force=True, limit=n)
        return dead.replay(where, to=job.to, limit=n)

    @staticmethod
    def _remember(job: Job, out: Outcome, where: JobPass, skipped: set[str], errors: list[str],
                  exhausted: bool) -> dict[str, Any]:
        """The record's fields after a batch: letters that could not be replayed (and why), a by-id job's ids."""
        fields: dict[str, Any] = {}
        if out.failed:
            ids = {line.partition(": ")[0] for line in out.failed}
            skipped.update(ids - {"<unknown id>"})
            if "<unknown id>" in ids and where.last is not None:
                skipped.update(where.last.unknown)
            fields["skipped"] = json.dumps(sorted(skipped)[:MAX_SKIPPED])
            errors.extend(out.failed[:MAX_ERRORS - len(errors)])
            fields["errors"] = json.dumps(errors)
        if job.selection.get("ids"):
            fields["ids_left"] = json.dumps([] if exhausted else out.not_found)
            if exhausted:
                fields["not_found_ids"] = json.dumps(out.not_found[:MAX_SKIPPED])
        return fields

    def _step(self, job: Job, pace: _Pace, start: float) -> _Pace:
        """A rising job's rate doubled once an interval passed while its letters succeeded (none died again);
        the new pace counts from ``start``, when the batch just sent has had its time at the old rate."""
        if not job.rising or pace.rate is None or job.cap is None or not step_due(start, pace.since, job.interval):
            return pace
        rate = next_rate(pace.rate, job.cap, self._healthy(job, pace.since))
        self.store.set(job.id, {"rate": rate, "rate_at": start})
        return _Pace(rate, start)

    def _healthy(self, job: Job, since: float) -> bool:
        """No letter of the job's group was dead-lettered again since ``since``, and its breaker is not open."""
        if job.group and self._breaker(job) == "open":
            return False
        if not job.group:
            return True
        rows = self.op.groups(job.dlq).per_dlq.get(job.dlq, [])
        last = next((row.last for row in rows if row.group_id == job.group), None)
        return last is None or last < since

    def _breaker(self, job: Job) -> str:
        """The state of the job's group's breaker on its queue ('' when none is kept)."""
        if not job.queue:
            return ""
        return self.op.breakers.store.state(job.queue, job.group)

    def _end(self, job: Job, action: str, reason: str) -> None:
        """End the job (finish, stop, fail) unless someone ended it first; audit how it ended."""
        try:
            self.store.change(job.id, action, {"finished": self.op.clock(), "reason": reason}, owner=self.jobs.owner)
        except JobStateError:
            return   # cancelled, or taken over, meanwhile: that process says how it ended
        ended = self.jobs.get(job.id) or job
        audited = {"finish": "purge" if job.kind == "purge" else "replay", "stop": "stop"}.get(action, "stop")
        self.jobs.audit.record(audited, Actor(job.who, job.why), dlq=job.dlq, selection=job.selection,
                               counts=ended.counts, job_id=job.id, kind=job.kind, state=ended.state, reason=reason)


def _counts(out: Outcome, exhausted: bool) -> dict[str, int]:
    return {"matched": out.matched, "done": out.done, "missing": out.missing, "failed": len(out.failed),
            "not_found": len(out.not_found) if exhausted else 0}
