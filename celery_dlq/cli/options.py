"""Options several verbs share: the dead-letter filters, ``--json``, and reading a time."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from celery_dlq.errors import ConfigurationError
from celery_dlq.headers import Reason
from celery_dlq.ops.letters import Filter
from celery_dlq.storage.groups import is_group_id
from celery_dlq.timespec import parse_since


def parse_time(value: str | None, now: float | None = None) -> float | None:
    """Unix seconds, ISO 8601 (naive means UTC), or an age such as ``30m``/``2h``/``7d`` ago."""
    try:
        return parse_since(value, now)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc)) from None


def filter_options(f: Callable) -> Callable:
    """The dead-letter filters every selecting verb takes."""
    options = [
        click.option("--task", "task_name", help="Task name; wildcards: '*' one word, '#' any words."),
        click.option("--reason", type=click.Choice(Reason.ALL), help="Why it was dead-lettered."),
        click.option("--exception", "exception_type", help="Exception type, e.g. ValueError or pkg.mod.Error."),
        click.option("--original-queue", help="The queue it was dead-lettered from."),
        click.option("--since", help="Dead-lettered at or after: unix seconds, ISO 8601, or an age (2h)."),
        click.option("--until", help="Dead-lettered before: unix seconds, ISO 8601, or an age (30m)."),
        click.option("--grep", "text", help="Text in the exception message (case-insensitive)."),
        click.option("--group", help="Failure group id, as `celery dlq groups` shows it."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def make_filter(task_id: str | None = None, **kw: Any) -> Filter | None:
    fields = {k: kw.get(k) for k in ("task_name", "reason", "exception_type", "original_queue", "text", "group")}
    fields.update(since=parse_time(kw.get("since")), until=parse_time(kw.get("until")), task_id=task_id)
    if all(v is None for v in fields.values()):
        return None
    if fields["group"] is not None and not is_group_id(fields["group"]):
        raise click.BadParameter(f"a group id is 16 hex digits (celery dlq groups shows them), got {fields['group']!r}",
                                 param_hint="--group")
    try:
        return Filter(**fields)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint="--task") from None


def json_option(f: Callable) -> Callable:
    return click.option("--json", "as_json", is_flag=True, help="Print a JSON array instead of a table.")(f)
