"""The circuit breakers page: every breaker, and pause or resume a task or failure group (operator role).

As a purge, a pause or resume is asked first (a GET that shows what it will
do), then POSTed with the CSRF token; a read-only dashboard refuses it
(:func:`~celery_dlq.web.roles.require`). Both go through
:class:`celery_dlq.ops.BreakerControls`, as ``celery dlq pause``/``resume`` do,
and record the dashboard user as who paused.
"""
from __future__ import annotations

import logging

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from celery_dlq.ops.audit import Actor
from celery_dlq.web.actions import posted
from celery_dlq.web.render import render
from celery_dlq.web.roles import require

logger = logging.getLogger(__name__)
VERBS = ("pause", "resume")


def _target(params) -> tuple[str, str, str | None, str | None]:
    verb, task = str(params.get("verb") or ""), str(params.get("task") or "").strip()
    if verb not in VERBS or not task:
        raise HTTPException(400, "pause or resume a task: verb (pause or resume) and task are required")
    queue = str(params.get("queue") or "").strip() or None
    group = str(params.get("group") or "").strip() or None
    return verb, task, queue, group


def breakers_page(request: Request) -> Response:
    rows = request.app.state.op.breakers.rows()
    return render(request, "breakers.html", rows=rows, confirm=None, done=None)


def confirm_page(request: Request) -> Response:
    verb, task, queue, group = _target(request.query_params)
    require(request, verb)
    controls = request.app.state.op.breakers
    found = controls.matching(task, queue=queue, group=group) if verb == "resume" else []
    if verb == "resume" and not found:
        raise HTTPException(404, f"no open or paused breaker of {task} to resume")
    confirm = {"verb": verb, "task": task, "queue": queue or "", "group": group or "",
               "held": sum(row.held for row in found), "breakers": len(found)}
    return render(request, "breakers.html", rows=controls.rows(task), confirm=confirm, done=None)


async def act(request: Request) -> Response:
    form = await posted(request, str(request.path_params["verb"]))
    verb, task, queue, group = _target({**form, "verb": request.path_params["verb"]})
    controls = request.app.state.op.breakers
    actor = Actor(f"{request.state.user} (dashboard)", str(form.get("why") or "").strip())
    if verb == "pause":
        await run_in_threadpool(lambda: controls.pause(task, queue=queue, group=group, actor=actor))
        done = f"Paused {task}: workers hold its new deliveries."
    else:
        closed, released = await run_in_threadpool(lambda: controls.resume(task, queue=queue, group=group,
                                                                           actor=actor))
        done = (f"Closed {closed} breaker(s) of {task}; {released} held deliveries released, "
                "behind the queue's other traffic.")
    logger.info("celery-dlq web: %s %s (queue %s, group %s) by %s", verb, task, queue, group, request.state.user)
    return render(request, "breakers.html", rows=controls.rows(), confirm=None, done=done)


ROUTES = [
    Route("/breakers", breakers_page, name="breakers"),
    Route("/breakers/confirm", confirm_page, name="breakers_confirm"),
    Route("/breakers/{verb}", act, methods=["POST"], name="breakers_act"),
]
