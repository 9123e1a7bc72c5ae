"""Reading a replay plan with pyarrow alone: ``celery dlq replay --plan DIR`` needs no JVM.

The report writes ``OUT/replay_plan/``::

    manifest.json   {"version", "created_at", "as_of", "source", "predicates", "counts", "by_dlq", "entries"}
    entries/        Parquet, one row per dead letter to replay, oldest first:
                    task_id, task_name, queue (original), dlq, exception_type, reason,
                    delivery, dead_lettered_at (timestamp, UTC), payload_hash, event_id

The manifest is written last and removed first when a plan is rewritten, so
a plan whose report died midway has none and is refused; so is one whose
entries do not add up to the manifest's ``counts.selected``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from celery_dlq.errors import DLQError
from celery_dlq.export import filesystem, read_bytes

PLAN_DIR = "replay_plan"
MANIFEST = "manifest.json"
ENTRIES = "entries"
PLAN_VERSION = 1


class PlanError(DLQError):
    """No usable replay plan at that path."""


@dataclass(frozen=True)
class PlanEntry:
    """One dead letter to replay. ``dead_lettered_at`` is unix seconds."""

    task_id: str
    dlq: str
    queue: str | None
    task_name: str | None
    exception_type: str | None
    reason: str | None
    delivery: int | None
    dead_lettered_at: float | None
    payload_hash: str | None


@dataclass(frozen=True)
class ReplayPlan:
    path: str
    manifest: dict[str, Any]
    entries: tuple[PlanEntry, ...]

    def by_dlq(self) -> dict[str, list[str]]:
        """DLQ name -> task ids to replay from it, oldest dead letter first."""
        out: dict[str, list[str]] = {}
        for entry in self.entries:
            out.setdefault(entry.dlq, []).append(entry.task_id)
        return out

    def task_ids(self) -> list[str]:
        return [entry.task_id for entry in self.entries]


def _plan_root(fs: pafs.FileSystem, path: str) -> str:
    """``path`` itself, or ``path/replay_plan`` when given a report's output directory."""
    for root in (path.rstrip("/"), f"{path.rstrip('/')}/{PLAN_DIR}"):
        if fs.get_file_info(f"{root}/{MANIFEST}").type == pafs.FileType.File:
            return root
    raise PlanError(f"no replay plan at {path}: expected {MANIFEST} there or in {PLAN_DIR}/ "
                    "(a report that did not finish leaves none)")


def load_plan(path: str) -> ReplayPlan:
    """The plan at ``path`` (the ``replay_plan`` directory or the report's ``--out``; any pyarrow URI)."""
    fs, local = filesystem(path)
    root = _plan_root(fs, local)
    try:
        manifest = json.loads(read_bytes(fs, f"{root}/{MANIFEST}") or b"")
    except ValueError as exc:
        raise PlanError(f"unreadable {root}/{MANIFEST}: {exc}") from None
    if manifest.get("version") != PLAN_VERSION:
        raise PlanError(f"{root}/{MANIFEST}: unsupported plan version {manifest.get('version')!r}")
    table = pq.read_table(f"{root}/{manifest.get('entries', ENTRIES)}", filesystem=fs)
    at = table.column("dead_lettered_at").cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_pylist()
    rows = table.drop_columns(["dead_lettered_at"]).to_pylist()
    entries = tuple(PlanEntry(task_id=r["task_id"], dlq=r["dlq"], queue=r.get("queue"), task_name=r.get("task_name"),
                              exception_type=r.get("exception_type"), reason=r.get("reason"),
                              delivery=r.get("delivery"), dead_lettered_at=None if us is None else us / 1e6,
                              payload_hash=r.get("payload_hash"))
                    for r, us in zip(rows, at))
    expected = (manifest.get("counts") or {}).get("selected")
    if expected != len(entries):
        raise PlanError(f"{root}: {len(entries)} entries but the manifest says {expected}: rerun the report")
    return ReplayPlan(path=root, manifest=manifest, entries=entries)


def plan_task_ids(path: str) -> dict[str, list[str]]:
    """DLQ name -> task ids of the plan at ``path`` (what ``replay --plan`` replays)."""
    return load_plan(path).by_dlq()
