"""Failure groups as an operator reads them: per DLQ, merged across DLQs, and the letters in none.

The counts come from each DLQ's group index (:mod:`celery_dlq.storage.groups`),
kept by the scripts that push and remove dead letters; reading them is one
``HGETALL`` per DLQ plus its depth, never a pass over the letters. To act on
a group, select its letters with ``Filter(group=<id>)``: a replay or purge
then takes exactly the letters the count counted.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from celery_dlq.storage.groups import GroupStats

if TYPE_CHECKING:
    from celery_dlq.ops.backend import Backend


@dataclass(frozen=True)
class FailureGroup:
    """One failure group across every DLQ holding it (``dlqs``: DLQ -> its letters of the group)."""

    group_id: str
    count: int
    dlqs: dict[str, int]
    first: float | None
    last: float | None
    reasons: dict[str, int]
    arrivals: tuple[int, ...]
    task: str
    exception_type: str
    title: str
    sample_task_id: str
    sample_message: str
    sample_dlq: str
    #: Chords held open by the group's letters (members waiting for their replay, rule wait).
    chords_waiting: int = 0

    def as_dict(self) -> dict:
        return {"group": self.group_id, "count": self.count, "dlqs": dict(self.dlqs),
                "first_dead_lettered_at": self.first, "last_dead_lettered_at": self.last,
                "reasons": dict(self.reasons), "task_name": self.task, "exception_type": self.exception_type,
                "title": self.title, "sample_task_id": self.sample_task_id, "sample_dlq": self.sample_dlq,
                "sample_message": self.sample_message, "arrivals_per_hour": list(self.arrivals),
                "chords_waiting": self.chords_waiting}


@dataclass
class GroupReport:
    """Every group of the DLQs read, and per DLQ its depth and the letters no group counts."""

    per_dlq: dict[str, list[GroupStats]] = field(default_factory=dict)
    depths: dict[str, int] = field(default_factory=dict)
    #: Failure group id -> chords its waiting letters hold open (docs/workflows.md).
    chords_waiting: dict[str, int] = field(default_factory=dict)

    @property
    def ungrouped(self) -> dict[str, int]:
        """DLQ -> letters in no group (raw elements a worker could not decode, letters from before groups)."""
        counted = {dlq: sum(g.count for g in rows) for dlq, rows in self.per_dlq.items()}
        return {dlq: depth - counted.get(dlq, 0) for dlq, depth in self.depths.items()
                if depth - counted.get(dlq, 0) > 0}

    def merged(self) -> list[FailureGroup]:
        """The groups across DLQs, the largest first."""
        by_gid: dict[str, list[GroupStats]] = {}
        for rows in self.per_dlq.values():
            for row in rows:
                by_gid.setdefault(row.group_id, []).append(row)
        out = [_merge(gid, rows, self.chords_waiting.get(gid, 0)) for gid, rows in by_gid.items()]
        return sorted(out, key=lambda g: (-g.count, g.task, g.group_id))


def _merge(gid: str, rows: list[GroupStats], chords_waiting: int = 0) -> FailureGroup:
    latest = max(rows, key=lambda r: r.last or 0.0)
    reasons: Counter = Counter()
    for row in rows:
        reasons.update(row.reasons)
    firsts = [r.first for r in rows if r.first is not None]
    lasts = [r.last for r in rows if r.last is not None]
    arrivals = tuple(sum(values) for values in zip(*(r.arrivals for r in rows)))
    return FailureGroup(gid, sum(r.count for r in rows), {r.dlq: r.count for r in rows},
                        min(firsts) if firsts else None, max(lasts) if lasts else None, dict(sorted(reasons.items())),
                        arrivals, latest.task, latest.exception_type, latest.title, latest.sample_task_id,
                        latest.sample_message, latest.dlq, chords_waiting)


def read_groups(op: Backend, names: list[str]) -> GroupReport:
    """The groups and depths of the DLQs ``names``: two round trips, whatever their depth."""
    report = GroupReport()
    report.per_dlq = op.dlqs.groups(names, op.clock())
    report.depths = op.depths(names)
    report.chords_waiting = op.chords.held_open(names)
    return report
