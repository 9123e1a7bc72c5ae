"""Replaying what a report's replay plan selected: every DLQ it names checked first, then one pass over each.

The plan is read by :mod:`celery_dlq.analytics.plan` (pyarrow, no JVM) into
DLQ -> task ids; :class:`PlanReplay` takes that mapping, so the CLI (``celery
dlq replay --plan``) or any caller with a plan in hand replays it the same
way. Each DLQ is read once, oldest first, replaying the oldest dead letter
of each planned id (:class:`~celery_dlq.ops.letters.TaskIds`); the ids not
found are each DLQ's ``Outcome.not_found``.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from celery_dlq.errors import DLQError, PlanError, UnknownQueue
from celery_dlq.ops.letters import TaskIds
from celery_dlq.ops.queue import DeadLetterQueue, Outcome, refuse_self_replay

if TYPE_CHECKING:
    from celery_dlq.ops.operator import Operator


class NotInPlan(DLQError):
    """The DLQ asked for (``only``) is not one the plan replays from: nothing matched."""


class PlanReplay:
    """A plan's DLQs, each checked against this app before anything moves, and their replay.

    ``by_dlq`` is DLQ name -> task ids, oldest first (``ReplayPlan.by_dlq()``);
    ``only`` keeps one DLQ's share (a DLQ or the queue it serves). A name that
    is a live queue, or shaped like no DLQ and not empty, is a
    :class:`~celery_dlq.errors.PlanError`: a plan never replays from a live
    queue. One unknown because it is empty now is kept: its letters are then
    not found, which is no usage error.
    """

    def __init__(self, op: Operator, by_dlq: Mapping[str, Iterable[str]], *, only: str | None = None,
                 to: str | None = None) -> None:
        plan = {name: list(dict.fromkeys(ids)) for name, ids in by_dlq.items()}
        if only is not None:
            name = op.queue(only).name
            if name not in plan:
                raise NotInPlan(f"nothing matched: the plan selects nothing from {name} "
                                f"(it names {', '.join(sorted(plan)) or 'no DLQ'})")
            plan = {name: plan[name]}
        self.to = to
        self.shares = {name: (_plan_queue(op, name, to), TaskIds(ids)) for name, ids in plan.items()}
        self._replayed = 0

    @property
    def planned(self) -> int:
        """Dead letters the plan (or ``only``'s share of it) asks for."""
        return sum(len(ids) for _, ids in self.shares.values())

    def counts(self) -> dict[str, int]:
        """DLQ -> how many of its dead letters are planned."""
        return {name: len(ids) for name, (_, ids) in self.shares.items()}

    def replay(self, name: str, *, rate: float | None = None, dry_run: bool = False,
               progress: Callable[[int], None] | None = None) -> Outcome:
        """Replay DLQ ``name``'s share in one pass; with ``rate``, the pace holds across DLQs too."""
        dead, ids = self.shares[name]
        if self._replayed and rate:   # the next DLQ's first message keeps the pace
            dead.sleep(1 / rate)
        self._replayed += 1
        return dead.replay(ids, to=self.to, limit=len(ids), rate=rate, dry_run=dry_run, progress=progress)

    @staticmethod
    def shortfall(out: Outcome) -> int:
        """Planned letters one DLQ's replay did not replay: not found, gone meanwhile, or failed."""
        return len(out.not_found) + out.missing + len(out.failed)


def _plan_queue(op: Operator, name: str, to: str | None) -> DeadLetterQueue:
    """The DLQ ``name`` a plan names, checked (see :class:`PlanReplay`)."""
    refuse_self_replay(name, to)
    try:
        dead = op.queue(name)
    except UnknownQueue:
        if op.depth(name):
            raise PlanError(f"the plan names {name!r}, which is not a dead-letter queue here") from None
        return DeadLetterQueue(op, name)
    if dead.name != name:  # ``name`` is a live queue whose DLQ is ``dead.name``
        raise PlanError(f"the plan names {name!r}, which is not a dead-letter queue here")
    return dead
