"""``celery dlq groups [QUEUE]``: dead letters grouped by failure, with counts, first and last seen, reasons.

Thin over :meth:`Operator.groups <celery_dlq.ops.operator.Operator.groups>`,
which reads each DLQ's group index (kept as letters arrive and leave), not
its letters. A group's id selects its letters in ``list``, ``replay`` and
``purge`` (``--group <id>``).
"""
from __future__ import annotations

from collections.abc import Iterable

import click
from celery.bin.base import CeleryCommand

from celery_dlq.cli.base import dlq, operator
from celery_dlq.cli.options import json_option
from celery_dlq.cli.output import at, cut, echo_json, n_of, print_table

#: Block characters of the arrivals sparkline, lowest to highest.
SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Iterable[int]) -> str:
    """Arrivals per hour as block characters (a dot for none), scaled to the busiest hour."""
    values = list(values)
    top = max(values, default=0)
    return "".join("·" if not v else SPARKS[min(len(SPARKS) - 1, (v * len(SPARKS) - 1) // top)] for v in values)


@dlq.command(cls=CeleryCommand)
@click.argument("queue", required=False)
@json_option
@click.pass_context
def groups(ctx: click.Context, queue: str | None, as_json: bool) -> None:
    """Failure groups of QUEUE (a DLQ, or the queue it serves), or of every DLQ.

    A group is a task, an exception type and its message with numbers, ids
    and quoted values left out. Replay one with `dlq replay DLQ --group ID`.
    """
    report = operator(ctx).groups(queue)
    ungrouped = report.ungrouped
    if as_json:
        rows = ([dict(g.as_dict(), chords_waiting=report.chords_waiting.get(g.group_id, 0))
                 for g in next(iter(report.per_dlq.values()))] if queue else [g.as_dict() for g in report.merged()])
        rows += [{"group": None, "dlqs": {name: n}, "count": n} for name, n in sorted(ungrouped.items())]
        return echo_json(rows)
    merged = report.merged()
    total = sum(report.depths.values())
    several = len(report.depths) > 1   # name the DLQs only when there is a choice
    chords = any(g.chords_waiting for g in merged)   # a column only when some chord waits for a letter
    columns = ["group", "task", "exception", "count", *(["DLQs"] if several else []), "first", "last", "reasons",
               "last 24 h", *(["chords waiting"] if chords else [])]
    print_table(f"{n_of(total, 'dead letter')} in {n_of(len(merged), 'failure group')}"
                + (f" ({', '.join(report.depths)})" if not several else ""), columns,
                ((g.group_id, g.task or "?", cut(f"{g.exception_type}: {g.title}", 50), g.count,
                  *([", ".join(f"{name} {n}" for name, n in sorted(g.dlqs.items()))] if several else []),
                  at(g.first), at(g.last), ", ".join(f"{r} {n}" for r, n in g.reasons.items()),
                  sparkline(g.arrivals), *([g.chords_waiting] if chords else [])) for g in merged),
                keep={"group", "count", "first", "last", "last 24 h"})
    for name, n in sorted(ungrouped.items()):
        click.echo(f"{name}: {n_of(n, 'dead letter')} in no group (written without a group id: raw elements "
                   "a worker could not decode, or dead-lettered before groups existed)")
