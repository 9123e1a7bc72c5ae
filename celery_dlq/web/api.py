"""The JSON API for scripts: replay, purge, redeliver and delete as the pages do, with the same roles.

``POST /api/dlq/<dlq>/replay|purge`` takes ``{"ids": [...]}``, ``{"filter":
{"task": "shop.*", ...}}`` (the names of ``celery dlq list``'s filters) or
``{"all": true}``, ``"to"`` and ``"rate"`` (letters a second) for a replay, ``"why"`` (required for a purge);
it starts the job and answers 202 with its id. ``GET /api/jobs/<id>`` tells how
far it got; ``POST /api/jobs/<id>/pause|resume|cancel`` acts on it.
``POST /api/parked/redeliver|delete`` takes ``{"entry_id": ...}``.

Authentication is the dashboard's (an ``Authorization`` header, or a
session); roles as on the pages (:mod:`~celery_dlq.web.roles`). Instead of
a CSRF token, every POST must be ``Content-Type: application/json``: a form
on another site cannot send that, and a script on another site would need a
CORS preflight, which this app never grants.
"""
from __future__ import annotations

import json
import logging
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import ImmutableMultiDict
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from celery_dlq.errors import DLQError
from celery_dlq.ops.audit import Actor, AuditNotWritten
from celery_dlq.ops.jobs import JobStateError
from celery_dlq.web.actions import PARKED_VERBS, VERBS, Action, act_on_parked, start
from celery_dlq.web.jobs import JOB_ACTIONS, NO_SUCH_JOB, require_job
from celery_dlq.web.query import FILTERS
from celery_dlq.web.render import href
from celery_dlq.web.roles import require

logger = logging.getLogger(__name__)


async def body(request: Request, action: str) -> dict:
    """The JSON object POSTed, once the role may take ``action`` and the content type rules out a cross-site form."""
    require(request, action)
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
        logger.warning("celery-dlq web: refused %s %s to user %r: not application/json (CSRF)", request.method,
                       request.url.path, request.state.user)
        raise HTTPException(403, "CSRF: the API takes Content-Type: application/json only (nothing was changed)")
    try:
        data = json.loads(await request.body() or b"{}")
    except ValueError:
        raise HTTPException(400, "the body is not JSON") from None
    if not isinstance(data, dict):
        raise HTTPException(400, "the body must be a JSON object")
    return data


def selection_params(data: dict) -> ImmutableMultiDict:
    """A JSON action's selection as the query parameters the pages send (one
    :class:`~celery_dlq.web.actions.Action` for both)."""
    filters = data.get("filter") or {}
    if not isinstance(filters, dict) or not isinstance(data.get("ids") or [], list):
        raise HTTPException(400, '"filter" must be an object and "ids" a list')
    unknown = sorted(set(filters) - set(FILTERS)) + sorted(set(data) - {"ids", "filter", "all", "to", "why", "rate"})
    if unknown:   # a typo must not widen the selection nor pass unnoticed
        raise HTTPException(400, f"unknown field {unknown[0]!r}: the body takes ids, filter ({', '.join(FILTERS)}), "
                                 "all, to, why, rate")
    items: list[tuple[str, Any]] = [("id", str(i)) for i in data.get("ids") or []]
    items += [(str(k), str(v)) for k, v in filters.items()]
    if data.get("all") is True:
        items.append(("all", "1"))
    if data.get("to"):
        items.append(("to", str(data["to"])))
    if data.get("rate") is not None:
        items.append(("rate", str(data["rate"])))
    return ImmutableMultiDict(items)


async def dlq_action(request: Request) -> Response:
    verb = request.path_params["verb"]
    data = await body(request, verb if verb in VERBS else "replay")
    job = await start(request, request.path_params["name"], Action(selection_params(data), verb), None,
                      str(data.get("why") or ""))
    return JSONResponse({"job_id": job.job_id, "title": job.title, "url": href(request, f"/api/jobs/{job.job_id}")},
                        202)


async def job_action(request: Request) -> Response:
    """``POST /api/jobs/<id>/pause|resume|cancel`` (``{"why": ...}`` optional): the job as it is then."""
    action, job_id = request.path_params["action"], request.path_params["job_id"]
    data = await body(request, "job")
    await run_in_threadpool(require_job, request, job_id)
    if action not in JOB_ACTIONS:
        raise HTTPException(400, f"unknown job action {action!r}")
    try:
        await run_in_threadpool(getattr(request.app.state.jobs.jobs, action), job_id,
                                Actor(request.state.user, str(data.get("why") or "")))
    except JobStateError as exc:
        raise HTTPException(409, str(exc)) from None
    except AuditNotWritten:
        raise
    except DLQError as exc:   # no such job
        raise HTTPException(404, str(exc)) from None
    return job_status(request)


async def parked_action(request: Request) -> Response:
    verb = request.path_params["verb"]
    data = await body(request, verb if verb in PARKED_VERBS else "delete")
    entry_id = str(data.get("entry_id") or "")
    return JSONResponse({"verb": verb, "entry_id": entry_id, "n": await act_on_parked(request, verb, entry_id)})


def job_status(request: Request) -> Response:
    job = request.app.state.jobs.get(request.path_params["job_id"])
    if job is None:
        raise HTTPException(404, NO_SUCH_JOB)
    snapshot = job.refresh()
    c = snapshot.counts
    return JSONResponse({**snapshot.as_dict(), "job_id": job.job_id, "verb": job.verb, "user": snapshot.who,
                         "running": not snapshot.ended, "missing": c["missing"] + len(snapshot.not_found_ids),
                         "not_found": snapshot.not_found_ids, "failed": c["failed"],
                         "error": snapshot.reason if snapshot.state == "failed" else None})


ROUTES = [
    Route("/api/dlq/{name}/{verb}", dlq_action, methods=["POST"], name="api_dlq_action"),
    Route("/api/parked/{verb}", parked_action, methods=["POST"], name="api_parked_action"),
    Route("/api/jobs/{job_id}", job_status, name="api_job"),
    Route("/api/jobs/{job_id}/{action}", job_action, methods=["POST"], name="api_job_action"),
]
