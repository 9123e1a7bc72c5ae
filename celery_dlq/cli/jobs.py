"""``celery dlq jobs``: redrive jobs kept in Redis, listed, started, run, followed, paused, resumed, cancelled.

Thin over :mod:`celery_dlq.ops.jobs` and :mod:`celery_dlq.ops.jobrun`. A job started here runs in this
process with ``--run`` (or ``jobs run ID`` later); else any process that runs jobs takes it (a
worker, the dashboard, ``jobs run``). ``follow`` prints its progress until it ends, and takes it over
when its owner died. Every start, pause, resume and cancel is audited with ``--why``.
"""
from __future__ import annotations

import time
from typing import Any

import click
from celery.bin.base import CeleryCommand

from celery_dlq.cli.base import EXIT_FAILED, Failure, confirm, dlq, operator
from celery_dlq.cli.options import filter_options, json_option, make_selection, why_option
from celery_dlq.cli.output import at, echo_json, n_of, print_table
from celery_dlq.cli.plan import load_plan_at
from celery_dlq.ops.audit import Actor
from celery_dlq.ops.jobrun import JobRunner
from celery_dlq.ops.jobs import LEASE, Job, Jobs, Velocity


def _jobs(ctx: click.Context, lease: float = LEASE) -> Jobs:
    return Jobs(operator(ctx), lease=lease)


def _rate(job: Job) -> str:
    if job.rate is None:
        return "no cap"
    return f"{job.rate:g}/s" + (f" (rising to {job.cap:g})" if job.cap is not None else "")


def _line(job: Job) -> str:
    c = job.counts
    return (f"job {job.id} {job.state}: {c['done']} moved, {c['missing']} gone already, {c['failed']} failed"
            + (f", {c['not_found']} not found" if c["not_found"] else "") + f"; {_rate(job)}"
            + (f"; {job.reason}" if job.reason else ""))


@dlq.group(name="jobs", invoke_without_command=True)
@json_option
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.pass_context
def jobs(ctx: click.Context, as_json: bool, limit: int) -> None:
    """Redrive jobs (newest first); subcommands start, run, follow, pause, resume and cancel them."""
    if ctx.invoked_subcommand is not None:
        return
    rows = _jobs(ctx).recent(limit)
    if as_json:
        return echo_json(job.as_dict() for job in rows)
    print_table(None, ["job", "kind", "DLQ", "state", "moved", "rate", "who", "created", "owner"],
                ((j.id, j.kind, j.dlq, j.state, j.counts["done"], _rate(j), j.who, at(j.created), j.owner or "-")
                 for j in rows), keep={"job", "state"})


@jobs.command(cls=CeleryCommand)
@click.argument("queue", required=False)
@click.argument("task_ids", nargs=-1)
@filter_options
@click.option("--all", "everything", is_flag=True, help="Every dead letter of QUEUE (when no id or filter).")
@click.option("--purge", is_flag=True, help="Delete the selection for good instead of replaying it.")
@click.option("--to", help="Deliver to this queue instead of each message's original queue.")
@click.option("--limit", type=click.IntRange(min=1), help="At most this many messages.")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), help="At most this many messages/s (the "
              "start, with --cap).")
@click.option("--cap", type=click.FloatRange(min=0, min_open=True), help="Rising velocity: --rate doubled every "
              "--interval while the letters succeed, up to this.")
@click.option("--interval", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True)
@click.option("-f", "--force", is_flag=True, help="Start even when another unfinished job works this DLQ; with "
              "--purge, also delete without asking (there is no undo).")
@click.option("--run", "run_here", is_flag=True, help="Run it in this process now (else any runner takes it).")
@click.option("--plan", "plan_path", metavar="DIR", help="One job per DLQ of a report's replay plan (as replay "
              "--plan; QUEUE, ids and filters do not combine with it).")
@why_option
@click.pass_context
def start(ctx: click.Context, queue: str | None, task_ids: tuple[str, ...], everything: bool, purge: bool,
          to: str | None, limit: int | None, rate: float | None, cap: float | None, interval: float, force: bool,
          run_here: bool, plan_path: str | None, why: str | None, **filters: Any) -> None:
    """Start a job replaying (or, with --purge, deleting) dead letters of QUEUE; prints its id.

    A purge asks first, as ``purge`` does, unless --force (with no terminal to ask on, it refuses).
    """
    if cap is not None and rate is None:
        raise click.UsageError("--cap rises from --rate: give both")
    if plan_path is not None:
        if queue or task_ids or everything or purge or limit or any(v is not None for v in filters.values()):
            raise click.UsageError("--plan selects the letters itself: no QUEUE, ids, filters, --all, --purge "
                                   "or --limit")
        handle = _jobs(ctx)
        started = handle.start_plan(load_plan_at(plan_path).by_dlq(), actor=Actor.of(why=why), to=to,
                                    velocity=Velocity(rate, cap, interval), force=force)
        for job in started:
            click.echo(f"job {job.id} started: {job.title}, {_rate(job)}")
        for job in started if run_here else ():
            _run_one(handle, job.id)
        return
    if queue is None:
        raise click.UsageError("say which DLQ: QUEUE, or --plan DIR")
    selection = make_selection(task_ids, everything, filters)
    handle = _jobs(ctx)
    if purge and not force:
        dead = handle.op.queue(queue)
        confirm(f"delete {n_of(dead.count(selection.selector(every=True)), 'dead letter')} from {dead.name}")
    job = handle.start(queue, selection, kind="purge" if purge else "replay", actor=Actor.of(why=why), to=to,
                       limit=limit, velocity=Velocity(rate, cap, interval), force=force)
    click.echo(f"job {job.id} started: {job.kind} of {selection.describe()} of {job.dlq}, {_rate(job)}")
    if run_here:
        _run_one(handle, job.id)


def _run_one(handle: Jobs, job_id: str) -> None:
    job = JobRunner(handle).run(job_id)
    if job is None:
        current = handle.get(job_id)
        raise Failure(f"job {job_id} is not this process's to run: " + (
            f"{current.owner} holds it" if current and not current.ended else f"it is {current.state}"
            if current else "no such job"))
    click.echo(_line(job))
    if job.state == "failed":
        raise Failure(f"job {job_id} failed: {job.reason}", EXIT_FAILED)


@jobs.command(cls=CeleryCommand)
@click.argument("job_id", required=False)
@click.option("--lease", type=click.FloatRange(min=0.1), default=LEASE, show_default=True,
              help="Seconds this process holds a job between renewals; another takes it over after.")
@click.option("--once", is_flag=True, help="Without JOB_ID: run the jobs nobody runs now, then exit.")
@click.option("--poll", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Without JOB_ID: seconds between looks for jobs nobody runs.")
@click.pass_context
def run(ctx: click.Context, job_id: str | None, lease: float, once: bool, poll: float) -> None:
    """Run JOB_ID here (when nobody holds it), or every job nobody runs (their owner died, or none yet)."""
    handle = _jobs(ctx, lease)
    if job_id:
        return _run_one(handle, job_id)
    runner = JobRunner(handle)
    while True:
        for taken in runner.take_orphans():
            job = handle.get(taken)
            if job is not None:
                click.echo(_line(job))
        if once:
            return
        time.sleep(poll)


def _act(action: str) -> Any:
    @jobs.command(name=action, cls=CeleryCommand, help=f"{action.capitalize()} JOB_ID (any process may).")
    @click.argument("job_id")
    @why_option
    @click.pass_context
    def command(ctx: click.Context, job_id: str, why: str | None) -> None:
        job = getattr(_jobs(ctx), action)(job_id, Actor.of(why=why))
        click.echo(_line(job))
    return command


pause, resume, cancel = _act("pause"), _act("resume"), _act("cancel")


@jobs.command(cls=CeleryCommand)
@click.argument("job_id")
@click.option("--every", type=click.FloatRange(min=0.05), default=1.0, show_default=True, help="Seconds per line.")
@click.option("--take-over/--no-take-over", default=True, show_default=True,
              help="Run the job here when its owner's lease expired (the owner died).")
@json_option
@click.pass_context
def follow(ctx: click.Context, job_id: str, every: float, take_over: bool, as_json: bool) -> None:
    """Print JOB_ID's progress until it ends; take it over if its owner died."""
    handle = _jobs(ctx)
    while True:
        job = handle.get(job_id)
        if job is None:
            raise Failure(f"no job {job_id} (ended jobs are kept for a week)")
        if as_json:
            echo_json([job.as_dict()])
        else:
            click.echo(_line(job))
        if job.ended:
            return
        if take_over and job.lease_until < handle.op.clock():
            JobRunner(handle).run(job_id)   # nobody runs it: this process does, then prints how it ended
            continue
        time.sleep(every)
