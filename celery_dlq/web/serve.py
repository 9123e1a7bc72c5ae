"""Serving the dashboard with uvicorn: what ``celery dlq web`` runs."""
from __future__ import annotations

import logging
from typing import Any

from celery_dlq.web.auth import is_loopback

logger = logging.getLogger(__name__)


def check_bind(bind: str, no_auth: bool) -> None:
    """``no_auth`` is allowed only on a loopback address: anyone who can reach the port could act."""
    if no_auth and not is_loopback(bind):
        raise ValueError(f"--no-auth is only allowed with --bind 127.0.0.1 (or ::1), not {bind}")


def serve(app: Any, *, bind: str, port: int, log_level: str = "info") -> None:
    """Run ``app`` until SIGINT/SIGTERM. uvicorn's access log shows paths, never credentials."""
    import uvicorn

    config = uvicorn.Config(app, host=bind, port=port, log_level=log_level, proxy_headers=False,
                            server_header=False, lifespan="off")
    uvicorn.Server(config).run()
