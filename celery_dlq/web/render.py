"""Templates and the one way a page is rendered (links that work wherever the app is mounted)."""
from __future__ import annotations

from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from celery_dlq.errors import BrokerNotSupported
from celery_dlq.web.auth import CSRF_FIELD
from celery_dlq.web.format import FILTERS
from celery_dlq.web.users import may


def templates() -> Jinja2Templates:
    """The package's templates (``celery_dlq/web/templates``), autoescaped, with :data:`format.FILTERS`."""
    env = Environment(loader=PackageLoader("celery_dlq.web", "templates"), autoescape=select_autoescape(),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(FILTERS)
    return Jinja2Templates(env=env)


def href(request: Request, path: str, query: str = "") -> str:
    """A link inside the dashboard, wherever it is mounted."""
    root = (request.scope.get("root_path") or "").rstrip("/")
    return f"{root}{path}" + (f"?{query}" if query else "")


def render(request: Request, template: str, status: int = 200, **context: Any) -> Response:
    """``template`` with ``context`` and what every page needs (user, role, what it may do, CSRF token, URLs)."""
    state = request.app.state
    role = getattr(request.state, "role", None)
    context.update(href=lambda path, query="": href(request, path, query),
                   user=getattr(request.state, "user", None), role=role, can=lambda action: may(role, action),
                   read_only=state.read_only, where=state.where if getattr(request.state, "user", None) else None,
                   csrf_field=CSRF_FIELD, csrf_token=state.access.csrf_token(
                       request.state.csrf_nonce, getattr(request.state, "csrf_binding", "")))
    return state.templates.TemplateResponse(request, template, context, status_code=status)


def unavailable(request: Request, exc: Exception) -> Response:
    """503: Redis (or the broker) cannot be read; the URLs (without passwords) only to a logged-in user: a public
    page (the login, a 503 before the session is read) never names the Redis hosts."""
    where = request.app.state.where
    hosts = f"; broker {where['broker']}, store {where['dlq_redis_url']}" if getattr(request.state, "user",
                                                                                       None) else ""
    message = str(exc) if isinstance(exc, BrokerNotSupported) else (
        f"cannot read Redis ({type(exc).__name__}){hosts}")
    return render(request, "error.html", 503, title="Redis unavailable", message=message)
