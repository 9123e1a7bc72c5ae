"""``create_app(celery_app, ...)``: the dashboard as an ASGI app, to serve or to mount in a bigger site.

Starlette routes, Jinja2 templates and a stylesheet shipped as package data
(``web/templates``, ``web/static``); no JavaScript. Pages are
:mod:`~celery_dlq.web.views`, actions :mod:`~celery_dlq.web.actions`, both
thin over the operator API (:mod:`celery_dlq.ops`). One
:class:`~celery_dlq.ops.operator.Operator` serves every request (redis-py
clients are thread-safe; Starlette runs the page functions in its thread pool).
"""
from __future__ import annotations

import os
from typing import Any, Iterable

import redis
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from celery_dlq.urls import sanitize
from celery_dlq.errors import BrokerNotSupported, UnknownQueue
from celery_dlq.ops.operator import Operator
from celery_dlq.settings import web_token
from celery_dlq.web import actions, views
from celery_dlq.web.auth import Access, parse_users
from celery_dlq.web.jobs import Jobs
from celery_dlq.web.middleware import AuthMiddleware
from celery_dlq.web.query import BadQuery
from celery_dlq.web.render import render, templates

#: The environment variable holding the dashboard's token (it wins over the ``dlq_web_token`` setting).
TOKEN_ENV = "CELERY_DLQ_WEB_TOKEN"


def create_app(celery_app: Any, *, basic_auth: Iterable[str] = (), token: str | None = None,
               read_only: bool = False, no_auth: bool = False, refresh: int = 10,
               operator: Operator | None = None, secret: bytes | None = None) -> Starlette:
    """The dashboard of ``celery_app``'s DLQs and parked retries, as a Starlette (ASGI) app.

    ``basic_auth``: ``"user:password"`` pairs; ``token``: else ``$CELERY_DLQ_WEB_TOKEN``,
    else the ``dlq_web_token`` setting. Without either, ``no_auth=True`` must
    be given, and then only loopback clients are served. ``read_only`` hides
    and refuses every action. ``refresh``: seconds between the overview's
    reloads (0: never). ``secret`` signs sessions and CSRF tokens; give the
    same one to every process behind one load balancer (default: random).
    """
    token = token or os.environ.get(TOKEN_ENV) or web_token(celery_app.conf)
    access = Access(parse_users(basic_auth), token, no_auth, **({"secret": secret} if secret else {}))
    op = operator if operator is not None else Operator(celery_app)
    app = Starlette(
        routes=[*views.ROUTES, *actions.ROUTES,
                Mount("/static", app=StaticFiles(packages=[("celery_dlq.web", "static")]), name="static")],
        middleware=[Middleware(AuthMiddleware, access=access)],
        exception_handlers={HTTPException: _http_error, UnknownQueue: _not_found, BadQuery: _bad_query,
                            BrokerNotSupported: _unavailable, redis.RedisError: _unavailable},
    )
    app.state.op, app.state.access, app.state.jobs = op, access, Jobs()
    app.state.read_only, app.state.refresh = read_only, refresh
    app.state.where = {"dlq_redis_url": op.settings.safe_redis_url,
                       "broker": sanitize(str(celery_app.conf.broker_url or ""))}
    app.state.templates = templates()
    return app


def _error(request: Request, status: int, title: str, message: str) -> Response:
    return render(request, "error.html", status, title=title, message=message)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return _error(request, exc.status_code, {403: "Refused", 404: "Not found"}.get(exc.status_code, "Error"),
                  str(exc.detail))


async def _not_found(request: Request, exc: Exception) -> Response:
    return _error(request, 404, "Not found", str(exc))


async def _bad_query(request: Request, exc: Exception) -> Response:
    return _error(request, 400, "Bad filter", str(exc))


async def _unavailable(request: Request, exc: Exception) -> Response:
    where = request.app.state.where
    message = str(exc) if isinstance(exc, BrokerNotSupported) else (
        f"cannot read Redis ({type(exc).__name__}); broker {where['broker']}, store {where['dlq_redis_url']}")
    return _error(request, 503, "Redis unavailable", message)


__all__ = ["create_app"]
