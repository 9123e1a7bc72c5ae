"""``celery dlq policy TASK [-Q QUEUE]``: a task's effective policy, each field with the level it came from.

Like ``git config --show-origin``: the task's ``redelivery_policy``, its
Celery options (``max_retries``...), which ``dlq_task_policies`` or
``dlq_queue_policies`` pattern, ``dlq_default_policy``, or the built-in default.
The breaker's options merge one by one, so each is a row of its own (``breaker.window``).
"""
from __future__ import annotations

import difflib
from operator import attrgetter
from typing import Any

import click
from celery.bin.base import CeleryCommand

from celery_dlq.cli.base import EXIT_USAGE, Failure, dlq
from celery_dlq.cli.options import json_option
from celery_dlq.cli.output import echo_json, print_table
from celery_dlq.policy import FIELD_PATHS
from celery_dlq.settings import DLQSettings
from celery_dlq.tasklevel import task_levels


def shown(value: Any) -> Any:
    """A field's value for people and JSON: exception classes by their dotted names."""
    if isinstance(value, tuple):
        return [f"{t.__module__}.{t.__qualname__}".removeprefix("builtins.") for t in value]
    return value


def explain(app: Any, task_name: str, queue: str | None) -> tuple[str, list[dict[str, Any]], list[str]]:
    """(queue, one row per field, start-up warnings) for ``task_name``; :class:`Failure` for an unknown task."""
    app.loader.import_default_modules()
    task = app.tasks.get(task_name)
    if task is None:
        names = [name for name in app.tasks if not name.startswith("celery.")]
        close = difflib.get_close_matches(task_name, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise Failure(f"no task named {task_name!r} is registered{hint}", EXIT_USAGE)
    queue = queue or getattr(task, "queue", None) or app.conf.task_default_queue
    settings = DLQSettings.from_conf(app.conf)
    levels = task_levels(task)
    policy, origins = settings.explain(task_name, queue, levels)
    rows = [{"field": path, "value": shown(attrgetter(path)(policy)), "from": origins[path]}
            for path in FIELD_PATHS]
    return queue, rows, settings.capped_delays(task_name, queue, levels)


@dlq.command(cls=CeleryCommand)
@click.argument("task_name", metavar="TASK_NAME")
@click.option("-Q", "--queue", help="The queue it is consumed from (default: the task's queue, else the "
                                    "app's default queue).")
@json_option
@click.pass_context
def policy(ctx: click.Context, task_name: str, queue: str | None, as_json: bool) -> None:
    """The effective redelivery policy of a task on a queue, each field with where it came from."""
    queue, rows, warnings = explain(ctx.obj.app, task_name, queue)
    if as_json:
        return echo_json(dict(row, task=task_name, queue=queue) for row in rows)
    print_table(f"policy of {task_name} on queue {queue}", ["field", "value", "from"],
                ((row["field"], row["value"], row["from"]) for row in rows))
    for warning in warnings:
        click.echo(f"Warning: {warning}", err=True)
