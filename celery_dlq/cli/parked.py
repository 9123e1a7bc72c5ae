"""The verbs over parked retries and counters: ``parked`` (old name ``delayed``, hidden), ``redeliver``, ``stats``."""
from __future__ import annotations

import click
from celery.bin.base import CeleryCommand

from celery_dlq.cli.base import Failure, confirm, dlq, operator
from celery_dlq.cli.options import json_option
from celery_dlq.cli.output import at, cut, echo_json, n_of, print_table
from celery_dlq.ops.audit import Audit


@dlq.command(cls=CeleryCommand)
@click.option("-Q", "--queue", help="Only retries parked for this queue.")
@click.option("--limit", type=click.IntRange(min=0), default=100, show_default=True, help="0: no limit.")
@click.option("--delete", "delete_ids", multiple=True, metavar="ID",
              help="Delete this parked retry (entry or task id).")
@click.option("-f", "--force", is_flag=True, help="With --delete: do not ask. There is no undo.")
@json_option
@click.pass_context
def parked(ctx: click.Context, queue: str | None, limit: int, delete_ids: tuple[str, ...], force: bool,
           as_json: bool) -> None:
    """Retries parked until they are due, earliest first (or delete some with --delete)."""
    op = operator(ctx)
    store = op.parked
    if delete_ids:
        if not force:
            confirm(f"delete parked retries {', '.join(delete_ids)}")
        audit = Audit(op)
        deleted = sum(store.delete(ident, force=True, audit=audit) for ident in delete_ids)
        if not deleted:
            raise Failure(f"nothing matched: no parked retry {', '.join(delete_ids)}")
        return click.echo(f"Deleted {n_of(deleted, 'parked retry')}.")
    rows = store.entries(queue, limit=limit or None)
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
    op = operator(ctx)
    parked, audit = op.parked, Audit(op)
    n = parked.redeliver_now(audit=audit) if everything else sum(parked.redeliver_now(ident, audit=audit)
                                                                  for ident in ids)
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
