"""The ``celery dlq`` click group: errors as one line and an exit code, one operator per command line.

Registered through the ``celery.commands`` entry point, in the style of
``celery/bin/purge.py`` (``ctx.obj.app``, ``--force`` for destructive verbs).

Exit codes: 0 success; 1 partial failure, nothing matched, or Redis/broker
unusable; 2 bad usage (unknown queue, bad option, ``--force`` missing when
there is no terminal to ask on). Every error is one line on stderr.
"""
from __future__ import annotations

import sys
from typing import Any

import click
import redis

from celery_dlq.errors import BrokerNotSupported, ConfigurationError, DLQError, UnknownQueue
from celery_dlq.ops.operator import Operator
from celery_dlq.settings import DLQSettings

EXIT_FAILED, EXIT_USAGE = 1, 2


class Failure(click.ClickException):
    """One line on stderr (``Error: ...``) and an exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        vars(self)["exit_code"] = code   # per instance: click declares it on the class (a ClassVar to mypy)


def make_operator(app: Any) -> Operator:
    """The operator for ``app`` (tests replace this to inject clients)."""
    return Operator(app)


def _redis_urls(app: Any) -> str:
    try:
        return DLQSettings.from_conf(app.conf).safe_redis_url
    except Exception:
        return "(unknown URL)"


#: Old verb names, still accepted for a release and hidden from ``--help``.
ALIASES = {"delayed": "parked"}


class DLQGroup(click.Group):
    """Turns our errors and Redis errors into one line and an exit code; resolves :data:`ALIASES`."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, ALIASES.get(cmd_name, cmd_name))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (UnknownQueue, ConfigurationError, ValueError) as exc:
            raise Failure(str(exc), EXIT_USAGE) from None
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise Failure(f"cannot reach Redis at {_redis_urls(ctx.obj.app)}: {exc}") from None
        except (BrokerNotSupported, DLQError, redis.RedisError) as exc:
            raise Failure(str(exc)) from None


@click.group(name="dlq", cls=DLQGroup)
@click.pass_context
def dlq(ctx: click.Context, **kwargs: Any) -> None:
    """Inspect, replay and purge dead letters and parked retries (celery-dlq)."""


def operator(ctx: click.Context) -> Operator:
    """One operator per command line (``ctx.meta`` is shared by the whole context chain)."""
    if ctx.meta.get("dlq.operator") is None:
        ctx.meta["dlq.operator"] = make_operator(ctx.obj.app)
    return ctx.meta["dlq.operator"]


def confirm(what: str) -> None:
    """Celery's purge asks; with no terminal to ask on, refuse: a script must say --force."""
    if not sys.stdin.isatty():
        raise Failure(f"refusing to {what} without --force (nothing was deleted)", EXIT_USAGE)
    click.confirm(f"This will {what}. There is no undo. Continue?", abort=True)
