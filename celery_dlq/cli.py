"""``celery -A proj dlq ...``: inspect, replay and purge dead letters and parked retries.

Registered through the ``celery.commands`` entry point, in the style of
``celery/bin/purge.py`` (``ctx.obj.app``, ``--force`` for destructive verbs),
and thin over :mod:`celery_dlq.manage`; ``export`` and ``report`` come from
:mod:`celery_dlq.cli_analytics`, and ``replay --plan`` reads their replay plan
with pyarrow (no JVM). Human output is rich tables; every
read verb takes ``--json`` (a JSON array, streamed). A progress bar shows on
replays and purges when stdout is a terminal.

Exit codes: 0 success; 1 partial failure, nothing matched, or Redis/broker
unusable; 2 bad usage (unknown queue, bad option, ``--force`` missing when
there is no terminal to ask on). Every error is one line on stderr.
"""
from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Iterator

import click
import redis
from celery.bin.base import CeleryCommand
from kombu.utils.url import maybe_sanitize_url

from celery_dlq.cli_analytics import export, report
from celery_dlq.errors import ConfigurationError, DLQError
from celery_dlq.headers import Reason
from celery_dlq.manage import (BrokerNotSupported, DeadLetter, DeadLetterQueue, Filter, Operator, Outcome,
                               TaskIds, UnknownQueue)

EXIT_FAILED, EXIT_USAGE = 1, 2
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class Failure(click.ClickException):
    """One line on stderr (``Error: ...``) and an exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = code


def make_operator(app: Any) -> Operator:
    """The operator for ``app`` (tests replace this to inject clients)."""
    return Operator(app)


def _redis_urls(app: Any) -> str:
    try:
        from celery_dlq.extension import get_dlq

        return maybe_sanitize_url(get_dlq(app).settings.redis_url)
    except Exception:
        return "(unknown URL)"


class DLQGroup(click.Group):
    """Turns our errors and Redis errors into one line and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (UnknownQueue, ConfigurationError, ValueError) as exc:
            raise Failure(str(exc), EXIT_USAGE) from None
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise Failure(f"cannot reach Redis at {_redis_urls(ctx.obj.app)}: {exc}") from None
        except (BrokerNotSupported, DLQError, redis.RedisError) as exc:
            raise Failure(str(exc)) from None


@click.group(name="dlq", cls=DLQGroup)
@click.pass_context
def dlq(ctx: click.Context, **kwargs: Any) -> None:
    """Inspect, replay and purge dead letters and parked retries (celery-dlq)."""


def operator(ctx: click.Context) -> Operator:
    """One operator per command line (``ctx.meta`` is shared by the whole context chain)."""
    if ctx.meta.get("dlq.operator") is None:
        ctx.meta["dlq.operator"] = make_operator(ctx.obj.app)
    return ctx.meta["dlq.operator"]


# -- options ------------------------------------------------------------------

def parse_time(value: str | None, now: float | None = None) -> float | None:
    """Unix seconds, ISO 8601 (naive means UTC), or an age such as ``30m``/``2h``/``7d`` ago."""
    if value is None:
        return None
    now = time.time() if now is None else now
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    if text[:-1].replace(".", "", 1).isdigit() and text[-1:] in UNITS:
        return now - float(text[:-1]) * UNITS[text[-1]]
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{value!r}: use unix seconds, ISO 8601, or an age like 30m, 2h, 7d") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


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
    ]
    for option in reversed(options):
        f = option(f)
    return f


def make_filter(task_id: str | None = None, **kw: Any) -> Filter | None:
    fields = {k: kw.get(k) for k in ("task_name", "reason", "exception_type", "original_queue", "text")}
    fields.update(since=parse_time(kw.get("since")), until=parse_time(kw.get("until")), task_id=task_id)
    if all(v is None for v in fields.values()):
        return None
    try:
        return Filter(**fields)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), param_hint="--task") from None


def json_option(f: Callable) -> Callable:
    return click.option("--json", "as_json", is_flag=True, help="Print a JSON array instead of a table.")(f)


# -- output -------------------------------------------------------------------

def echo_json(rows: Iterable[dict]) -> None:
    """A JSON array, one element at a time: a 10,000-message DLQ is never held whole."""
    first = True
    for row in rows:
        click.echo(("[\n  " if first else ",\n  ") + json.dumps(row, default=str), nl=False)
        first = False
    click.echo("[]" if first else "\n]")


def at(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def cut(text: Any, n: int = 60) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= n else text[: n - 1] + "…"


# rich is imported only when something is printed: Celery imports every
# ``celery.commands`` plugin for every command, ``celery worker`` included.

def console() -> Any:
    """Terminal width on a terminal (or $COLUMNS); 160 columns into a pipe, rather than rich's 80."""
    from rich.console import Console

    return Console(soft_wrap=False, width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160)


def print_table(title: str | None, columns: list[str], rows: Iterable[Iterable[Any]], keep: set[str] = set()) -> None:
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


# -- verbs --------------------------------------------------------------------

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
        rows = ((letter.task_id or "?", letter.task_name or "?", letter.header("x-dlq-reason") or "-",
                 letter.delivery_count or "-", at(letter.dead_lettered_at), cut(_exception(letter)))
                for letter in letters())
        print_table(f"{dead.name}: {n_of(dead.depth(), 'dead letter')} (sizes, args and headers: --json or show)",
                    ["task id", "task", "reason", "deliveries", "dead-lettered at", "exception"], rows,
                    keep={"task id", "task", "reason", "deliveries", "dead-lettered at"})
    if where is not None and not shown[0]:  # an empty DLQ is a fact; a filter matching nothing is a miss
        raise Failure(f"nothing matched in {dead.name}")


def _exception(letter: DeadLetter) -> str:
    kind, message = letter.header("x-dlq-exception-type"), letter.header("x-dlq-exception-message")
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
        return echo_json(letter.as_dict() for letter in found)
    for letter in found:
        _print_letter(letter)


def _print_letter(letter: DeadLetter) -> None:
    d = letter.as_dict()
    rows = [(name, cut(d[name], 300)) for name in (
        "task_id", "original_queue", "reason", "delivery_count", "exception_type", "exception_message",
        "worker", "replay_count", "priority", "content_type", "size")]
    rows.append(("dead_lettered_at", at(d["dead_lettered_at"])))
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


def _selection(ids: tuple[str, ...], everything: bool, filters: dict, *,
               every: bool = False) -> Filter | TaskIds | None:
    """What to select in one pass; refuses to select everything by accident.

    Task ids become one :class:`TaskIds` (the filter options narrowing it):
    the oldest dead letter of each id, or with ``every`` each of them.
    """
    where = make_filter(**filters)
    if ids:
        return TaskIds(ids, where, every=every)
    if where is None and not everything:
        raise click.UsageError("say which dead letters: TASK_ID..., a filter option, or --all")
    return where


def _total(dead: Any, where: Filter | TaskIds | None, limit: int | None) -> int | None:
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
@click.pass_context
def replay(ctx: click.Context, queue: str | None, task_ids: tuple[str, ...], everything: bool,
           plan_path: str | None, to: str | None, rate: float | None, limit: int | None, dry_run: bool,
           **filters: Any) -> None:
    """Send dead letters of QUEUE back to their original queue, delivery count reset.

    Each message moves atomically: interrupted, run it again; none is lost or
    delivered twice. By task id only the oldest dead letter of each id moves;
    the DLQ is read once for all the ids, so --rate paces them.
    With --plan DIR, exactly the dead letters a `dlq report` replay plan
    selected move (read with pyarrow, no JVM); ids, filters, --all and
    --limit do not combine with it.
    """
    if plan_path is not None:
        from celery_dlq.cli_plan import refuse_with_plan, replay_plan

        refuse_with_plan(ctx, task_ids, everything, limit, filters)
        return replay_plan(ctx, plan_path, queue, to=to, rate=rate, dry_run=dry_run)
    if queue is None:
        raise click.UsageError("say which DLQ: QUEUE, or --plan DIR")
    where = _selection(task_ids, everything, filters)
    dead = operator(ctx).queue(queue)
    with progress(f"replaying {dead.name}", _total(dead, where, limit)) as advance:
        out = dead.replay(where, to=to, limit=limit, rate=rate, dry_run=dry_run, progress=advance)
    _report(dead.name, out, "Replayed")


# -- replay --plan ------------------------------------------------------------

@dlq.command(cls=CeleryCommand)
@click.argument("queue")
@click.argument("task_ids", nargs=-1)
@filter_options
@click.option("--all", "everything", is_flag=True, help="Every dead letter of QUEUE (when no id or filter).")
@click.option("-f", "--force", is_flag=True, help="Delete without asking. There is no undo.")
@click.pass_context
def purge(ctx: click.Context, queue: str, task_ids: tuple[str, ...], everything: bool, force: bool,
          **filters: Any) -> None:
    """Delete dead letters of QUEUE for good (asks first, unless --force).

    By task id, every dead letter of that id goes.
    """
    where = _selection(task_ids, everything, filters, every=True)
    dead = operator(ctx).queue(queue)
    if not force:
        counted = where.fresh() if isinstance(where, TaskIds) else where   # a TaskIds serves one pass
        count = dead.depth() if where is None else sum(1 for _ in dead.entries(counted))
        _confirm(f"delete {n_of(count, 'dead letter')} from {dead.name}")
    with progress(f"purging {dead.name}", _total(dead, where, None)) as advance:
        out = dead.purge(where, force=True, progress=advance)
    _report(dead.name, out, "Deleted")


def _confirm(what: str) -> None:
    """Celery's purge asks; with no terminal to ask on, refuse: a script must say --force."""
    if not sys.stdin.isatty():
        raise Failure(f"refusing to {what} without --force (nothing was deleted)", EXIT_USAGE)
    click.confirm(f"This will {what}. There is no undo. Continue?", abort=True)


def _report(name: str, out: Outcome, verb: str) -> None:
    """One summary line (plus missing and failed ones); exit 1 when nothing matched or some failed."""
    if not out.matched:
        raise Failure(f"nothing matched in {name}")
    _echo_outcome(name, out, verb)
    if out.failed:
        raise Failure(f"{n_of(len(out.failed), 'dead letter')} could not be handled", EXIT_FAILED)


def _echo_outcome(name: str, out: Outcome, verb: str) -> None:
    """The summary line, the missing count and the failures of one DLQ (shared by ``replay --plan``)."""
    matched = n_of(out.matched, "matching dead letter")
    if out.dry_run:
        line = f"Would replay {out.matched - len(out.failed)} of {matched} from {name}"
    else:
        line = f"{verb} {out.done} of {matched} from {name}"
    where = ", ".join(f"{n} to {q}" for q, n in sorted(out.targets.items()))
    click.echo(line + (f": {where}" if where else "") + (" (dry run: nothing moved)." if out.dry_run else "."))
    if out.missing:
        click.echo(f"{out.missing} were gone already (replayed, purged or trimmed meanwhile).")
    for line in out.failed[:20]:
        click.echo(f"failed: {line}", err=True)


@dlq.command(cls=CeleryCommand)
@click.option("-Q", "--queue", help="Only retries parked for this queue.")
@click.option("--limit", type=click.IntRange(min=0), default=100, show_default=True, help="0: no limit.")
@click.option("--delete", "delete_ids", multiple=True, metavar="ID",
              help="Delete this parked retry (entry or task id).")
@click.option("-f", "--force", is_flag=True, help="With --delete: do not ask. There is no undo.")
@json_option
@click.pass_context
def delayed(ctx: click.Context, queue: str | None, limit: int, delete_ids: tuple[str, ...], force: bool,
            as_json: bool) -> None:
    """Retries parked until they are due, earliest first (or delete some with --delete)."""
    parked = operator(ctx).parked
    if delete_ids:
        if not force:
            _confirm(f"delete parked retries {', '.join(delete_ids)}")
        deleted = sum(parked.delete(ident, force=True) for ident in delete_ids)
        if not deleted:
            raise Failure(f"nothing matched: no parked retry {', '.join(delete_ids)}")
        return click.echo(f"Deleted {n_of(deleted, 'parked retry')}.")
    rows = parked.entries(queue, limit=limit or None)
    if as_json:
        return echo_json(row.as_dict() for row in rows)
    print_table("parked retries", ["entry", "task", "queue", "due", "next delivery", "last exception"],
                ((row.entry_id, row.task_name or "?", row.queue,
                  f"leased until {at(row.lease_until)}" if row.lease_until else at(row.due),
                  row.delivery_count or "?", cut(row.last_exception)) for row in rows),
                keep={"entry", "due", "next delivery"})


@dlq.command(cls=CeleryCommand)
@click.argument("ids", nargs=-1)
@click.option("--all", "everything", is_flag=True, help="Every parked retry.")
@click.pass_context
def redeliver(ctx: click.Context, ids: tuple[str, ...], everything: bool) -> None:
    """Make parked retries (entry or task ids, or --all) due now; workers' movers deliver them."""
    if bool(ids) == everything:
        raise click.UsageError("give parked retry ids (entry or task ids), or --all; one or the other")
    parked = operator(ctx).parked
    n = parked.redeliver_now() if everything else sum(parked.redeliver_now(ident) for ident in ids)
    if not n:
        raise Failure("nothing matched: no parked retry waiting" + (f" for {', '.join(ids)}" if ids else ""))
    click.echo(f"{n_of(n, 'parked retry')} due now; the workers' movers deliver {'it' if n == 1 else 'them'}.")


@dlq.command(cls=CeleryCommand)
@json_option
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Counters: parked, redelivered, dead-lettered, dropped, trimmed, replayed, purged..."""
    counters = operator(ctx).stats()
    if as_json:
        return echo_json({"name": k, "value": v} for k, v in counters.items())
    print_table(None, ["counter", "value"], counters.items())


# -- the analytics commands ---------------------------------------------------
# cli_analytics imports only click and celery at module level: pyarrow when
# ``export`` runs, pyspark when ``report`` runs (and only in celery_dlq.analytics).

dlq.add_command(export)
dlq.add_command(report)
