"""What the request's role may do (:data:`~celery_dlq.web.users.ACTIONS`), and the refusal, logged, when it may not.

Every action route, HTML or JSON, calls :func:`require` before it reads a
form or touches Redis; templates call :func:`can` (as ``can('purge')``) to
show only the buttons the role may use.
"""
from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request

from celery_dlq.web.users import may

logger = logging.getLogger(__name__)


def can(request: Request, action: str) -> bool:
    return may(getattr(request.state, "role", None), action)


def require(request: Request, action: str) -> None:
    """Go on if the request's role may take ``action``; else log it (WARNING) and answer 403."""
    if can(request, action):
        return
    user, role = getattr(request.state, "user", None), getattr(request.state, "role", None)
    logger.warning("celery-dlq web: refused %s to user %r (role %s): %s %s", action, user, role, request.method,
                   request.url.path)
    if request.app.state.access.read_only:
        raise HTTPException(403, "this dashboard is read-only: actions are disabled (nothing was changed)")
    raise HTTPException(403, f"your role ({role}) may not {action} (nothing was changed)")
