"""What changes state: log in and out, replay, purge, redeliver or delete parked retries, revoke sessions.

Every change is a POST whose form carries the CSRF token (:func:`posted`
refuses it otherwise) and, except the login and logout, is refused (and
logged) unless the user's role may take it (:mod:`~celery_dlq.web.roles`:
replay and redeliver need an operator, purge, delete and revoke an admin;
on a read-only dashboard everyone is a viewer). A replay or purge first
shows a confirmation (a GET) stating how many dead letters will move, then
runs as a job kept in Redis (:mod:`~celery_dlq.web.jobs`); a purge needs a
reason (``why``), kept in the audit trail with the user. What to act on is one of: the task ids
ticked (``id``), every dead letter matching the filter, or, with ``all``,
the whole DLQ, the same selections as ``celery dlq replay``/``purge``.
"""
from __future__ import annotations

import logging
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from celery_dlq.ops import DeadLetterQueue, NothingSelected, ReplayIntoItself, Selection, Selector
from celery_dlq.ops.audit import Actor, Audit
from celery_dlq.ops.jobs import DLQBusy
from celery_dlq.ops.queue import refuse_self_replay
from celery_dlq.web.auth import CSRF_COOKIE, CSRF_FIELD, SESSION_COOKIE
from celery_dlq.web.middleware import client_address, cookie_path
from celery_dlq.web.query import Query
from celery_dlq.web.render import href, render
from celery_dlq.web.roles import require
from celery_dlq.web.users import TOKEN_USER
from celery_dlq.web.views import named_dlq, next_path

logger = logging.getLogger(__name__)
VERBS = {"replay": "Replay", "purge": "Purge"}
PARKED_VERBS = ("redeliver", "delete")


async def posted(request: Request, action: str | None = None) -> FormData:
    """The POSTed form, once the role may take ``action`` (None: the login and logout) and its CSRF token is checked."""
    if action is not None:
        require(request, action)
    form = await request.form()
    if not request.app.state.access.csrf_ok(request.cookies.get(CSRF_COOKIE), form.get(CSRF_FIELD),
                                            getattr(request.state, "csrf_binding", "")):
        logger.warning("celery-dlq web: refused %s %s to user %r: CSRF token missing or wrong", request.method,
                       request.url.path, getattr(request.state, "user", None))
        raise HTTPException(403, "CSRF token missing or wrong: reload the page and try again (nothing was changed)")
    return form


class Action:
    """An action's verb, its :class:`celery_dlq.ops.Selection` (ticked ids, the filter's matches, or ``all``)
    read from a form or query string, and a replay's ``to``."""

    def __init__(self, params: Any, verb: str) -> None:
        if verb not in VERBS:
            raise HTTPException(400, f"unknown action {verb!r}")
        self.verb, self.query = verb, Query.parse(params)
        self.to = (params.get("to") or "").strip() or None
        self.rate = _rate(params.get("rate"))
        try:
            self.chosen = Selection.of(params.getlist("id"), self.query.selection(), params.get("all") == "1")
        except NothingSelected:
            raise HTTPException(400, "say which dead letters: tick some, filter, or choose all") from None
        self.ids, self.everything = list(self.chosen.ids), self.chosen.everything

    def where(self) -> Selector | None:
        """What the action passes to the DLQ: replay the oldest of each id, purge every one."""
        return self.chosen.selector(every=self.verb == "purge")

    def describe(self, dead: DeadLetterQueue) -> str:
        if self.ids or not self.query.values:
            what = self.chosen.describe()
        else:   # the filter as typed (``since=2h``), not as read
            what = "every dead letter matching " + ", ".join(f"{k}={v}" for k, v in self.query.values.items())
        return f"{VERBS[self.verb]} {what} of {dead.name}" + (f" to {self.to}" if self.to else "")


def confirm_page(request: Request) -> Response:
    """How many dead letters the action will move, and the button that does it."""
    verb = request.query_params.get("action", "")
    require(request, verb if verb in VERBS else "replay")
    dead = named_dlq(request, request.path_params["name"])
    selection = Action(request.query_params, verb)
    return render(request, "confirm.html", dead=dead, selection=selection, count=dead.count(selection.where()),
                  title=selection.describe(dead))


async def act(request: Request) -> Response:
    """Start the replay or purge the confirmation page posted, and show its job."""
    verb = request.path_params["verb"]
    form = await posted(request, verb if verb in VERBS else "replay")
    job = await start(request, request.path_params["name"], Action(form, verb), _expected(form),
                      str(form.get("why") or ""))
    return RedirectResponse(href(request, f"/jobs/{job.job_id}"), 303)


async def start(request: Request, name: str, selection: Action, expected: int | None, why: str = "") -> Any:
    """Start ``selection``'s replay or purge of DLQ ``name`` as a job in Redis, run by this process (the role was
    checked); a purge needs ``why``, recorded in the audit trail with the user."""
    verb, op = selection.verb, request.app.state.op
    dead = await run_in_threadpool(named_dlq, request, name)
    if verb == "replay":
        try:
            refuse_self_replay(dead.name, selection.to)
        except ReplayIntoItself as exc:
            raise HTTPException(400, str(exc)) from None
        await run_in_threadpool(known_target, op, selection.to)
    why = why.strip()
    if verb == "purge" and not why:
        raise HTTPException(400, "say why you purge (the reason is kept in the audit trail): nothing was deleted")
    try:   # ticked ids nobody found come back in the job's ``not_found``
        return await run_in_threadpool(lambda: request.app.state.jobs.start(
            dead.name, selection.chosen, verb=verb, actor=Actor(request.state.user, why), to=selection.to,
            title=selection.describe(dead), total=expected, rate=selection.rate))
    except DLQBusy as exc:
        raise HTTPException(409, f"{exc} (job {exc.holder}: {href(request, '/jobs/' + exc.holder)})") from None


def known_target(op: Any, to: str | None) -> None:
    """Go on if a replay's ``to`` is a queue the app knows: declared (``task_queues``, the default queue), named
    by ``task_routes``, or a list kombu holds now; else 400. Any other name would make the broker hold a new
    list nobody consumes, or feed a list that is no queue."""
    if to is None:
        return
    app = op.app
    if to in app.amqp.queues or to == app.conf.task_default_queue or to in routed_queues(app.conf.task_routes):
        return
    if op.depth(to):
        return
    raise HTTPException(400, f"replay to {to[:200]!r}: not a queue this app declares, routes to or finds in the "
                             "broker (nothing was replayed)")


def routed_queues(routes: Any) -> set[str]:
    """The queue names ``task_routes`` gives (a mapping, or a list of mappings; routers that are functions name
    none that can be read)."""
    maps = [routes] if isinstance(routes, dict) else [r for r in routes or () if isinstance(r, dict)]
    out = set()
    for mapping in maps:
        for route in mapping.values():
            queue = route.get("queue") if isinstance(route, dict) else route
            name = getattr(queue, "name", queue)
            if isinstance(name, str):
                out.add(name)
    return out


def _rate(value: Any) -> float | None:
    """A replay's pace (letters a second; blank: no cap); 400 for anything but a number > 0."""
    text = str(value or "").strip()
    if not text:
        return None
    try:
        rate = float(text)
    except ValueError:
        rate = 0.0
    if not 0 < rate < float("inf"):
        raise HTTPException(400, f"rate is letters a second, a number > 0 (or blank: no cap), got {text[:50]!r}")
    return rate


def _expected(form: FormData) -> int | None:
    """The count the confirmation showed: only the progress page's "of N" (the job counts what it does)."""
    value = str(form.get("expected") or "")
    return int(value) if value.isdigit() else None


async def parked_action(request: Request) -> Response:
    """Redeliver a parked retry now, or delete it; an entry already gone is reported, not an error."""
    verb = request.path_params["verb"]
    form = await posted(request, verb if verb in PARKED_VERBS else "delete")
    entry_id = str(form.get("entry_id") or "")
    n = await act_on_parked(request, verb, entry_id)
    return render(request, "parked_done.html", verb=verb, entry_id=entry_id, n=n)


async def act_on_parked(request: Request, verb: str, entry_id: str) -> int:
    """Redeliver or delete one parked retry (the role was checked); how many entries it took (0: gone already)."""
    if verb not in PARKED_VERBS or not entry_id:
        raise HTTPException(400, "redeliver or delete one parked retry: entry_id is required")
    op = request.app.state.op
    audit, actor = Audit(op), Actor(request.state.user)
    if verb == "redeliver":
        n = await run_in_threadpool(lambda: op.parked.redeliver_now(entry_id, audit=audit, actor=actor))
    else:
        n = await run_in_threadpool(lambda: op.parked.delete(entry_id, force=True, audit=audit, actor=actor))
    logger.info("celery-dlq web: %s parked retry %s by %s: %d", verb, entry_id, request.state.user, n)
    return n


async def login(request: Request) -> Response:
    """Take a try (none left: refused unchecked), check the password, then start a session in Redis."""
    form = await posted(request)
    user, address = str(form.get("user") or "").strip(), client_address(request)
    target = next_path(str(form.get("next") or ""))
    state = request.app.state
    if not await run_in_threadpool(state.throttle.take, address, user):
        logger.warning("celery-dlq web: refused login of user %r from %s: too many failed logins", user[:200],
                       address)
        return render(request, "login.html", 429, next=target, token_user=TOKEN_USER,
                      error="too many failed logins: try again later")
    if not state.access.check_password(user, str(form.get("password") or "")):
        logger.warning("celery-dlq web: failed login for user %r from %s", user[:200], address)
        return render(request, "login.html", 401, next=target, error="wrong user or password",
                      token_user=TOKEN_USER)
    await run_in_threadpool(state.throttle.succeeded, address, user)
    await run_in_threadpool(state.sessions.end, request.cookies.get(SESSION_COOKIE))   # no session outlives a login
    session = await run_in_threadpool(state.sessions.create, user, address, state.access.tag(user))
    response = RedirectResponse(href(request, target), 303)
    response.set_cookie(SESSION_COOKIE, session, path=cookie_path(request),
                        httponly=True, samesite="strict", secure=request.url.scheme == "https")
    return response


async def logout(request: Request) -> Response:
    """End the session for every dashboard process (not only forget the cookie)."""
    await posted(request)
    await run_in_threadpool(request.app.state.sessions.end, request.cookies.get(SESSION_COOKIE))
    response = RedirectResponse(href(request, "/login"), 303)
    response.delete_cookie(SESSION_COOKIE, path=cookie_path(request))
    return response


def sessions_page(request: Request, revoked: int | None = None, revoked_user: str = "") -> Response:
    """Every live login (admins only), each with a button that revokes its user's sessions."""
    require(request, "revoke")
    access = request.app.state.access
    sessions = request.app.state.sessions.list()
    return render(request, "sessions.html", sessions=sessions, revoked=revoked, revoked_user=revoked_user,
                  roles={s.user: access.role(s.user) for s in sessions})


async def revoke(request: Request) -> Response:
    """End every session of the user posted, in every process (admins only)."""
    form = await posted(request, "revoke")
    user = str(form.get("user") or "").strip()
    if not user:
        raise HTTPException(400, "say whose sessions to revoke: user is required")
    n = await run_in_threadpool(lambda: request.app.state.sessions.revoke(
        user, audit=Audit(request.app.state.op), actor=Actor(request.state.user, str(form.get("why") or ""))))
    logger.warning("celery-dlq web: revoked %d session(s) of user %r, by %r", n, user, request.state.user)
    return await run_in_threadpool(sessions_page, request, n, user)


ROUTES = [
    Route("/dlq/{name}/confirm", confirm_page, name="confirm"),
    Route("/dlq/{name}/{verb}", act, methods=["POST"], name="act"),
    Route("/parked/{verb}", parked_action, methods=["POST"], name="parked_action"),
    Route("/login", login, methods=["POST"], name="login_post"),
    Route("/logout", logout, methods=["POST"], name="logout"),
    Route("/sessions", sessions_page, name="sessions"),
    Route("/sessions/revoke", revoke, methods=["POST"], name="revoke"),
]
