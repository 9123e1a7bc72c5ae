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

from celery_dlq.analytics.fs import filesystem, read_bytes
from celery_dlq.errors import PlanError

PLAN_DIR = "replay_plan"
MANIFEST = "manifest.json"
ENTRIES = "entries"
PLAN_VERSION = 1
#: Columns a replay needs; a table without them is not a plan, whatever its manifest says.
REQUIRED_COLUMNS = ("task_id", "dlq", "dead_lettered_at")


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


def _read_entries(fs: pafs.FileSystem, path: str) -> pa.Table:
    """The entries table; missing, unreadable or without the replay's columns is a :class:`PlanError`.

    So every way a plan can be broken reaches the caller as one error type
    (``replay --plan`` turns it into one line and exit code 2).
    """
    try:
        table = pq.read_table(path, filesystem=fs)
    except (OSError, pa.ArrowException) as exc:
        raise PlanError(f"unreadable replay plan entries at {path}: {exc}") from None
    missing = [name for name in REQUIRED_COLUMNS if name not in table.column_names]
    if missing:
        raise PlanError(f"{path}: no column {', '.join(missing)}: not replay plan entries")
    return table


def load_plan(path: str) -> ReplayPlan:
    """The plan at ``path`` (the ``replay_plan`` directory or the report's ``--out``; any pyarrow URI)."""
    fs, local = filesystem(path)
    root = _plan_root(fs, local)
    try:
        manifest = json.loads(read_bytes(fs, f"{root}/{MANIFEST}") or b"")
    except ValueError as exc:
        raise PlanError(f"unreadable {root}/{MANIFEST}: {exc}") from None
    if not isinstance(manifest, dict):
        raise PlanError(f"{root}/{MANIFEST} is not a replay plan manifest (a JSON object)")
    if manifest.get("version") != PLAN_VERSION:
        raise PlanError(f"{root}/{MANIFEST}: unsupported plan version {manifest.get('version')!r}")
    table = _read_entries(fs, f"{root}/{manifest.get('entries', ENTRIES)}")
    at = table.column("dead_lettered_at").cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_pylist()
    rows = table.drop_columns(["dead_lettered_at"]).to_pylist()
    entries = tuple(PlanEntry(task_id=r["task_id"], dlq=r["dlq"], queue=r.get("queue"), task_name=r.get("task_name"),
                              exception_type=r.get("exception_type"), reason=r.get("reason"),
                              delivery=r.get("delivery"), dead_lettered_at=None if us is None else us / 1e6,
                              payload_hash=r.get("payload_hash"))
                    for r, us in zip(rows, at))
    if any(not entry.task_id or not entry.dlq for entry in entries):
        raise PlanError(f"{root}: an entry has no task id or no DLQ: rerun the report")
    counts = manifest.get("counts")
    expected = counts.get("selected") if isinstance(counts, dict) else None
    if expected != len(entries):
        raise PlanError(f"{root}: {len(entries)} entries but the manifest says {expected}: rerun the report")
    return ReplayPlan(path=root, manifest=manifest, entries=entries)


def plan_task_ids(path: str) -> dict[str, list[str]]:
    """DLQ name -> task ids of the plan at ``path`` (what ``replay --plan`` replays)."""
    return load_plan(path).by_dlq()
