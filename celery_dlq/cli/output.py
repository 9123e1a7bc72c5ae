"""Everything the ``celery dlq`` verbs print: JSON arrays, rich tables, progress bars, outcome lines."""
from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import click

from celery_dlq.ops.queue import Outcome
from celery_dlq.workflow import summary as workflow_summary


def echo_json(rows: Iterable[dict]) -> None:
    """A JSON array, one element at a time: a 10,000-message DLQ is never held whole."""
    first = True
    for row in rows:
        click.echo(("[\n  " if first else ",\n  ") + json.dumps(row, default=str), nl=False)
        first = False
    click.echo("[]" if first else "\n]")


def at(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def workflow_line(info: dict | None) -> str:
    """The chord/chain a letter belongs to, in one line (``celery dlq show``)."""
    return workflow_summary(info)


def cut(text: Any, n: int = 60) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= n else text[: n - 1] + "…"


# rich is imported only when something is printed: Celery imports every
# ``celery.commands`` plugin for every command, ``celery worker`` included.

def console() -> Any:
    """Terminal width on a terminal (or $COLUMNS); 160 columns into a pipe, rather than rich's 80."""
    from rich.console import Console

    return Console(soft_wrap=False, width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160)


def print_table(title: str | None, columns: list[str], rows: Iterable[Iterable[Any]],
                keep: frozenset[str] | set[str] = frozenset()) -> None:
    """A rich table; cells are plain text (a ``[`` in an exception is not markup); ``keep`` columns never wrap."""
    from rich.table import Table
    from rich.text import Text

    t = Table()
    for name in columns:
        t.add_column(name, overflow="fold", no_wrap=name in keep)
    for row in rows:
        t.add_row(*(Text(str(value)) for value in row))
    if title:
        click.echo(title)
    console().print(t)


def n_of(n: int, noun: str) -> str:
    """``1 dead letter``, ``2 dead letters``, ``2 parked retries``."""
    plural = noun[:-1] + "ies" if noun.endswith("y") else noun + "s"
    return f"{n} {noun if n == 1 else plural}"


@contextmanager
def progress(label: str, total: int | None) -> Iterator[Callable[[int], None] | None]:
    """A rich progress bar when stdout is a terminal; nothing otherwise."""
    if not sys.stdout.isatty():
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = [TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()]
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


def ids_line(ids: list[str], most: int = 20) -> str:
    """Task ids as one line: the first ``most``, then an ellipsis."""
    return ", ".join(ids[:most]) + (", …" if len(ids) > most else "")


def echo_outcome(name: str, out: Outcome, verb: str, planned: int | None = None) -> None:
    """The summary line, the missing count, the task ids not found and the failures of one DLQ.

    ``planned``: the DLQ's share of a replay plan (``replay --plan``), whose
    ids not found are said so; the summary line is left out when none matched.
    """
    if planned is None or out.matched:
        matched = n_of(out.matched, "matching dead letter")
        if out.dry_run:
            line = f"Would replay {out.matched - len(out.failed)} of {matched} from {name}"
        else:
            line = f"{verb} {out.done} of {matched} from {name}"
        where = ", ".join(f"{n} to {q}" for q, n in sorted(out.targets.items()))
        click.echo(line + (f": {where}" if where else "") + (" (dry run: nothing moved)." if out.dry_run else "."))
    if out.missing:
        click.echo(f"{out.missing} were gone already (replayed, purged or trimmed meanwhile).")
    if out.not_found and planned is not None:
        click.echo(f"{len(out.not_found)} of {n_of(planned, 'planned dead letter')} no longer in {name} "
                   f"(replayed, purged or trimmed since the report): {ids_line(out.not_found)}")
    elif out.not_found:
        click.echo(f"{n_of(len(out.not_found), 'task id')} not in {name}: {ids_line(out.not_found)}")
    for line in out.failed[:20]:
        click.echo(f"failed: {line}", err=True)
