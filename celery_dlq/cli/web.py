"""The verb that serves the web dashboard: ``web``.

Starlette, Jinja2 and uvicorn are imported when the verb runs, not when
Celery loads the ``dlq`` group (which it does for every command, ``celery
worker`` included).
"""
from __future__ import annotations

import logging

import click
from celery.bin.base import CeleryCommand

from celery_dlq.cli.base import Failure, dlq

DEFAULT_PORT = 5580


@dlq.command(cls=CeleryCommand)
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True, help="TCP port.")
@click.option("--bind", default="127.0.0.1", show_default=True,
              help="Address to listen on; 0.0.0.0 for every interface (then put TLS in front).")
@click.option("--basic-auth", "basic_auth", multiple=True, metavar="USER:PASSWORD",
              help="A user allowed in; repeat for several. Or a token: CELERY_DLQ_WEB_TOKEN / dlq_web_token.")
@click.option("--read-only", is_flag=True, help="Show everything, change nothing: no replay, purge or redeliver.")
@click.option("--no-auth", is_flag=True, help="No login at all; only with --bind 127.0.0.1.")
@click.option("--refresh", type=click.IntRange(min=0), default=10, show_default=True,
              help="Seconds between the overview's reloads (0: never).")
@click.pass_context
def web(ctx: click.Context, port: int, bind: str, basic_auth: tuple[str, ...], read_only: bool, no_auth: bool,
        refresh: int) -> None:
    """Serve the web dashboard of the DLQs and parked retries on http://BIND:PORT/."""
    try:
        from celery_dlq.web.app import create_app
        from celery_dlq.web.serve import check_bind, serve
    except ImportError as exc:
        raise Failure(f"the dashboard needs the web extra: pip install 'celery-dlq[web]' ({exc})") from None
    check_bind(bind, no_auth)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="[%(asctime)s: %(levelname)s] %(message)s")
    app = create_app(ctx.obj.app, basic_auth=basic_auth, read_only=read_only, no_auth=no_auth, refresh=refresh)
    where = app.state.where
    logging.getLogger(__name__).info(
        "celery-dlq web: http://%s:%s/ (%s%s), broker %s, store %s", bind, port,
        "no auth" if no_auth else "login required", ", read-only" if read_only else "",
        where["broker"], where["dlq_redis_url"])
    serve(app, bind=bind, port=port)
