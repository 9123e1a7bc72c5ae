"""Edit before replay on the dashboard: a form with a letter's args, kwargs and headers, checked, then replayed.

The form (operators only) shows the arguments as JSON when ``accept_content`` lets them be decoded;
what is posted is read as JSON by :mod:`celery_dlq.ops.edit` (a mistake is shown on the form, 400,
nothing moved), a reason is required, and the one letter is replayed edited with its original kept
in the audit trail (``ops/edit.py``: the body re-encoded with its own serializer only).
"""
from __future__ import annotations

import json
import logging
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from celery_dlq.ops.audit import Actor
from celery_dlq.ops.edit import BadEdit, Edit, parse_json, replay_edited
from celery_dlq.web.actions import known_target, posted
from celery_dlq.web.render import render
from celery_dlq.web.roles import require
from celery_dlq.web.views import NEVER_DECODED, displayed, letter_task_id, named_dlq

logger = logging.getLogger(__name__)


def _letter(request: Request) -> tuple[Any, Any]:
    """The DLQ and the letter of the URL, the letter never decoded with pickle (``views.displayed``): the form
    edits its headers only, then."""
    dead = named_dlq(request, request.path_params["name"])
    task_id = letter_task_id(request)
    letter = dead.get(task_id)
    if letter is None:
        raise HTTPException(404, f"no dead letter of task {task_id} in {dead.name}: "
                                 "it was replayed or purged (perhaps by someone else)")
    return dead, displayed(letter)


def _form(letter: Any, values: Any = None) -> dict:
    """The form's fields: what was posted, else the letter's own arguments as JSON."""
    if values is not None:
        return {name: str(values.get(name) or "") for name in ("args", "kwargs", "headers", "why", "to")}
    arguments = letter.arguments()
    return {"args": json.dumps(arguments[0]) if arguments else "", "kwargs": json.dumps(arguments[1]) if arguments
            else "", "headers": "{}", "why": "", "to": ""}


def edit_page(request: Request) -> Response:
    """The form, prefilled with the letter's arguments (when they can be decoded)."""
    require(request, "edit")
    dead, letter = _letter(request)
    return render(request, "edit.html", dead=dead, letter=letter, form=_form(letter), error=None)


def _edit(task_id: str, form: dict) -> Edit:
    """The :class:`Edit` the form asks for; a blank field keeps that part as it was."""
    headers = parse_json(form["headers"], "headers", dict) if form["headers"].strip() else {}
    return Edit(task_id, args=parse_json(form["args"], "args", list) if form["args"].strip() else None,
                kwargs=parse_json(form["kwargs"], "kwargs", dict) if form["kwargs"].strip() else None,
                headers=headers)


async def edit_replay(request: Request) -> Response:
    """Replay the letter edited; a bad field or a missing reason shows the form again (400), nothing moved."""
    posted_form = await posted(request, "edit")
    dead, letter = await run_in_threadpool(_letter, request)
    form = _form(letter, posted_form)
    try:
        if not form["why"].strip():
            raise BadEdit("say why you edit this letter (the reason is kept in the audit trail)")
        edit = _edit(letter.task_id, form)
        if (edit.args is not None or edit.kwargs is not None) and letter.content_type in NEVER_DECODED:
            raise BadEdit(f"the dashboard never decodes {letter.content_type}: edit its headers here, its "
                          "arguments with celery dlq edit")
        known_target(request.app.state.op, form["to"].strip() or None)
        out = await run_in_threadpool(replay_edited, dead, edit, Actor(request.state.user, form["why"]),
                                      to=form["to"].strip() or None)
    except BadEdit as exc:
        return render(request, "edit.html", 400, dead=dead, letter=letter, form=form, error=str(exc))
    logger.info("celery-dlq web: edited replay of %s from %s by %s: %d", letter.task_id, dead.name,
                request.state.user, out.done)
    return render(request, "edit_done.html", dead=dead, letter=letter, out=out)


ROUTES = [
    Route("/dlq/{name}/letters/{task_id}/edit", edit_page, name="edit"),
    Route("/dlq/{name}/letters/{task_id}/edit", edit_replay, methods=["POST"], name="edit_replay"),
]
