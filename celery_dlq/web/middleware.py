"""Every request passes here: who it is (or a redirect to the login), the CSRF nonce, safe headers."""
from __future__ import annotations

from typing import Any
from urllib.parse import quote

from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from celery_dlq.web.auth import CSRF_COOKIE, SESSION_COOKIE, Access, is_loopback, new_nonce

#: Reachable without logging in.
PUBLIC = ("/login", "/static/")
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def cookie_path(request: Request) -> str:
    return (request.scope.get("root_path") or "").rstrip("/") + "/"


def local_path(request: Request) -> str:
    """The request's path inside the dashboard (without the mount point)."""
    root, path = request.scope.get("root_path") or "", request.url.path
    return path[len(root):] if root and path.startswith(root) else path


class AuthMiddleware(BaseHTTPMiddleware):
    """Sets ``request.state.user`` and ``request.state.csrf_nonce``, or answers 303/401/403 itself."""

    def __init__(self, app: Any, access: Access) -> None:
        super().__init__(app)
        self.access = access

    def user(self, request: Request) -> str | None:
        if self.access.no_auth:
            return "local" if is_loopback(request.client.host if request.client else None) else None
        if request.headers.get("authorization"):
            return self.access.from_header(request.headers["authorization"])
        return self.access.from_session(request.cookies.get(SESSION_COOKIE))

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        nonce = request.cookies.get(CSRF_COOKIE)
        fresh = not nonce
        request.state.csrf_nonce = nonce = nonce or new_nonce()
        request.state.user = self.user(request)
        path = local_path(request)
        if request.state.user is None and not path.startswith(PUBLIC):
            response = self.refuse(request, path)
        else:
            response = await call_next(request)
        if fresh:
            response.set_cookie(CSRF_COOKIE, nonce, path=cookie_path(request), httponly=True, samesite="strict",
                                secure=request.url.scheme == "https")
        for name, value in HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    def refuse(self, request: Request, path: str) -> Response:
        if self.access.no_auth:
            return PlainTextResponse("this dashboard runs without authentication: loopback clients only", 403)
        if request.headers.get("authorization"):
            return PlainTextResponse("wrong credentials", 401, {"WWW-Authenticate": 'Basic realm="celery-dlq"'})
        if request.method in ("GET", "HEAD"):
            target = path + (f"?{request.url.query}" if request.url.query else "")
            root = (request.scope.get("root_path") or "").rstrip("/")
            return RedirectResponse(f"{root}/login?next={quote(target, safe='')}", 303)
        return PlainTextResponse("authentication required", 401, {"WWW-Authenticate": 'Basic realm="celery-dlq"'})
