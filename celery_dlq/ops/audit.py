"""Who did what to which dead letters, when and why: the audit trail of every operator action.

Every replay, purge, edit, every job's start, pause, resume and cancel, every parked retry deleted or
redelivered by hand and every session revoke is recorded by :meth:`Audit.record` with an :class:`Actor`:
who (the dashboard's user; ``user@host`` of the OS for the CLI; a name given through the Python API, by
default the OS one too) and why (``--reason``). The record holds the selection and the counts; it goes
to one of two capped streams (privileged actions apart, so cheap ones cannot evict them) and to the
archive (``storage/audit.py``), and reads back newest first, both streams merged (``celery dlq audit``,
the dashboard's audit page). A record that cannot be written raises :class:`AuditNotWritten`: the
action is refused (when it is recorded first) or reported as unaudited, never silently carried on.
"""
from __future__ import annotations

import getpass
import socket
from dataclasses import dataclass
from typing import Any

from celery_dlq.ops.selection import PARAMS, Selection
from celery_dlq.storage.audit import AuditNotWritten, AuditTrail

__all__ = ["ACTIONS", "Actor", "Audit", "AuditNotWritten", "os_identity", "outcome_counts", "selection_dict"]

#: What the trail records.
ACTIONS = ("replay", "purge", "edit", "start", "pause", "resume", "cancel", "stop", "redeliver", "delete", "revoke")


def os_identity() -> str:
    """``user@host`` of this process: who a CLI or Python caller is when it gives no name."""
    try:
        user = getpass.getuser()
    except Exception:   # no user name in the environment or the password database
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


@dataclass(frozen=True)
class Actor:
    """Who takes an action and why (``why`` may be empty, except where the dashboard requires it)."""

    who: str
    why: str = ""

    @classmethod
    def of(cls, who: str | None = None, why: str | None = None) -> Actor:
        """``who`` (default: :func:`os_identity`) and ``why``."""
        return cls((who or "").strip() or os_identity(), (why or "").strip())


def selection_dict(selection: Selection | None) -> dict:
    """A selection as JSON: ``ids``, ``filter`` (``PARAMS`` names), ``all``; what jobs and the trail store."""
    if selection is None:
        return {}
    where = selection.where
    names = {field: param for param, field in PARAMS.items()}
    filters = {names[f]: getattr(where, f) for f in names if where is not None and getattr(where, f) is not None}
    return {"ids": list(selection.ids), "filter": filters, "all": selection.everything,
            "described": selection.describe()}


def outcome_counts(out: Any) -> dict:
    """The counts of a replay's or purge's :class:`~celery_dlq.ops.queue.Outcome` (not imported here: the queue
    module reaches the backend, whose parked retries are audited, so the import would run in a circle)."""
    return {"matched": out.matched, "done": out.done, "missing": out.missing, "failed": len(out.failed),
            "not_found": len(out.not_found), "dry_run": out.dry_run}


class Audit:
    """One app's audit trail (the home key set's), written and read."""

    def __init__(self, op: Any) -> None:
        """``op``: a :class:`~celery_dlq.ops.backend.Backend` (its ``client``, ``keys``, ``archive`` and ``clock``;
        not imported here: the backend's parked retries are audited, so the import would run in a circle)."""
        self.op = op
        self.trail = AuditTrail(op.client, op.keys, op.archive)

    def record(self, action: str, actor: Actor, *, dlq: str | None = None, selection: Selection | dict | None = None,
               counts: dict | None = None, **extra: Any) -> dict:
        """Record ``action`` by ``actor``; returns the record with its stream ``id``. :class:`AuditNotWritten` when
        it cannot be written."""
        if action not in ACTIONS:
            raise ValueError(f"unknown audited action {action!r} (actions: {', '.join(ACTIONS)})")
        record = {"action": action, "at": self.op.clock(), "who": actor.who, "why": actor.why, "dlq": dlq,
                  "selection": selection if isinstance(selection, dict) else selection_dict(selection),
                  "counts": counts or {}, **extra}
        entry_id = self.trail.append(record)
        return {**record, "id": entry_id}

    def recent(self, count: int = 100, before: str | None = None) -> list[dict]:
        """The newest ``count`` records, newest first."""
        return self.trail.read(count, before)
