"""``create_app(celery_app, ...)``: the dashboard as an ASGI app, to serve or to mount in a bigger site.

Starlette routes, Jinja2 templates, a stylesheet and one small script shipped
as package data (``web/templates``, ``web/static``). Pages are
:mod:`~celery_dlq.web.views`, actions :mod:`~celery_dlq.web.actions` and
:mod:`~celery_dlq.web.api`, all thin over the operator API
(:mod:`celery_dlq.ops`). Two middlewares run first:
:mod:`~celery_dlq.web.origin` (the ``Host`` check, trusted proxies, security
headers), then :mod:`~celery_dlq.web.middleware` (who, with which role). One
:class:`~celery_dlq.ops.operator.Operator` serves every request (redis-py
clients are thread-safe; Starlette runs the page functions in its thread pool).
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import redis
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from celery_dlq.errors import BrokerNotSupported, UnknownQueue
from celery_dlq.ops import Operator
from celery_dlq.ops.audit import AuditNotWritten
from celery_dlq.settings import web_token
from celery_dlq.urls import sanitize
from celery_dlq.web import actions, api, breakers, edit, jobs, views
from celery_dlq.web.auth import Access
from celery_dlq.web.jobs import DashboardJobs
from celery_dlq.web.middleware import AuthMiddleware, local_path
from celery_dlq.web.origin import LOOPBACK_HOSTS, Origin, OriginMiddleware
from celery_dlq.web.query import BadQuery
from celery_dlq.web.render import render, templates, unavailable
from celery_dlq.web.sessions import SESSION_TTL, Sessions
from celery_dlq.web.throttle import LOGIN_LIMIT, LOGIN_WINDOW, LoginThrottle
from celery_dlq.web.users import ADMIN, User, parse_users, read_users_file

#: The environment variable holding the dashboard's token (it wins over the ``dlq_web_token`` setting).
TOKEN_ENV = "CELERY_DLQ_WEB_TOKEN"
#: The environment variable holding users, one ``user[:role]:password`` a line (as a ``--users-file``).
USERS_ENV = "CELERY_DLQ_WEB_USERS"


def create_app(celery_app: Any, *, basic_auth: Iterable[str] = (), users_file: str | os.PathLike | None = None,
               token: str | None = None, token_role: str = ADMIN, read_only: bool = False, no_auth: bool = False,
               refresh: int = 10, operator: Operator | None = None, secret: bytes | None = None,
               allowed_hosts: Iterable[str] | None = None, trusted_proxies: Iterable[str] = (),
               session_ttl: int = SESSION_TTL, login_limit: int = LOGIN_LIMIT,
               login_window: int = LOGIN_WINDOW, take_over_jobs: float | None = None) -> Starlette:
    """The dashboard of ``celery_app``'s DLQs and parked retries, as a Starlette (ASGI) app.

    Users: ``basic_auth`` (``"user:password"`` or ``"user:role:password"``
    strings), the lines of ``users_file`` and of ``$CELERY_DLQ_WEB_USERS``
    (passwords plain or hashed, :mod:`~celery_dlq.web.users`). ``token``:
    else ``$CELERY_DLQ_WEB_TOKEN``, else the ``dlq_web_token`` setting; its
    role is ``token_role``. Without users or a token, ``no_auth=True`` must
    be given, and then only loopback clients are served. ``read_only``: everyone
    is a viewer. ``allowed_hosts``: the ``Host`` names served (``name`` any
    port, ``name:port``, ``*`` any; default: localhost, 127.0.0.1, [::1]).
    ``trusted_proxies``: addresses or networks whose ``X-Forwarded-For`` and
    ``X-Forwarded-Proto`` are believed. ``refresh``: seconds between the
    overview's reloads (0: never). ``secret`` signs CSRF tokens; give the
    same one to every process behind one load balancer (default: random).
    Sessions (``session_ttl`` seconds) and failed logins (``login_limit`` per
    ``login_window`` seconds) are kept in the DLQ store's Redis. Replays and
    purges run as jobs kept in Redis (``web/jobs.py``), run by this process;
    ``take_over_jobs``: also run, looking every that many seconds, the jobs
    whose process died (as a worker or ``celery dlq jobs run`` does).
    """
    token = token or os.environ.get(TOKEN_ENV) or web_token(celery_app.conf)
    access = Access(_users(basic_auth, users_file), token, no_auth, token_role=token_role, read_only=read_only,
                    **({"secret": secret} if secret else {}))
    origin = Origin(LOOPBACK_HOSTS if allowed_hosts is None else allowed_hosts, trusted_proxies)
    if origin.any_host and no_auth:
        raise ValueError("allowed_hosts '*' cannot go with no_auth: any web page could reach the dashboard "
                         "through DNS rebinding")
    op = operator if operator is not None else Operator(celery_app)
    sessions = Sessions(op.web_sessions, session_ttl)
    throttle = LoginThrottle(op.login_failures, login_limit, login_window)
    app = Starlette(
        routes=[*views.ROUTES, *actions.ROUTES, *api.ROUTES, *jobs.ROUTES, *edit.ROUTES, *breakers.ROUTES,
                Mount("/static", app=StaticFiles(packages=[("celery_dlq.web", "static")]), name="static")],
        middleware=[Middleware(OriginMiddleware, origin=origin),
                    Middleware(AuthMiddleware, access=access, sessions=sessions, throttle=throttle)],
        exception_handlers={HTTPException: _http_error, UnknownQueue: _not_found, BadQuery: _bad_query,
                            AuditNotWritten: _unaudited,
                            BrokerNotSupported: _unavailable, redis.RedisError: _unavailable},
    )
    app.state.op, app.state.access, app.state.jobs = op, access, DashboardJobs(op)
    if take_over_jobs:
        app.state.jobs.take_over(take_over_jobs)
    app.state.sessions, app.state.throttle, app.state.origin = sessions, throttle, origin
    app.state.read_only, app.state.refresh = read_only, refresh
    app.state.where = {"dlq_redis_url": op.settings.safe_redis_url,
                       "broker": sanitize(str(celery_app.conf.broker_url or ""))}
    app.state.templates = templates()
    return app


def _users(basic_auth: Iterable[str], users_file: str | os.PathLike | None) -> dict[str, User]:
    """Every source's users; a name in two sources is an error (which password would win is not obvious)."""
    sources = [parse_users(basic_auth), read_users_file(os.fspath(users_file)) if users_file else {},
               parse_users(os.environ.get(USERS_ENV, "").splitlines(), f"${USERS_ENV}")]
    users: dict[str, User] = {}
    for source in sources:
        twice = sorted(set(users) & set(source))
        if twice:
            raise ValueError(f"user {twice[0]!r} is given twice (--basic-auth, --users-file, ${USERS_ENV})")
        users.update(source)
    return users


def _error(request: Request, status: int, title: str, message: str) -> Response:
    """The error page, or ``{"error": message}`` on the JSON API."""
    if local_path(request).startswith("/api/"):
        return JSONResponse({"error": message}, status)
    return render(request, "error.html", status, title=title, message=message)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return _error(request, exc.status_code, {403: "Refused", 404: "Not found"}.get(exc.status_code, "Error"),
                  str(exc.detail))


async def _not_found(request: Request, exc: Exception) -> Response:
    return _error(request, 404, "Not found", str(exc))


async def _bad_query(request: Request, exc: Exception) -> Response:
    return _error(request, 400, "Bad filter", str(exc))


async def _unaudited(request: Request, exc: Exception) -> Response:
    """An action whose audit record could not be written (docs/operating.md: the audit fails closed)."""
    return _error(request, 503, "Not audited", f"{exc}. A parked retry's redelivery or deletion and a session "
                  "revoke are recorded first: they were refused, nothing changed. Other actions are recorded after "
                  "they run: look at what you acted on (the record is in the dashboard's log).")


async def _unavailable(request: Request, exc: Exception) -> Response:
    return unavailable(request, exc)


__all__ = ["create_app"]
