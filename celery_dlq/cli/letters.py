"""The verbs over dead letters: ``queues``, ``list``, ``show``, ``replay``, ``purge``.

Thin over :mod:`celery_dlq.ops`. Human output is rich tables; every read
verb takes ``--json`` (a JSON array, streamed). A progress bar shows on
replays and purges when stdout is a terminal. ``replay --plan`` is
:mod:`celery_dlq.cli.plan`.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import click
from celery.bin.base import CeleryCommand

from celery_dlq import headers as H
from celery_dlq.cli.base import EXIT_FAILED, Failure, confirm, dlq, operator
from celery_dlq.cli.edit import replay_edited_letter
from celery_dlq.cli.options import filter_options, json_option, make_filter, make_selection, why_option
from celery_dlq.cli.output import at, console, cut, echo_json, echo_outcome, n_of, print_table, progress, workflow_line
from celery_dlq.cli.plan import refuse_with_plan, replay_plan
from celery_dlq.ops import DeadLetter, DeadLetterQueue, Filter, Outcome, Selector, TaskIds
from celery_dlq.ops.audit import Actor, Audit, outcome_counts


@dlq.command(cls=CeleryCommand)
@json_option
@click.pass_context
def queues(ctx: click.Context, as_json: bool) -> None:
    """Dead-letter queues, their depth, and the retries parked for their queues."""
    rows = operator(ctx).queues()
    if as_json:
        return echo_json(row.as_dict() for row in rows)
    print_table(None, ["DLQ", "queue", "dead letters", "parked"],
                ((row.name or "(dropped)", row.queue or "-", row.dead_letters, row.parked) for row in rows))


@dlq.command(name="list", cls=CeleryCommand)
@click.argument("queue")
@filter_options
@click.option("--limit", type=click.IntRange(min=0), default=100, show_default=True, help="0: no limit.")
@json_option
@click.pass_context
def list_(ctx: click.Context, queue: str, limit: int, as_json: bool, **filters: Any) -> None:
    """Dead letters of QUEUE (a DLQ, or the queue it serves), oldest first."""
    where = make_filter(**filters)
    dead = operator(ctx).queue(queue)
    shown = [0]

    def letters() -> Iterator[DeadLetter]:
        for letter in dead.entries(where, limit=limit or None):
            shown[0] += 1
            yield letter

    if as_json:
        echo_json(letter.as_dict() for letter in letters())
    else:
        rows = ((letter.task_id or "?", letter.task_name or "?", letter.header(H.REASON) or "-",
                 letter.delivery_count or "-", at(letter.dead_lettered_at), cut(_exception(letter)))
                for letter in letters())
        print_table(f"{dead.name}: {n_of(dead.depth(), 'dead letter')} (sizes, args and headers: --json or show)",
                    ["task id", "task", "reason", "deliveries", "dead-lettered at", "exception"], rows,
                    keep={"task id", "task", "reason", "deliveries", "dead-lettered at"})
    if where is not None and not shown[0]:  # an empty DLQ is a fact; a filter matching nothing is a miss
        raise Failure(f"nothing matched in {dead.name}")


def _exception(letter: DeadLetter) -> str:
    kind, message = letter.header(H.EXCEPTION_TYPE), letter.header(H.EXCEPTION_MESSAGE)
    return f"{kind}: {message}" if kind else str(message or "-")


@dlq.command(cls=CeleryCommand)
@click.argument("task_id")
@click.option("-Q", "--queue", help="Look only in this DLQ (default: every DLQ).")
@json_option
@click.pass_context
def show(ctx: click.Context, task_id: str, queue: str | None, as_json: bool) -> None:
    """Every detail of the dead letter(s) of TASK_ID."""
    op = operator(ctx)
    names = [op.queue(queue).name] if queue else sorted(op.known())
    found = [letter for name in names for letter in DeadLetterQueue(op, name).entries(Filter(task_id=task_id))]
    if not found:
        raise Failure(f"nothing matched: no dead letter with task id {task_id!r} in {', '.join(names) or 'any DLQ'}")
    if as_json:
        return echo_json(op.details(letter) for letter in found)
    for letter in found:
        _print_letter(letter, op.details(letter))


def _print_letter(letter: DeadLetter, d: dict) -> None:
    rows = [(name, cut(d[name], 300)) for name in (
        "task_id", "original_queue", "reason", "delivery_count", "exception_type", "exception_message",
        "worker", "replay_count", "priority", "content_type", "size")]
    rows.append(("dead_lettered_at", at(d["dead_lettered_at"])))
    if d.get("workflow"):
        rows.append(("workflow", workflow_line(d["workflow"])))
    if d["decoded"]:
        rows += [("args", cut(repr(d["args"]), 500)), ("kwargs", cut(repr(d["kwargs"]), 500))]
    else:
        more = "…" if len(letter.body) > 200 else ""
        rows.append(("body", f"not decoded ({d['content_type']} is not in accept_content): "
                              f"{letter.body[:200]!r}{more}"))
        rows += [(f"{name} (sender's)", cut(letter.headers[name], 500))
                 for name in ("argsrepr", "kwargsrepr") if letter.headers.get(name) is not None]
    rows += [(name, cut(value, 300)) for name, value in sorted(d["headers"].items()) if name != "x-dlq-traceback"]
    print_table(f"{d['task_name']} in {d['dead_letter_queue']}", ["field", "value"], rows, keep={"field"})
    console().print(d["headers"].get("x-dlq-traceback") or "(no traceback)", markup=False, highlight=False)


def _total(dead: DeadLetterQueue, where: Selector | None, limit: int | None) -> int | None:
    """The progress bar's total: every dead letter, or one per id (at most); unknown for a filter."""
    if where is None:
        depth = dead.depth()
    elif isinstance(where, TaskIds) and not where.every:
        depth = len(where)
    else:
        return None
    return min(depth, limit) if limit else depth


@dlq.command(cls=CeleryCommand)
@click.argument("queue", required=False)
@click.argument("task_ids", nargs=-1)
@filter_options
@click.option("--all", "everything", is_flag=True, help="Every dead letter of QUEUE (when no id or filter).")
@click.option("--plan", "plan_path", metavar="DIR",
              help="Replay what a report's replay plan selected: DIR is `dlq report --out` or its replay_plan/ "
                   "(a path or pyarrow URI). QUEUE is then optional and limits it to that DLQ.")
@click.option("--to", help="Deliver to this queue instead of each message's original queue.")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), help="At most this many messages/s.")
@click.option("--limit", type=click.IntRange(min=1), help="At most this many messages.")
@click.option("--dry-run", is_flag=True, help="Say what would be replayed; move nothing.")
@why_option
@click.option("--args", "new_args", metavar="JSON", help="Edit: replay the one letter of ID with these args "
              "(a JSON array).")
@click.option("--kwargs", "new_kwargs", metavar="JSON", help="Edit: replay it with these kwargs (a JSON object).")
@click.option("--header", "new_headers", multiple=True, metavar="K=V",
              help="Edit: replay it with this header set (V read as JSON when it is JSON). Repeatable.")
@click.pass_context
def replay(ctx: click.Context, queue: str | None, task_ids: tuple[str, ...], everything: bool,
           plan_path: str | None, to: str | None, rate: float | None, limit: int | None, dry_run: bool,
           why: str | None, new_args: str | None, new_kwargs: str | None, new_headers: tuple[str, ...],
           **filters: Any) -> None:
    """Send dead letters of QUEUE back to their original queue, delivery count reset.

    Each message moves atomically: interrupted, run it again; none is lost or
    delivered twice. By task id only the oldest dead letter of each id moves;
    the DLQ is read once for all the ids, so --rate paces them.
    With --plan DIR, exactly the dead letters a `dlq report` replay plan
    selected move (read with pyarrow, no JVM); ids, filters, --all and
    --limit do not combine with it.
    """
    if new_args is not None or new_kwargs is not None or new_headers:
        return replay_edited_letter(ctx, queue, task_ids, to=to, why=why, args=new_args, kwargs=new_kwargs,
                                    headers=new_headers)
    if plan_path is not None:
        refuse_with_plan(ctx, task_ids, everything, limit, filters)
        return replay_plan(ctx, plan_path, queue, to=to, rate=rate, dry_run=dry_run, why=why)
    if queue is None:
        raise click.UsageError("say which DLQ: QUEUE, or --plan DIR")
    selection = make_selection(task_ids, everything, filters)
    where = selection.selector()
    dead = operator(ctx).queue(queue)
    with progress(f"replaying {dead.name}", _total(dead, where, limit)) as advance:
        out = dead.replay(where, to=to, limit=limit, rate=rate, dry_run=dry_run, progress=advance)
    if not dry_run:
        Audit(dead.op).record("replay", Actor.of(why=why), dlq=dead.name, selection=selection,
                              counts=outcome_counts(out), to=to)
    _report(dead.name, out, "Replayed")


@dlq.command(cls=CeleryCommand)
@click.argument("queue")
@click.argument("task_ids", nargs=-1)
@filter_options
@click.option("--all", "everything", is_flag=True, help="Every dead letter of QUEUE (when no id or filter).")
@click.option("-f", "--force", is_flag=True, help="Delete without asking. There is no undo.")
@why_option
@click.pass_context
def purge(ctx: click.Context, queue: str, task_ids: tuple[str, ...], everything: bool, force: bool,
          why: str | None, **filters: Any) -> None:
    """Delete dead letters of QUEUE for good (asks first, unless --force).

    By task id, every dead letter of that id goes.
    """
    selection = make_selection(task_ids, everything, filters)
    where = selection.selector(every=True)
    dead = operator(ctx).queue(queue)
    if not force:
        confirm(f"delete {n_of(dead.count(where), 'dead letter')} from {dead.name}")
    with progress(f"purging {dead.name}", _total(dead, where, None)) as advance:
        out = dead.purge(where, force=True, progress=advance)
    Audit(dead.op).record("purge", Actor.of(why=why), dlq=dead.name, selection=selection,
                          counts=outcome_counts(out))
    _report(dead.name, out, "Deleted")


def _report(name: str, out: Outcome, verb: str) -> None:
    """One summary line (plus missing, not found and failed ones); exit 1 when nothing matched or some failed."""
    if not out.matched:
        raise Failure(f"nothing matched in {name}")
    echo_outcome(name, out, verb)
    if out.failed:
        raise Failure(f"{n_of(len(out.failed), 'dead letter')} could not be handled", EXIT_FAILED)
