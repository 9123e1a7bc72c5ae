"""Redrives as jobs kept in Redis: started from the CLI, the dashboard or Python, run by any process.

A job replays or purges a selection of one DLQ (ids, a filter, a group, all of it, or a replay plan's
share) at a velocity (:mod:`~celery_dlq.ops.velocity`), in batches through
:class:`~celery_dlq.ops.queue.DeadLetterQueue`, the one place that moves letters, so each letter moves
once however often the job is paused, resumed, cancelled or taken over. Its record
(``storage/jobs.py``) holds its progress and its owner's lease: a process that dies leaves a job any
other process takes over (:class:`~celery_dlq.ops.jobrun.JobRunner`: the dashboard, ``celery dlq jobs
run``, a worker). A job takes only letters dead-lettered before it started, so a letter it replays
that fails again is not replayed again by it. Every start, pause, resume, cancel and end is audited.

    from celery_dlq.ops import Operator
    from celery_dlq.ops.jobs import Jobs
    jobs = Jobs(Operator(app))
    job = jobs.start_redrive("orders", group="3f2a...", start=1, cap=50)
    JobRunner(jobs).run(job.id)        # or leave it to a worker (celery_dlq.ops.jobrun)
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from celery_dlq.errors import DLQError
from celery_dlq.ops.audit import Actor, Audit, os_identity, selection_dict
from celery_dlq.ops.queue import refuse_self_replay
from celery_dlq.ops.selection import Selection, parse_filter
from celery_dlq.ops.velocity import Velocity
from celery_dlq.storage.jobs import COUNTS, ENDED, DLQBusy, JobStateError, JobStore, new_job_id

if TYPE_CHECKING:
    from celery_dlq.ops.operator import Operator

__all__ = ["DLQBusy", "Job", "JobStateError", "Jobs", "KINDS", "Velocity"]

#: What a job does: replay, purge, or redrive (a replay of one failure group that stops when its breaker opens).
KINDS = ("replay", "purge", "redrive")
#: No velocity cap: a page a batch, as fast as Redis moves them.
NO_CAP = Velocity()
#: Seconds an owner's lease lasts; it is renewed after every batch (and every poll while paused).
LEASE = 30.0


@dataclass(frozen=True)
class Job:
    """A job as its record holds it (``storage/jobs.py``)."""

    id: str
    kind: str
    dlq: str
    state: str
    selection: dict
    to: str | None = None
    limit: int | None = None
    who: str = ""
    why: str = ""
    created: float = 0.0
    finished: float | None = None
    reason: str = ""
    rate: float | None = None
    cap: float | None = None
    interval: float = 10.0
    rate_at: float = 0.0
    queue: str = ""
    group: str = ""
    owner: str = ""
    lease_until: float = 0.0
    takeovers: int = 0
    counts: dict = field(default_factory=dict)
    ids_left: list[str] | None = None
    skipped: list[str] = field(default_factory=list)
    title: str = ""
    expected: int | None = None
    errors: list[str] = field(default_factory=list)
    not_found_ids: list[str] = field(default_factory=list)

    @classmethod
    def from_record(cls, rec: dict[str, str]) -> Job:
        number = _number
        return cls(
            id=rec.get("id", ""), kind=rec.get("kind", ""), dlq=rec.get("dlq", ""), state=rec.get("state", ""),
            selection=_json(rec.get("selection"), {}), to=rec.get("to") or None,
            limit=int(rec["limit"]) if rec.get("limit") else None, who=rec.get("who", ""), why=rec.get("why", ""),
            created=number(rec.get("created")) or 0.0, finished=number(rec.get("finished")),
            reason=rec.get("reason", ""), rate=number(rec.get("rate")), cap=number(rec.get("cap")),
            interval=number(rec.get("interval")) or 10.0, rate_at=number(rec.get("rate_at")) or 0.0,
            queue=rec.get("queue", ""), group=rec.get("group", ""), owner=rec.get("owner", ""),
            lease_until=(number(rec.get("lease_until")) or 0.0) / 1000, takeovers=int(rec.get("takeovers") or 0),
            counts={name: int(rec.get(name) or 0) for name in COUNTS},
            ids_left=_json(rec.get("ids_left"), None), skipped=_json(rec.get("skipped"), []),
            title=rec.get("title", ""), expected=int(rec["expected"]) if rec.get("expected") else None,
            errors=_json(rec.get("errors"), []), not_found_ids=_json(rec.get("not_found_ids"), []))

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def rising(self) -> bool:
        return self.cap is not None

    def velocity(self) -> Velocity:
        return Velocity(self.rate, self.cap, self.interval)

    def where(self) -> Selection | None:
        """What the job selects (its ids left, when by id); None when its ids are all done. The runner takes
        only letters dead-lettered before the job was created (``ops/jobrun.py``)."""
        spec = self.selection
        if spec.get("ids") and self.ids_left == []:
            return None
        filters = {name: repr(v) if isinstance(v, float) else v for name, v in (spec.get("filter") or {}).items()}
        ids = spec.get("ids") or []
        return Selection(tuple(self.ids_left if self.ids_left is not None and ids else ids), parse_filter(filters),
                         True)

    def as_dict(self) -> dict:
        out = {name: getattr(self, name) for name in (
            "id", "kind", "dlq", "state", "selection", "to", "limit", "who", "why", "created", "finished", "reason",
            "rate", "cap", "interval", "queue", "group", "owner", "lease_until", "takeovers", "title", "expected",
            "errors", "not_found_ids")}
        return {**out, **self.counts}


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def _json(text: str | None, default: Any) -> Any:
    try:
        return json.loads(text) if text else default
    except ValueError:
        return default


class Jobs:
    """The jobs of one app: start, read, pause, resume, cancel (any process), and a runner to run them."""

    def __init__(self, op: Operator, *, owner: str | None = None, lease: float = LEASE) -> None:
        self.op, self.lease = op, lease
        self.store = JobStore(op.client, op.keys)
        self.audit = Audit(op)
        #: This process, as a job's owner: ``user@host:pid:<random>``.
        self.owner = owner or f"{os_identity()}:{os.getpid()}:{new_job_id()[:6]}"

    def start(self, name: str, selection: Selection, *, kind: str = "replay", actor: Actor | None = None,
              to: str | None = None, limit: int | None = None, velocity: Velocity = NO_CAP,
              force: bool = False, queue: str = "", group: str = "", title: str = "",
              expected: int | None = None) -> Job:
        """Record a new job on DLQ ``name`` (or the DLQ of queue ``name``); it runs when a runner takes it.

        :class:`~celery_dlq.storage.jobs.DLQBusy` when another unfinished job works that DLQ (unless
        ``force``). ``queue`` and ``group``: a redrive's breaker (``Keys.breaker``), checked between batches.
        """
        if kind not in KINDS:
            raise ValueError(f"unknown job kind {kind!r} (kinds: {', '.join(KINDS)})")
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit!r}")
        actor = actor or Actor.of()
        dead = self.op.queue(name)
        if kind != "purge":
            refuse_self_replay(dead.name, to)
        now, job_id = self.op.clock(), new_job_id()
        chosen = selection_dict(selection)
        self.store.create(job_id, dead.name, {
            "kind": kind, "selection": json.dumps(chosen), "to": to, "limit": limit, "who": actor.who,
            "why": actor.why, "rate": velocity.rate, "cap": velocity.cap, "interval": velocity.interval,
            "rate_at": now, "queue": queue, "group": group, "title": title or f"{kind} {chosen['described']} of "
            f"{dead.name}", "expected": expected}, created=now, force=force)
        self.audit.record("start", actor, dlq=dead.name, selection=chosen, job_id=job_id, kind=kind, to=to,
                          velocity={"rate": velocity.rate, "cap": velocity.cap, "interval": velocity.interval})
        return self._get(job_id)

    def start_redrive(self, queue_or_dlq: str, group: str, *, start: float = 1.0, cap: float = 50.0,
                      interval: float = 10.0, actor: Actor | None = None, force: bool = False) -> Job:
        """Replay failure group ``group`` at a rising velocity (``start`` messages/s, doubled every ``interval``
        seconds while its letters succeed, up to ``cap``); the job stops when the group's breaker on its queue
        opens again (state ``stopped``)."""
        dead = self.op.queue(queue_or_dlq)
        queue = queue_or_dlq if queue_or_dlq != dead.name else self._queue_of(dead.name, group)
        where = parse_filter({"group": group})
        return self.start(dead.name, Selection.of(where=where), kind="redrive",
                          actor=actor or Actor.of(why="automatic redrive"),
                          velocity=Velocity(start, cap, interval), force=force, queue=queue, group=group)

    def start_plan(self, by_dlq: Mapping[str, Iterable[str]], **kw: Any) -> list[Job]:
        """One job per DLQ of a report's replay plan (``ReplayPlan.by_dlq()``: DLQ -> task ids), each replaying
        the oldest dead letter of each of its ids; every DLQ is checked before any job starts."""
        shares = {self.op.queue(name).name: list(dict.fromkeys(ids)) for name, ids in by_dlq.items()}
        return [self.start(name, Selection.of(ids), **kw) for name, ids in shares.items() if ids]

    def _queue_of(self, dlq: str, group: str) -> str:
        """The queue a DLQ's group failed on: its index's ``original_queue``, else the DLQ's configured queue."""
        rows = self.op.groups(dlq).per_dlq.get(dlq, [])
        known = next((row.original_queue for row in rows if row.group_id == group and row.original_queue), "")
        return known or self.op.known().get(dlq) or ""

    def get(self, job_id: str) -> Job | None:
        rec = self.store.get(job_id)
        return Job.from_record(rec) if rec else None

    def _get(self, job_id: str) -> Job:
        job = self.get(job_id)
        if job is None:
            raise DLQError(f"no job {job_id} (ended jobs are kept for a week)")
        return job

    def recent(self, limit: int = 50) -> list[Job]:
        return [Job.from_record(rec) for rec in self.store.recent(limit)]

    def pause(self, job_id: str, actor: Actor | None = None) -> Job:
        return self._act(job_id, "pause", actor)

    def resume(self, job_id: str, actor: Actor | None = None) -> Job:
        return self._act(job_id, "resume", actor)

    def cancel(self, job_id: str, actor: Actor | None = None) -> Job:
        """End the job: its runner stops after the batch it is moving (which moves whole)."""
        return self._act(job_id, "cancel", actor, {"finished": self.op.clock(), "reason": "cancelled"})

    def _act(self, job_id: str, action: str, actor: Actor | None, fields: dict | None = None) -> Job:
        job = self._get(job_id)
        self.store.change(job_id, action, fields)
        job = self._get(job_id)
        self.audit.record(action, actor or Actor.of(), dlq=job.dlq, selection=job.selection, counts=job.counts,
                          job_id=job_id, kind=job.kind)
        return job

    def wait(self, job_id: str, timeout: float = 60.0, *, until: Callable[[Job], bool] | None = None,
             poll: float = 0.05) -> Job:
        """The job once it ended (or ``until`` says so), or as it is after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            job = self._get(job_id)
            if (until(job) if until else job.ended) or time.monotonic() >= deadline:
                return job
            time.sleep(poll)
