"""Every request passes here: who it is and with which role (or a redirect to the login), the CSRF nonce.

The ``Host`` check, the client address behind trusted proxies and the
security headers come first, in :mod:`~celery_dlq.web.origin`.
"""
from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

import redis
from starlette.concurrency import run_in_threadpool
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from celery_dlq.web.auth import CSRF_COOKIE, LOCAL_USER, SESSION_COOKIE, Access, csrf_binding, is_loopback, new_nonce
from celery_dlq.web.render import unavailable
from celery_dlq.web.sessions import Sessions
from celery_dlq.web.throttle import LoginThrottle

logger = logging.getLogger(__name__)

#: Reachable without logging in.
PUBLIC = ("/login", "/static/")


def cookie_path(request: Request) -> str:
    return (request.scope.get("root_path") or "").rstrip("/") + "/"


def local_path(request: Request) -> str:
    """The request's path inside the dashboard (without the mount point)."""
    root, path = request.scope.get("root_path") or "", request.url.path
    return path[len(root):] if root and path.startswith(root) else path


def client_address(request: Request) -> str:
    """The client's address (behind a trusted proxy, the one it forwarded: :mod:`~celery_dlq.web.origin`)."""
    return request.client.host if request.client else ""


class Refused(Exception):
    """A request answered here, not by a page: its response."""

    def __init__(self, response: Response) -> None:
        self.response = response


class AuthMiddleware(BaseHTTPMiddleware):
    """Sets ``request.state.user``, ``.role`` and ``.csrf_nonce``, or answers 303/401/403/429 itself."""

    def __init__(self, app: Any, access: Access, sessions: Sessions, throttle: LoginThrottle) -> None:
        super().__init__(app)
        self.access, self.sessions, self.throttle = access, sessions, throttle

    def user(self, request: Request) -> str | None:
        if self.access.no_auth:
            if getattr(request.state, "untrusted_forwarding", False):
                logger.warning("celery-dlq web: refused %s %s to %s: forwarded headers from a proxy not named with "
                               "--trusted-proxy", request.method, request.url.path, client_address(request))
                raise Refused(PlainTextResponse("forwarded headers from a proxy not named with --trusted-proxy: "
                                                "refused, since every client behind it would look local", 403))
            if getattr(request.state, "unforwarded", False):
                logger.warning("celery-dlq web: refused %s %s to %s: a trusted proxy sent no X-Forwarded-For",
                               request.method, request.url.path, client_address(request))
                raise Refused(PlainTextResponse("a trusted proxy sent no X-Forwarded-For: refused, since --no-auth "
                                                "would serve every client behind it as the proxy itself", 403))
            return LOCAL_USER if is_loopback(client_address(request)) else None
        if request.headers.get("authorization"):
            return self.from_header(request)
        found = self.sessions.lookup(request.cookies.get(SESSION_COOKIE))
        return found[0] if found and self.access.session_ok(*found) else None

    def from_header(self, request: Request) -> str | None:
        """The user an ``Authorization`` header proves, failures counted as the login form's are."""
        given = self.access.credentials(request.headers["authorization"])
        if given is None:
            return None
        user, password = given
        address = client_address(request)
        if not self.throttle.take(address, user):
            logger.warning("celery-dlq web: refused %s, user %r from %s: too many failed logins", request.url.path,
                           user, address)
            raise Refused(PlainTextResponse("too many failed logins: try again later", 429,
                                            {"Retry-After": str(self.throttle.window)}))
        if self.access.check_password(user, password):
            self.throttle.succeeded(address, user)
            return user
        logger.warning("celery-dlq web: wrong Authorization for user %r from %s", user, address)
        return None

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        nonce = request.cookies.get(CSRF_COOKIE)
        fresh = not nonce
        request.state.csrf_nonce = nonce = nonce or new_nonce()
        request.state.user = request.state.role = None
        request.state.csrf_binding = csrf_binding(None, request.cookies.get(SESSION_COOKIE))
        path = local_path(request)
        try:
            request.state.user = await run_in_threadpool(self.user, request)
            request.state.role = self.access.role(request.state.user)
            request.state.csrf_binding = csrf_binding(request.state.user, request.cookies.get(SESSION_COOKIE))
            if request.state.user is None and not path.startswith(PUBLIC):
                raise Refused(self.refuse(request, path))
            response = await call_next(request)
        except Refused as refused:
            response = refused.response
        except redis.RedisError as exc:  # sessions and login counts live in Redis
            response = unavailable(request, exc)
        if fresh:
            response.set_cookie(CSRF_COOKIE, nonce, path=cookie_path(request), httponly=True, samesite="strict",
                                secure=request.url.scheme == "https")
        return response

    def refuse(self, request: Request, path: str) -> Response:
        if self.access.no_auth:
            logger.warning("celery-dlq web: refused %s %s to %s: --no-auth serves loopback clients only",
                           request.method, path, client_address(request))
            return PlainTextResponse("this dashboard runs without authentication: loopback clients only", 403)
        if request.headers.get("authorization"):
            return PlainTextResponse("wrong credentials", 401, {"WWW-Authenticate": 'Basic realm="celery-dlq"'})
        if request.method in ("GET", "HEAD"):
            target = path + (f"?{request.url.query}" if request.url.query else "")
            root = (request.scope.get("root_path") or "").rstrip("/")
            return RedirectResponse(f"{root}/login?next={quote(target, safe='')}", 303)
        return PlainTextResponse("authentication required", 401, {"WWW-Authenticate": 'Basic realm="celery-dlq"'})
