"""Options several verbs share: the dead-letter filters, ``--json``, and reading a time.

The filters are :data:`celery_dlq.ops.selection.PARAMS` as ``--<name>``
options, read by :func:`celery_dlq.ops.selection.parse_filter`: this module
only turns its errors into click's.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import click

from celery_dlq.errors import ConfigurationError
from celery_dlq.headers import Reason
from celery_dlq.ops.letters import Filter
from celery_dlq.ops.selection import BadSelection, NothingSelected, Selection, parse_filter
from celery_dlq.timespec import parse_since


def parse_time(value: str | None, now: float | None = None) -> float | None:
    """Unix seconds, ISO 8601 (naive means UTC), or an age such as ``30m``/``2h``/``7d`` ago."""
    try:
        return parse_since(value, now)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc)) from None


def filter_options(f: Callable) -> Callable:
    """The dead-letter filters every selecting verb takes (keyword arguments named as ``PARAMS``)."""
    options = [
        click.option("--task", help="Task name; wildcards: '*' one word, '#' any words."),
        click.option("--reason", type=click.Choice(Reason.ALL), help="Why it was dead-lettered."),
        click.option("--exception", help="Exception type, e.g. ValueError or pkg.mod.Error."),
        click.option("--original-queue", help="The queue it was dead-lettered from."),
        click.option("--since", help="Dead-lettered at or after: unix seconds, ISO 8601, or an age (2h)."),
        click.option("--until", help="Dead-lettered before: unix seconds, ISO 8601, or an age (30m)."),
        click.option("--grep", help="Text in the exception message (case-insensitive)."),
        click.option("--group", help="Failure group id, as `celery dlq groups` shows it."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def make_filter(**filters: Any) -> Filter | None:
    """The :class:`Filter` of :func:`filter_options`' values; a bad value is click's usage error, naming its option."""
    try:
        return parse_filter(filters)
    except BadSelection as exc:
        raise click.BadParameter(str(exc), param_hint="--" + exc.param.replace("_", "-")) from None


def make_selection(ids: Iterable[str], everything: bool, filters: dict) -> Selection:
    """Task ids, the filter options, or ``--all``: refuses to select everything by accident."""
    try:
        return Selection.of(ids, make_filter(**filters), everything)
    except NothingSelected:
        raise click.UsageError("say which dead letters: TASK_ID..., a filter option, or --all") from None


def json_option(f: Callable) -> Callable:
    return click.option("--json", "as_json", is_flag=True, help="Print a JSON array instead of a table.")(f)


def why_option(f: Callable) -> Callable:
    """``--why``: the operator's reason, recorded in the audit trail (``celery dlq audit``) with who (the OS
    user@host) and when. Not ``--reason``: that is the filter on why letters were dead-lettered."""
    return click.option("--why", "why", metavar="TEXT",
                        help="Your reason: recorded in the audit trail (celery dlq audit) with who and when.")(f)
