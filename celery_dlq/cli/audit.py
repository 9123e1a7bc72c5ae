"""``celery dlq audit``: who replayed, purged, edited, paused, resumed or cancelled what, deleted or redelivered
which parked retries, revoked whose sessions, when and why.

Thin over :mod:`celery_dlq.ops.audit`; newest first, the privileged actions' stream and the others' merged.
"""
from __future__ import annotations

import click
from celery.bin.base import CeleryCommand

from celery_dlq.cli.base import dlq, operator
from celery_dlq.cli.options import json_option
from celery_dlq.cli.output import at, cut, echo_json, print_table
from celery_dlq.ops.audit import Audit


def _what(record: dict) -> str:
    selection = record.get("selection") or {}
    what = selection.get("described") or ("plan " + str(selection["plan"]) if selection.get("plan") else "")
    if record.get("revoked_user"):
        what = f"sessions of {record['revoked_user']}"
    if record.get("job_id"):
        what = f"job {record['job_id']}" + (f": {what}" if what else "")
    return what


def _counts(record: dict) -> str:
    counts = record.get("counts") or {}
    return ", ".join(f"{name} {counts[name]}" for name in ("done", "missing", "failed", "not_found")
                     if counts.get(name))


@dlq.command(cls=CeleryCommand)
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@json_option
@click.pass_context
def audit(ctx: click.Context, limit: int, as_json: bool) -> None:
    """The audit trail of operator actions, newest first: who, when, what, why, and the counts."""
    rows = Audit(operator(ctx)).recent(limit)
    if as_json:
        return echo_json(rows)
    print_table(None, ["when", "who", "action", "DLQ", "what", "counts", "why"],
                ((at(r.get("at")), r.get("who", ""), r.get("action", ""), r.get("dlq") or "-", cut(_what(r), 80),
                  _counts(r) or "-", cut(r.get("why") or "", 80)) for r in rows), keep={"when", "who", "action"})
