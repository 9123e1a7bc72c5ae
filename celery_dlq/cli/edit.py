"""``replay ID --args/--kwargs/--header``: one dead letter replayed edited, its original kept in the audit.

Thin over :mod:`celery_dlq.ops.edit`: the JSON is read and checked there, the body re-encoded only
with its own serializer within ``accept_content``, and the move is the one replay of ``ops/queue.py``.
"""
from __future__ import annotations

import click

from celery_dlq.cli.base import Failure, operator
from celery_dlq.cli.output import echo_outcome
from celery_dlq.ops import DeadLetterQueue, Filter
from celery_dlq.ops.audit import Actor
from celery_dlq.ops.edit import BadEdit, Edit, parse_headers, parse_json, replay_edited


def replay_edited_letter(ctx: click.Context, queue: str | None, task_ids: tuple[str, ...], *, to: str | None,
                         why: str | None, args: str | None, kwargs: str | None, headers: tuple[str, ...]) -> None:
    """The edited replay of one letter: ``QUEUE ID`` or ``ID`` alone (every DLQ searched for it)."""
    ids = [*([queue] if queue else []), *task_ids]
    if len(ids) not in (1, 2):
        raise click.UsageError("an edited replay takes one dead letter: [QUEUE] ID with --args/--kwargs/--header")
    op = operator(ctx)
    task_id = ids[-1]
    try:
        edit = Edit(task_id, args=None if args is None else parse_json(args, "--args", list),
                    kwargs=None if kwargs is None else parse_json(kwargs, "--kwargs", dict),
                    headers=parse_headers(headers))
    except BadEdit as exc:
        raise click.BadParameter(str(exc)) from None
    if len(ids) == 2:
        dead = op.queue(ids[0])
    else:
        found = [name for name in sorted(op.known())
                 if next(DeadLetterQueue(op, name).entries(Filter(task_id=task_id), limit=1), None)]
        if not found:
            raise Failure(f"nothing matched: no dead letter with task id {task_id!r} in any DLQ")
        if len(found) > 1:
            raise click.UsageError(f"{task_id} is in {', '.join(found)}: say which, QUEUE ID")
        dead = op.queue(found[0])
    try:
        out = replay_edited(dead, edit, Actor.of(why=why), to=to)
    except BadEdit as exc:
        raise Failure(f"{exc} (nothing was replayed)") from None
    if out.not_found:
        raise Failure(f"nothing matched: no dead letter with task id {task_id!r} in {dead.name}")
    echo_outcome(dead.name, out, "Replayed (edited)")
