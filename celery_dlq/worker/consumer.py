"""Consumer bootstep that dead-letters messages Celery would otherwise discard.

Celery rejects (deletes, on Redis) a message naming an unregistered task, an
invalid message and a message of an unknown format, and acknowledges one it
cannot decode. :class:`DeadLetterDiscards` wraps those consumer callbacks so
the raw message is dead-lettered first (``unknown_task`` /
``invalid_message``). It also validates the ``dlq_*`` settings (a bad one
stops the worker at start, with the setting's name) and, when the consumer
closes, takes back the delivery counts of reserved messages that never
started. It also switches the worker's broker connections to celery-dlq's
Redis transport (:mod:`celery_dlq.worker.transport`) before they connect.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from celery import bootsteps

from celery_dlq import headers as H
from celery_dlq.errors import ConfigurationError
from celery_dlq.headers import Reason
from celery_dlq.message import queue_of
from celery_dlq.worker.einfo import compact_tracebacks
from celery_dlq.worker.poolfix import keep_half_done_io
from celery_dlq.worker.runtime import Runtime
from celery_dlq.worker.strategy import uncount_unstarted
from celery_dlq.worker.transport import use_in_worker

logger = logging.getLogger(__name__)


class DeadLetterDiscards(bootsteps.StartStopStep):
    """Validates settings and wraps the consumer's discard paths (before the loop starts).

    ``runtime`` is set by :func:`~celery_dlq.worker.install.install` on the
    subclass it adds to the app's consumer blueprint (:meth:`bound`).
    """

    runtime: Runtime

    @classmethod
    def bound(cls, runtime: Runtime) -> type[DeadLetterDiscards]:
        """This step for one app's runtime (same step name, so Celery sees one step)."""
        return type(cls.__name__, (cls,), {"__module__": cls.__module__, "runtime": runtime})

    def __init__(self, c: Any, **kwargs: Any) -> None:
        try:
            self.runtime.validate()
            self.runtime.settings.redis_url   # a worker needs the store, even where install() did not
        except ConfigurationError as exc:
            # One line naming the setting, exit status 1: not a traceback through Celery's bootsteps.
            raise SystemExit(f"celery-dlq: the worker cannot start: {exc}") from None
        for warning in self.runtime.capped_delay_warnings():
            logger.warning("celery-dlq: %s", warning)
        use_in_worker(c.app, self.runtime)   # before the Connection step connects
        controller = getattr(c, "controller", None)
        keep_half_done_io(getattr(controller, "hub", None), getattr(controller, "pool", None))
        compact_tracebacks()   # before the pool forks: failed tasks stop copying whole position tables
        c.on_unknown_task = self._wrap(c, c.on_unknown_task, Reason.UNKNOWN_TASK, body_first=True)
        c.on_invalid_task = self._wrap(c, c.on_invalid_task, Reason.INVALID_MESSAGE, body_first=True)
        c.on_unknown_message = self._wrap(c, c.on_unknown_message, Reason.INVALID_MESSAGE, body_first=True)
        c.on_decode_error = self._wrap(c, c.on_decode_error, Reason.INVALID_MESSAGE, body_first=False)
        c.blueprint.on_close = self._uncount_first(c.blueprint.on_close)
        super().__init__(c, **kwargs)

    def _uncount_first(self, original: Callable | None) -> Callable:
        """Wrap the consumer's ``on_close``, which forgets the reserved requests that never started.

        It runs when the consumer closes (warm shutdown, lost connection),
        before any step's ``stop``: the last moment the unstarted requests are
        known. Their messages go back to the broker, so their counts go back too.
        """
        runtime = self.runtime

        def on_close() -> Any:
            try:
                uncount_unstarted(runtime)
            except Exception:
                logger.exception("celery-dlq: could not take back the delivery counts of unstarted messages")
            return original() if original is not None else None

        return on_close

    def _wrap(self, c: Any, original: Callable, reason: str, *, body_first: bool) -> Callable:
        def dead_letter_first(*args: Any) -> Any:
            message = args[1] if body_first else args[0]
            exc = args[2] if body_first and len(args) > 2 else (args[1] if not body_first else None)
            if not self._dead_letter(c, message, reason, exc):
                return None  # left unacknowledged: the broker will deliver it again
            return original(*args)

        dead_letter_first.__name__ = getattr(original, "__name__", "handler")
        return dead_letter_first

    def _dead_letter(self, c: Any, message: Any, reason: str, exc: Any) -> bool:
        queue = queue_of(c.app, message.delivery_info)
        headers = message.headers if isinstance(message.headers, dict) else {}
        failure = H.describe_exception(exc, "") if exc is not None else \
            {"type": "", "message": f"message of unknown format on {queue!r}", "traceback": ""}
        try:
            ctx = self.runtime.context(headers.get("task") or "unknown", message, headers)
            self.runtime.dead_letter(ctx.envelope, delivery=ctx.delivery, policy=ctx.policy, reason=reason,
                                     failure=failure, worker=c.hostname)
        except Exception:
            logger.exception("celery-dlq: could not dead-letter a %s message from %r; "
                             "leaving it unacknowledged", reason, queue)
            return False
        return True
