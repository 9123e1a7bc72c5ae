"""Dead-letter what Celery would discard: the wrappers of the consumer's discard callbacks and of its close.

Celery rejects (deletes, on Redis) a message naming an unregistered task,
an invalid message and a message of an unknown format, and acknowledges one
it cannot decode. :func:`dead_letter_first` wraps one of those consumer
callbacks so the raw message is dead-lettered first (``unknown_task`` /
``invalid_message``); :func:`uncount_first` wraps the consumer's
``on_close`` so the delivery counts of reserved messages that never
started are taken back. The bootsteps in :mod:`celery_dlq.worker.steps`
install them.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery_dlq import headers as H
from celery_dlq.message import queue_of
from celery_dlq.worker.config import Config
from celery_dlq.worker.connections import Connections
from celery_dlq.worker.run.strategy import uncount_unstarted

logger = logging.getLogger(__name__)


def uncount_first(config: Config, redis: Callable[[], Connections], original: Callable | None) -> Callable:
    """Wrap the consumer's ``on_close``, which forgets the reserved requests that never started.

    It runs when the consumer closes (warm shutdown, lost connection),
    before any step's ``stop``: the last moment the unstarted requests are
    known. Their messages go back to the broker, so their counts go back too.
    """

    def on_close() -> Any:
        try:
            uncount_unstarted(config, redis())
        except Exception:
            logger.exception("celery-dlq: could not take back the delivery counts of unstarted messages")
        return original() if original is not None else None

    return on_close


def dead_letter_first(config: Config, redis: Callable[[], Connections], c: Any, original: Callable, reason: str, *,
                      body_first: bool) -> Callable:
    """``original`` (a consumer discard callback), after the message is dead-lettered with ``reason``.

    ``body_first``: the callback takes ``(body, message, exc)``, else ``(message, exc)``.
    If the dead letter cannot be stored the message is left unacknowledged.
    """

    def handler(*args: Any) -> Any:
        message = args[1] if body_first else args[0]
        exc = args[2] if body_first and len(args) > 2 else (args[1] if not body_first else None)
        if not _dead_letter(config, redis, c, message, reason, exc):
            return None  # left unacknowledged: the broker will deliver it again
        return original(*args)

    handler.__name__ = getattr(original, "__name__", "handler")
    return handler


def _dead_letter(config: Config, redis: Callable[[], Connections], c: Any, message: Any, reason: str,
                 exc: Any) -> bool:
    queue = queue_of(c.app, message.delivery_info)
    headers = message.headers if isinstance(message.headers, dict) else {}
    failure = H.describe_exception(exc, "") if exc is not None else \
        {"type": "", "message": f"message of unknown format on {queue!r}", "traceback": ""}
    try:
        ctx = config.context(headers.get("task") or "unknown", message, headers)
        redis().dead_letter(ctx.envelope, delivery=ctx.delivery, policy=ctx.policy, reason=reason,
                            failure=failure, worker=c.hostname)
    except Exception:
        logger.exception("celery-dlq: could not dead-letter a %s message from %r; "
                         "leaving it unacknowledged", reason, queue)
        return False
    return True
