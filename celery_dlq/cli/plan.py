"""``celery dlq replay --plan DIR``: replay what a report's replay plan selected.

The plan is read with pyarrow only (``celery_dlq.analytics.plan``), never a
JVM, and replayed by :class:`celery_dlq.ops.plan.PlanReplay` (every DLQ it
names checked before anything moves, then one pass over each); this module
prints what happened.
"""
from __future__ import annotations

from typing import Any

import click
from kombu.utils.url import maybe_sanitize_url

from celery_dlq.cli.base import EXIT_FAILED, EXIT_USAGE, Failure, operator
from celery_dlq.cli.output import echo_outcome, n_of, progress
from celery_dlq.ops import PlanError, PlanReplay, ReplayIntoItself
from celery_dlq.ops.audit import Actor, Audit, outcome_counts


def refuse_with_plan(ctx: click.Context, task_ids: tuple[str, ...], everything: bool, limit: int | None,
                      filters: dict) -> None:
    """A plan is the whole selection: another selection next to it would be ambiguous, so it is a usage error."""
    given = ["TASK_ID..."] if task_ids else []
    given += [param.opts[0] for param in ctx.command.params
              if (param.name in filters and filters[param.name] is not None)
              or (param.name == "everything" and everything) or (param.name == "limit" and limit is not None)]
    if given:
        raise click.UsageError(f"--plan selects the dead letters itself: drop {', '.join(given)}")


def load_plan_at(path: str) -> Any:
    """The replay plan at ``path``, read with pyarrow alone (never pyspark, so never a JVM).

    A missing, unfinished or unreadable plan is a usage error (exit 2) in one
    line; the path is shown sanitized, as it may be a URI with credentials.
    """
    try:
        import pyarrow as pa

        from celery_dlq.analytics.plan import load_plan
    except ImportError as exc:  # pyarrow is in the spark extra
        raise Failure(f"{exc}: reading a replay plan needs pyarrow: pip install 'celery-dlq[spark]'") from None
    try:
        return load_plan(path)
    except PlanError as exc:
        raise Failure(_one_line(exc), EXIT_USAGE) from None
    except (OSError, pa.ArrowException) as exc:
        where = maybe_sanitize_url(path)
        raise Failure(f"cannot read a replay plan at {where}: {_one_line(exc)}", EXIT_USAGE) from None


def _one_line(exc: BaseException) -> str:
    """An error as one line: pyarrow's messages may span several."""
    return " ".join(str(exc).split())


def replay_plan(ctx: click.Context, path: str, only: str | None, *, to: str | None, rate: float | None,
                dry_run: bool, why: str | None = None) -> None:
    """``replay --plan``: every DLQ of the plan (or ``only``), checked first, then replayed in one pass each."""
    plan = load_plan_at(path)
    try:
        replay = PlanReplay(operator(ctx), plan.by_dlq(), only=only, to=to)
    except (PlanError, ReplayIntoItself) as exc:
        raise Failure(str(exc), EXIT_USAGE) from None
    counts, planned = replay.counts(), replay.planned
    click.echo(f"Replay plan {maybe_sanitize_url(plan.path)}: {n_of(planned, 'dead letter')}"
               + (f" from {', '.join(f'{name} ({n})' for name, n in counts.items())}" if counts else "")
               + f"; report of {plan.manifest.get('created_at', '?')}.")
    if not planned:
        return click.echo("The plan selects no dead letters: nothing to replay.")
    short = 0
    for name, expected in counts.items():
        with progress(f"replaying {name}", expected) as advance:
            out = replay.replay(name, rate=rate, dry_run=dry_run, progress=advance)
        if not dry_run:
            Audit(operator(ctx)).record("replay", Actor.of(why=why), dlq=name, selection={"plan": maybe_sanitize_url(
                plan.path), "planned": expected}, counts=outcome_counts(out), to=to)
        echo_outcome(name, out, "Replayed", planned=expected)
        short += replay.shortfall(out)
    if short:
        verb = "would not be" if dry_run else "were not"
        raise Failure(f"{short} of {n_of(planned, 'planned dead letter')} {verb} replayed", EXIT_FAILED)
