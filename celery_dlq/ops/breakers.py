"""The operator's circuit breakers: list them, pause a task or a failure group by hand, resume.

A pause is an open breaker that never probes (``paused_by`` says who); the
workers hold the task's deliveries on that queue (every queue when none is
given) while its policy's ``breaker.enabled`` is ``True`` or ``"manual"``. A resume
closes it and releases what it held at the rising pace of the task's policy
(``breaker.release_rate``, ``breaker.max_release_rate``), as a probe's success does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery_dlq.ops.audit import Actor, Audit
from celery_dlq.storage import breaker_state as B
from celery_dlq.storage.breakers import Breakers

if TYPE_CHECKING:
    from celery_dlq.ops.backend import Backend

#: A breaker's states: closed, open (deliveries held; a pause too), half_open (one delivery probing).
BREAKER_STATES = B.STATES


@dataclass(frozen=True)
class BreakerRow:
    """One breaker as ``celery dlq breakers`` and the dashboard show it."""

    queue: str
    task: str
    group: str
    state: str
    exception: str
    failures: int
    opened_at: float | None
    probe_at: float | None
    cooldown: float
    paused_by: str
    held: int

    @classmethod
    def of(cls, s: B.BreakerState, held: int) -> BreakerRow:
        exception = f"{s.exception_type}: {s.message}" if s.exception_type else ""
        return cls(s.queue, s.task, s.group, s.state, exception, s.failures, s.opened_at or None,
                   s.next_probe if s.state != B.CLOSED and not s.paused_by else None, s.cooldown, s.paused_by, held)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class BreakerControls:
    """One app's breakers, for the operator (``backend``: its Redis)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.store = Breakers(backend.client, backend.keys, backend.clock, archive=backend.archive)

    def rows(self, task: str | None = None, queue: str | None = None) -> list[BreakerRow]:
        """Every breaker (of ``task``, on ``queue``), with how many deliveries it holds."""
        rows = []
        for s in self.store.all():
            if (task is None or s.task == task) and (queue is None or s.queue == queue):
                rows.append(BreakerRow.of(s, self.store.held_count(s.queue, s.group) + self._held_in_fetch(s)))
        return rows

    def _held_in_fetch(self, s: B.BreakerState) -> int:
        """What the fetch holds of the breaker's task on its queue (every queue for ``*``); 0 once closed."""
        if s.state == B.CLOSED:
            return 0
        return sum(self.store.held_in_fetch(s.queue, s.task).values())

    def pause(self, task: str, *, queue: str | None = None, group: str | None = None,
              actor: Actor | None = None) -> BreakerRow:
        """Hold ``task`` (or one failure ``group`` of it) on ``queue`` (None: every queue) until resumed; audited."""
        if not task:
            raise ValueError("pause needs a task name")
        actor = actor or Actor.of()
        change = self.store.pause(queue or B.ANY_QUEUE, task, group or B.whole_task(task), actor.who)
        assert change.after is not None
        Audit(self.backend).record("pause", actor, task=task, queue=queue, group=group)
        return BreakerRow.of(change.after, 0)

    def matching(self, task: str, *, queue: str | None = None, group: str | None = None) -> list[BreakerRow]:
        """The breakers of ``task`` that hold it now (a resume's selection)."""
        return [row for row in self.rows(task) if row.state != B.CLOSED
                and (queue is None or row.queue == queue) and (group is None or row.group == group)]

    def resume(self, task: str, *, queue: str | None = None, group: str | None = None,
               actor: Actor | None = None) -> tuple[int, int]:
        """Close every breaker of ``task`` that holds it (on ``queue``, of ``group``); returns (closed, released).
        Audited."""
        closed = released = 0
        for row in self.matching(task, queue=queue, group=group):
            change = self.store.resume(row.queue, row.group)
            if not change.changed:
                continue
            closed += 1
            policy = self.backend.settings.policy_for(task, None if row.queue == B.ANY_QUEUE else row.queue)
            released += self.store.release(self.backend.sharded, row.queue, row.group,
                                           policy.breaker.release_rate, policy.breaker.max_release_rate)
            released += self._release_held(row.queue, task)
        Audit(self.backend).record("resume", actor or Actor.of(), task=task, queue=queue, group=group,
                                   counts={"closed": closed, "released": released})
        return closed, released

    def _release_held(self, queue: str, task: str) -> int:
        """Push back at once what the fetch held of ``task`` on ``queue`` (``*``: every queue), onto each queue's
        lowest-priority list: the queue's other traffic goes first."""
        released = 0
        for (q, t), _ in self.store.held_in_fetch(queue, task).items():
            target = self.backend.lists.lowest(q)
            while (n := self.store.release_held(q, t, target)) > 0:
                released += n
        return released
