"""``celery dlq replay --plan DIR``: replay what a report's replay plan selected.

The plan is read with pyarrow only (``celery_dlq.analytics.plan``), never a
JVM. Every DLQ it names is checked before anything moves; each DLQ is then
read once, oldest first, replaying the oldest dead letter of each planned
task id (:class:`~celery_dlq.ops.letters.TaskIds`, as ``replay QUEUE ID...``
does).
"""
from __future__ import annotations

from typing import Any

import click
from kombu.utils.url import maybe_sanitize_url

from celery_dlq.cli.base import EXIT_FAILED, EXIT_USAGE, Failure, operator
from celery_dlq.cli.output import echo_outcome, n_of, progress
from celery_dlq.errors import PlanError, UnknownQueue
from celery_dlq.ops.letters import TaskIds
from celery_dlq.ops.operator import Operator
from celery_dlq.ops.queue import DeadLetterQueue


def refuse_with_plan(ctx: click.Context, task_ids: tuple[str, ...], everything: bool, limit: int | None,
                      filters: dict) -> None:
    """A plan is the whole selection: another selection next to it would be ambiguous, so it is a usage error."""
    given = ["TASK_ID..."] if task_ids else []
    given += [param.opts[0] for param in ctx.command.params
              if (param.name in filters and filters[param.name] is not None)
              or (param.name == "everything" and everything) or (param.name == "limit" and limit is not None)]
    if given:
        raise click.UsageError(f"--plan selects the dead letters itself: drop {', '.join(given)}")


def _load_plan(path: str) -> Any:
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


def _plan_queue(op: Operator, name: str, to: str | None) -> DeadLetterQueue:
    """The DLQ a plan names, checked before anything moves.

    It must be a dead-letter queue (configured, or DLQ-shaped): a plan never
    replays from a live queue. One that is unknown because it is empty now is
    accepted: its planned dead letters are then reported missing, not a usage error.
    """
    if to == name:
        raise Failure(f"cannot replay {name} into itself (--to {to})", EXIT_USAGE)
    try:
        dead = op.queue(name)
    except UnknownQueue:
        if op.depth(name):
            raise Failure(f"the plan names {name!r}, which is not a dead-letter queue here", EXIT_USAGE) from None
        return DeadLetterQueue(op, name)
    if dead.name != name:  # ``name`` is a live queue whose DLQ is ``dead.name``
        raise Failure(f"the plan names {name!r}, which is not a dead-letter queue here", EXIT_USAGE)
    return dead


def replay_plan(ctx: click.Context, path: str, only: str | None, *, to: str | None, rate: float | None,
                 dry_run: bool) -> None:
    """``replay --plan``: every DLQ of the plan (or ``only``), checked first, then replayed in one pass each."""
    plan = _load_plan(path)
    by_dlq = {name: list(dict.fromkeys(ids)) for name, ids in plan.by_dlq().items()}
    op = operator(ctx)
    if only is not None:
        name = op.queue(only).name
        if name not in by_dlq:
            raise Failure(f"nothing matched: the plan selects nothing from {name} "
                          f"(it names {', '.join(sorted(by_dlq)) or 'no DLQ'})")
        by_dlq = {name: by_dlq[name]}
    queues = {name: _plan_queue(op, name, to) for name in by_dlq}
    planned = sum(len(ids) for ids in by_dlq.values())
    click.echo(f"Replay plan {maybe_sanitize_url(plan.path)}: {n_of(planned, 'dead letter')}"
               + (f" from {', '.join(f'{name} ({len(ids)})' for name, ids in by_dlq.items())}" if by_dlq else "")
               + f"; report of {plan.manifest.get('created_at', '?')}.")
    if not planned:
        return click.echo("The plan selects no dead letters: nothing to replay.")
    short = 0
    for n, (name, dead) in enumerate(queues.items()):
        if n and rate:  # the next DLQ's first message keeps the pace too
            dead.sleep(1 / rate)
        short += _replay_planned(dead, TaskIds(by_dlq[name]), to=to, rate=rate, dry_run=dry_run)
    if short:
        verb = "would not be" if dry_run else "were not"
        raise Failure(f"{short} of {n_of(planned, 'planned dead letter')} {verb} replayed", EXIT_FAILED)


def _replay_planned(dead: DeadLetterQueue, wanted: TaskIds, *, to: str | None, rate: float | None,
                    dry_run: bool) -> int:
    """Replay one DLQ's share of a plan and report it; returns how many were not (missing or failed).

    One pass over the DLQ: ``wanted`` selects the oldest dead letter of each planned id, once; the
    ids it never selected are those no longer in the DLQ.
    """
    expected = len(wanted)
    with progress(f"replaying {dead.name}", expected) as advance:
        out = dead.replay(wanted, to=to, limit=expected, rate=rate, dry_run=dry_run, progress=advance)
    if out.matched:
        echo_outcome(dead.name, out, "Replayed")
    not_found = wanted.missing
    if not_found:
        click.echo(f"{len(not_found)} of {n_of(expected, 'planned dead letter')} no longer in "
                   f"{dead.name} (replayed, purged or trimmed since the report): {', '.join(not_found[:20])}"
                   + (", …" if len(not_found) > 20 else ""))
    return len(not_found) + out.missing + len(out.failed)
