"""``celery dlq export`` and ``celery dlq report``: the analytics verbs.

``export`` needs the app (its Redis, its key prefix, its DLQs) and no JVM;
pyarrow is imported when it runs. ``report`` needs no app, only the
``spark`` extra, and is also ``python -m celery_dlq.analytics`` (a valid
``spark-submit`` entry point, whose ``__main__`` imports it from here).
pyspark is imported only when ``report`` runs, after its options are checked.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click
from celery.bin.base import CeleryCommand, CeleryOption

from celery_dlq.cli.base import dlq
from celery_dlq.errors import ConfigurationError

EXPORT, REPORT, REPLAY = "Export Options", "Report Options", "Replay Plan Options"


@dlq.command(cls=CeleryCommand)
@click.option("--out", "out", required=True, cls=CeleryOption, help_group=EXPORT,
              help="Where the archive goes: a path or a pyarrow URI (s3://bucket/prefix).")
@click.option("--snapshot", is_flag=True, cls=CeleryOption, help_group=EXPORT,
              help="Also write what the DLQs hold right now (OUT/snapshots/).")
@click.option("--json", "as_json", is_flag=True, cls=CeleryOption, help_group=EXPORT,
              help="Print the result as JSON.")
@click.pass_context
def export(ctx: click.Context, out: str, snapshot: bool, as_json: bool, **kwargs: Any) -> None:
    """Export the dead-letter event archive to Parquet, incrementally (only what is new)."""
    try:
        from celery_dlq.analytics.export import export_app
    except ImportError as exc:  # pyarrow is in the spark extra
        raise click.ClickException(f"{exc}: install celery-dlq[spark]") from None
    result = export_app(ctx.obj.app, out, snapshot=snapshot)
    if as_json:
        click.echo(json.dumps(result.as_dict()))
        return
    rate = result.rows / result.seconds if result.seconds > 0 else 0.0
    click.echo(f"exported {result.rows} events in {len(result.files)} files "
               f"({rate:,.0f} events/s); checkpoint at {result.last_id or '(nothing yet)'}")
    if snapshot:
        click.echo(f"snapshot: {result.snapshot_rows} dead letters -> {result.snapshot_file}")
    if result.events_lost:
        click.echo(f"warning: {result.events_lost} events were trimmed from the stream before any export: "
                   "export more often or raise dlq_events_max_length", err=True)


def report_options(f: Callable) -> Callable:
    options = [
        click.option("--in", "in_path", required=True, cls=CeleryOption, help_group=REPORT,
                     help="The archive celery dlq export wrote (path or URI)."),
        click.option("--out", "out_dir", required=True, cls=CeleryOption, help_group=REPORT,
                     help="Directory for report.json, report.html, tables/ and replay_plan/."),
        click.option("--master", cls=CeleryOption, help_group=REPORT,
                     help="Spark master (default local[*]); ignored under spark-submit."),
        click.option("--conf", "conf", multiple=True, cls=CeleryOption, help_group=REPORT,
                     help="A Spark setting, key=value (repeatable)."),
        click.option("--as-of", cls=CeleryOption, help_group=REPORT,
                     help="End of the trend windows and of --replay-max-age: ISO 8601 or unix seconds "
                          "(default now)."),
        click.option("--top", type=int, default=10, show_default=True, cls=CeleryOption, help_group=REPORT,
                     help="Poison payloads listed."),
        click.option("--replay-exception", "replay_exceptions", multiple=True, cls=CeleryOption,
                     help_group=REPLAY, help="Replay dead letters of this exception type (repeatable)."),
        click.option("--replay-task", "replay_tasks", multiple=True, cls=CeleryOption, help_group=REPLAY,
                     help="Replay dead letters of this task; wildcards '*' and '#' (repeatable)."),
        click.option("--replay-max-age", cls=CeleryOption, help_group=REPLAY,
                     help="Replay only dead letters at most this old: seconds or 30m, 6h, 7d."),
        click.option("--include-poison", is_flag=True, cls=CeleryOption, help_group=REPLAY,
                     help="Also replay recurring poison payloads (excluded by default)."),
        click.option("--poison-min", "poison_min_dead_letters", type=int, default=2, show_default=True,
                     cls=CeleryOption, help_group=REPLAY,
                     help="Dead letters of one payload hash that make it poison."),
        click.option("--json", "as_json", is_flag=True, cls=CeleryOption, help_group=REPORT,
                     help="Print report.json to stdout."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@click.command(cls=CeleryCommand)
@report_options
def report(as_json: bool, conf: tuple[str, ...], **kwargs: Any) -> None:
    """Failure report and replay plan from an exported archive, on Spark (local by default)."""
    from celery_dlq.analytics.options import ReportOptions, parse_conf  # no pyspark, no pyarrow

    try:
        options = ReportOptions(conf=parse_conf(conf), **kwargs)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        from celery_dlq.analytics.report import main  # pyspark: only now, and only here
    except ImportError as exc:
        raise click.ClickException(f"{exc}: the report needs the spark extra: "
                                   "pip install 'celery-dlq[spark]' (and Java 17)") from None
    try:
        result = main(options)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from None
    if as_json:
        click.echo(json.dumps(result, indent=2, default=str))
        return
    plan = result["replay_plan"]["counts"]
    click.echo(f"{result['dead_letters']['total']} dead letters in {result['events']['total']} events; "
               f"replay plan: {plan['selected']} selected ({plan['excluded_poison']} poison excluded) "
               f"in {result['seconds']:.1f} s")
    click.echo(f"wrote {options.out_dir.rstrip('/')}/report.html, report.json, tables/, replay_plan/")


dlq.add_command(report)
