"""The verbs of the web dashboard: ``web`` serves it, ``web-passwd`` hashes a password, ``web-sessions`` lists
and revokes logins.

Starlette, Jinja2 and uvicorn are imported when a verb runs, not when
Celery loads the ``dlq`` group (which it does for every command, ``celery
worker`` included).
"""
from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

import click
from celery.bin.base import CeleryCommand

from celery_dlq.cli.base import Failure, dlq, operator
from celery_dlq.ops.audit import Audit

DEFAULT_PORT = 5580
ROLES = ("viewer", "operator", "admin")
logger = logging.getLogger(__name__)


def _web() -> Any:
    """The dashboard's modules, or a one-line error naming the extra to install."""
    try:
        from celery_dlq.web import app, origin, serve, sessions, users
    except ImportError as exc:
        raise Failure(f"the dashboard needs the web extra: pip install 'celery-dlq[web]' ({exc})") from None
    return app, origin, serve, sessions, users


@dlq.command(cls=CeleryCommand)
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True, help="TCP port.")
@click.option("--bind", default="127.0.0.1", show_default=True,
              help="Address to listen on; 0.0.0.0 for every interface (then put TLS in front).")
@click.option("--users-file", type=click.Path(dir_okay=False), metavar="PATH",
              help="Users, one user:password or user:role:password a line (passwords plain or hashed with "
                   "web-passwd). Or CELERY_DLQ_WEB_USERS, the same lines.")
@click.option("--basic-auth", "basic_auth", multiple=True, metavar="USER:[ROLE:]PASSWORD",
              help="A user allowed in; repeat for several. Shows the password in the process list: "
                   "prefer --users-file. Or a token: CELERY_DLQ_WEB_TOKEN / dlq_web_token.")
@click.option("--token-role", type=click.Choice(ROLES), default="admin", show_default=True,
              help="The role of the token login.")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME[:PORT]",
              help="A Host header to serve besides the bound address and localhost; repeat for several.")
@click.option("--trusted-proxy", "trusted_proxies", multiple=True, metavar="ADDR",
              help="A proxy (address or network) whose X-Forwarded-For/-Proto are believed; repeat for several.")
@click.option("--read-only", is_flag=True, help="Everyone is a viewer: no replay, purge or redeliver.")
@click.option("--no-auth", is_flag=True, help="No login at all; only with --bind 127.0.0.1.")
@click.option("--refresh", type=click.IntRange(min=0), default=10, show_default=True,
              help="Seconds between the overview's reloads (0: never).")
@click.option("--take-over-jobs", type=click.FloatRange(min=0), default=0, show_default=True, metavar="SECONDS",
              help="Also run redrive jobs whose process died, looking this often (0: only the jobs it starts).")
@click.pass_context
def web(ctx: click.Context, port: int, bind: str, basic_auth: tuple[str, ...], allowed_hosts: tuple[str, ...],
        trusted_proxies: tuple[str, ...], no_auth: bool, **options: Any) -> None:
    """Serve the web dashboard of the DLQs and parked retries on http://BIND:PORT/."""
    app_module, origin, serve, _, _ = _web()
    serve.check_bind(bind, no_auth)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="[%(asctime)s: %(levelname)s] %(message)s")
    if basic_auth:
        logger.warning("celery-dlq web: --basic-auth shows its passwords to anyone who can list processes "
                       "(ps, /proc); prefer --users-file or CELERY_DLQ_WEB_USERS")
    hosts = origin.bind_hosts(bind, port) if port else list(origin.LOOPBACK_HOSTS)
    app = app_module.create_app(ctx.obj.app, basic_auth=basic_auth, no_auth=no_auth,
                                allowed_hosts=[*hosts, *allowed_hosts], trusted_proxies=trusted_proxies,
                                users_file=options["users_file"], token_role=options["token_role"],
                                read_only=options["read_only"], refresh=options["refresh"],
                                take_over_jobs=options["take_over_jobs"] or None)
    where = app.state.where
    logger.info("celery-dlq web: http://%s:%s/ (%s%s), %d user(s), broker %s, store %s", bind, port,
                "no auth" if no_auth else "login required", ", read-only" if options["read_only"] else "",
                len(app.state.access.users), where["broker"], where["dlq_redis_url"])
    serve.serve(app, bind=bind, port=port)


@dlq.command("web-passwd", cls=CeleryCommand)
@click.argument("user")
@click.option("--role", type=click.Choice(ROLES), default="viewer", show_default=True)
def web_passwd(user: str, role: str) -> None:
    """Print a --users-file line for USER, the password (asked twice, never echoed) hashed with PBKDF2-SHA256."""
    *_, users = _web()
    password = click.prompt("Password", hide_input=True, confirmation_prompt=True, err=True)
    line = f"{user}:{role}:{users.hash_password(password)}"
    users.parse_user(line)   # the same rules as the file: a reserved or empty name is refused here
    click.echo(line)


@dlq.command("web-sessions", cls=CeleryCommand)
@click.option("--revoke", metavar="USER", help="End every session of USER, in every dashboard process.")
@click.pass_context
def web_sessions(ctx: click.Context, revoke: str | None) -> None:
    """List the dashboard's live logins (user, since, until, address), or revoke a user's."""
    *_, sessions, _ = _web()
    op = operator(ctx)
    store = sessions.Sessions(op.web_sessions)
    if revoke:
        n = store.revoke(revoke, audit=Audit(op))
        logger.warning("celery-dlq web: revoked %d session(s) of user %r (celery dlq web-sessions)", n, revoke)
        click.echo(f"revoked {n} session(s) of {revoke}")
        return
    for s in store.list():
        since, until = (datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S") for t in
                        (s.created, s.expires))
        click.echo(f"{s.user}\t{since} UTC\tuntil {until} UTC\t{s.address or '-'}")
