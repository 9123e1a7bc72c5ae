"""The verbs over circuit breakers: ``breakers`` (list), ``pause`` and ``resume`` a task or a failure group."""
from __future__ import annotations

import sys

import click
from celery.bin.base import CeleryCommand

from celery_dlq.cli.base import EXIT_USAGE, Failure, dlq, operator
from celery_dlq.cli.options import json_option, why_option
from celery_dlq.cli.output import at, cut, echo_json, n_of, print_table
from celery_dlq.ops.audit import Actor


def _confirm(what: str, force: bool) -> None:
    """As a purge: ask on a terminal; with no terminal, refuse unless --force."""
    if force:
        return
    if not sys.stdin.isatty():
        raise Failure(f"refusing to {what} without --force (nothing was changed)", EXIT_USAGE)
    click.confirm(f"This will {what}. Continue?", abort=True)


def _where(queue: str | None, group: str | None) -> str:
    return (f" (group {group})" if group else "") + (f" on queue {queue}" if queue else " on every queue")


@dlq.command(cls=CeleryCommand)
@click.option("-Q", "--queue", help="Only this queue's breakers.")
@click.option("--task", help="Only this task's breakers.")
@json_option
@click.pass_context
def breakers(ctx: click.Context, queue: str | None, task: str | None, as_json: bool) -> None:
    """Circuit breakers: closed, open (deliveries held), half_open (one probing), or paused by hand."""
    rows = operator(ctx).breakers.rows(task, queue)
    if as_json:
        return echo_json(row.as_dict() for row in rows)
    print_table("circuit breakers", ["queue", "task", "group", "state", "held", "failures", "opened", "probe",
                                     "paused by", "exception"],
                ((r.queue, r.task, r.group, r.state, r.held, r.failures, at(r.opened_at), at(r.probe_at),
                  r.paused_by or "-", cut(r.exception, 40)) for r in rows),
                keep={"queue", "task", "group", "state"})


@dlq.command(cls=CeleryCommand)
@click.argument("task")
@click.option("-Q", "--queue", help="Hold it on this queue only (default: every queue).")
@click.option("--group", help="Only this failure group of the task (celery dlq groups); default: the whole task.")
@click.option("--by", "who", help="Who pauses (default: your OS user@host).")
@why_option
@click.option("-f", "--force", is_flag=True, help="Do not ask.")
@click.pass_context
def pause(ctx: click.Context, task: str, queue: str | None, group: str | None, who: str | None,
          why: str | None, force: bool) -> None:
    """Hold TASK's new deliveries (parked, not run, no attempt used) until resumed.

    Workers hold only tasks whose policy has breaker True or "manual".
    """
    _confirm(f"pause {task}{_where(queue, group)}", force)
    row = operator(ctx).breakers.pause(task, queue=queue, group=group, actor=Actor.of(who, why))
    click.echo(f"Paused {task}{_where(queue, group)} (by {row.paused_by}); workers hold it within "
               f"dlq_breaker_refresh seconds.")


@dlq.command(cls=CeleryCommand)
@click.argument("task")
@click.option("-Q", "--queue", help="Only its breakers on this queue.")
@click.option("--group", help="Only this failure group's breaker.")
@why_option
@click.option("-f", "--force", is_flag=True, help="Do not ask.")
@click.pass_context
def resume(ctx: click.Context, task: str, queue: str | None, group: str | None, why: str | None,
           force: bool) -> None:
    """Close TASK's open or paused breakers and release what they held, at a rising pace."""
    controls = operator(ctx).breakers
    found = controls.matching(task, queue=queue, group=group)
    if not found:
        raise Failure(f"nothing matched: no open or paused breaker of {task}{_where(queue, group)}")
    held = sum(row.held for row in found)
    _confirm(f"close {n_of(len(found), 'breaker')} of {task} and release {n_of(held, 'held delivery')}", force)
    closed, released = controls.resume(task, queue=queue, group=group, actor=Actor.of(why=why))
    click.echo(f"Closed {n_of(closed, 'breaker')}; {n_of(released, 'held delivery')} released, "
               "behind the queue's other traffic.")
