"""The worker's main-process half of the takeover: the Request subclass.

The request holds the raw kombu message and sees every outcome (ordinary
exceptions, ``Redeliver`` from the child, a lost worker process, a hard time
limit), so it is where the original message is parked or dead-lettered, and
only then acknowledged. If that write fails the message is left
unacknowledged for the broker to deliver again: nothing is dropped because
our own write failed. The features of the hook chain (``worker/middleware.py``)
hear of each outcome through the runtime's chain, once per event.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from billiard.exceptions import WorkerLostError
from celery import states
from celery.exceptions import Ignore, Reject, Retry, SoftTimeLimitExceeded, TimeLimitExceeded
from celery.utils.serialization import UnpickleableExceptionWrapper
from celery.worker.request import Request
from celery.worker.state import task_ready

from celery_dlq import headers as H
from celery_dlq.errors import MessageExpired
from celery_dlq.headers import Reason
from celery_dlq.internals.base import usable
from celery_dlq.internals.celery_worker import (
    EXPIRED_TAKEOVER,
    mark_revoked,
    request_context,
    revoked_expired,
    was_revoked_or_cancelled,
)
from celery_dlq.message import with_arguments
from celery_dlq.worker.config import MessageContext
from celery_dlq.worker.middleware import Letter
from celery_dlq.worker.run.events import failed_exception
from celery_dlq.worker.run.task import Redeliver
from celery_dlq.worker.runtime import runtime_of

logger = logging.getLogger(__name__)

#: When our own write (park, dead letter) fails: seconds before the first retry, and the most between two.
WRITE_RETRY_FIRST, WRITE_RETRY_MAX = 1.0, 60.0

_PASS_THROUGH = (Ignore, Reject, MemoryError)


def _unwrap(exc: Any) -> Any:
    return getattr(exc, "exc", exc) if type(exc).__name__ == "ExceptionWithTraceback" else exc


def _failure(exc: Any, traceback: str | None) -> dict[str, str]:
    if isinstance(exc, UnpickleableExceptionWrapper):
        return {"type": f"{exc.exc_module}.{exc.exc_cls_name}".removeprefix("builtins."),
                "message": H.truncate(str(exc.text) if hasattr(exc, "text") else str(exc.exc_args)),
                "traceback": H.truncate(traceback or "")}
    return H.describe_exception(exc, traceback or "")


class RedeliveryRequest(Request):
    """Parks or dead-letters the original message before acknowledging it."""

    _dlq_handled = False
    _dlq_write_attempts = 0
    #: Set by every outcome but success (Celery's per-task Request subclass overrides ``on_success``).
    _dlq_failed = False
    #: Once this request's message is dead-lettered: its letter (``dlq`` None: dropped).
    _dlq_letter: Letter | None = None

    # -- entry points from the pool ------------------------------------------

    def on_failure(self, exc_info, send_failed_event=True, return_ok=False):
        self._dlq_failed = True
        exc = _unwrap(exc_info.exception)
        if self._dlq_handled:  # a hard time limit reports twice
            return None
        if isinstance(exc, Redeliver):
            return self._dlq_redeliver(exc, exc_info, send_failed_event, return_ok)
        if isinstance(exc, WorkerLostError) and self._dlq_succeeded():
            # The child stored SUCCESS, then died (task_postrun, OOM killer):
            # Celery acknowledges; running it again would duplicate its effects.
            self._dlq_handled = True
            return super().on_failure(exc_info, send_failed_event, return_ok)
        if isinstance(exc, (WorkerLostError, TimeLimitExceeded)) or self._dlq_process_exit(exc):
            reason = Reason.TIME_LIMIT if isinstance(exc, TimeLimitExceeded) else Reason.WORKER_LOST
            return self._dlq_lost(exc, reason, exc_info, send_failed_event, return_ok)
        if isinstance(exc, Reject) and exc.requeue:
            # That delivery used up no attempt (worker/features/delivery_counts.py).
            runtime_of(self.app).chain.requeued(self)
            return super().on_failure(exc_info, send_failed_event, return_ok)
        if isinstance(exc, Retry):   # a feature's own (a snooze: worker/features/snooze.py), or Celery's retry
            return self._dlq_feature_outcome(exc, exc_info, send_failed_event, return_ok)
        if isinstance(exc, (*_PASS_THROUGH, SystemExit, KeyboardInterrupt)) \
                or type(exc).__name__ == "Terminated":
            return super().on_failure(exc_info, send_failed_event, return_ok)
        return self._dlq_final(exc, exc_info, send_failed_event, return_ok)

    def on_timeout(self, soft, timeout):
        """A hard time limit: billiard reports it here and to ``on_failure``, in either order.

        Whichever comes first takes the message over; the second does
        nothing, so the result is recorded, error callbacks fire and the
        message is acknowledged once (and never when our write failed).
        """
        if soft:
            return super().on_timeout(soft, timeout)
        self._dlq_failed = True
        if self._dlq_handled:
            return None
        self._dlq_handled = True
        exc = TimeLimitExceeded(timeout)
        failure = {"type": "billiard.exceptions.TimeLimitExceeded",
                   "message": f"hard time limit ({timeout}s) exceeded", "traceback": ""}
        return self._dlq_timed_out(exc, failure, soft, timeout)

    def _dlq_timed_out(self, exc, failure, soft, timeout):
        outcome = self._dlq_takeover(failure, Reason.TIME_LIMIT, lost=True,
                                     retry=lambda: self._dlq_timed_out(exc, failure, soft, timeout))
        if outcome is None:
            return None  # left unacknowledged; the write is retried
        if outcome == "parked":
            return self._dlq_finish_parked(exc, None)
        return self._dlq_celery_records(lambda: super(RedeliveryRequest, self).on_timeout(soft, timeout))

    def _announce_revoked(self, *args, **kwargs):
        """Celery discards a message whose ``expires`` passed; one that failed before is dead-lettered first.

        A copy the mover moved back in time can still expire in the queue or
        the prefetch buffer before it runs (Celery checks on receipt and
        before execution). A first delivery is left to Celery: its ``expires``
        means "not after this", and nothing has failed yet. If the dead
        letter cannot be stored, the message is neither run nor acknowledged,
        and the write is tried again. Celery's private method: where it moved
        (``celery_dlq.internals``), Celery's own discard runs unchanged.
        """
        if usable(EXPIRED_TAKEOVER) and revoked_expired(args, kwargs) and not self.acknowledged \
                and self.dlq_context().delivery > 1:
            ctx = self.dlq_context()
            try:
                runtime_of(self.app).redis().dead_letter(
                    ctx.envelope, delivery=ctx.delivery - 1, policy=ctx.policy, reason=Reason.EXPIRED,
                    failure=H.last_failure(ctx.envelope.headers), worker=self.hostname)
            except Exception:
                mark_revoked(self)  # never run it meanwhile
                return self._dlq_write_failed("dead-letter", lambda: self._announce_revoked(*args, **kwargs))
        return super()._announce_revoked(*args, **kwargs)

    def acknowledge(self):
        """Acknowledge, then tell the chain: a success (``delivery_succeeded``), and the ack (``acknowledged``)."""
        was_acknowledged = self.acknowledged
        super().acknowledge()
        if was_acknowledged or not self.acknowledged:
            return
        chain = runtime_of(self.app).chain
        if not self._dlq_failed and self.time_start is not None and self.task.acks_late:   # a success
            chain.delivery_succeeded(self)
        chain.acknowledged(self)

    def send_event(self, type, **fields):
        """Celery's; a dead-lettered task's ``task-failed`` event also names its DLQ and reason.

        Flower's task view shows only Celery's own task fields, so the
        ``exception`` field is where it can say so (see
        :mod:`celery_dlq.worker.run.events`).
        """
        letter = self._dlq_letter
        if letter is not None and type == "task-failed" and "exception" in fields:
            fields["exception"] = failed_exception(fields["exception"], letter.dlq, letter.reason, letter.delivery)
        return super().send_event(type, **fields)

    # -- outcomes ------------------------------------------------------------

    def _dlq_redeliver(self, exc, exc_info, send_failed_event, return_ok):
        ctx = self.dlq_context()
        envelope, arguments = ctx.envelope, getattr(exc, "arguments", None)
        if arguments is not None:  # self.retry(args=..., kwargs=...)
            try:
                args, kwargs = arguments
                envelope = with_arguments(envelope, args, kwargs, self.app.conf.accept_content)
            except Exception as error:
                return self._dlq_bad_arguments(error, exc_info, send_failed_event, return_ok)
        try:
            runtime_of(self.app).parking.redeliver_later(envelope, delivery=ctx.delivery, failure=exc.failure,
                                                         delay=exc.when or 0.0, message=ctx.message,
                                                         new_body=arguments is not None)
        except Exception:
            return self._dlq_write_failed(
                "park", lambda: self._dlq_redeliver(exc, exc_info, send_failed_event, return_ok))
        runtime_of(self.app).chain.delivery_failed(self, ctx, exc.failure)
        return super().on_failure(exc_info, send_failed_event, return_ok)

    def _dlq_feature_outcome(self, exc, exc_info, send_failed_event, return_ok):
        """A ``Retry`` that is a feature's own (a snooze parks the message without using an attempt), or Celery's."""
        try:
            runtime_of(self.app).chain.taking_over(self, exc)
        except Exception:
            return self._dlq_write_failed(
                "park", lambda: self._dlq_feature_outcome(exc, exc_info, send_failed_event, return_ok))
        return super().on_failure(exc_info, send_failed_event, return_ok)

    def _dlq_bad_arguments(self, error, exc_info, send_failed_event, return_ok):
        """``self.retry(args=..., kwargs=...)`` with arguments the message's serializer cannot encode.

        Celery's own ``retry()`` fails the task then (the publish raises); here the original message
        goes to the DLQ as ``non_retryable`` with the encoding error, and the task is a FAILURE.
        """
        logger.error("celery-dlq: cannot encode the new retry arguments of %s[%s]: %r", self.name, self.id, error)
        retry = lambda: self._dlq_bad_arguments(error, exc_info, send_failed_event, return_ok)  # noqa: E731
        if self._dlq_takeover(H.describe_exception(error, ""), Reason.NON_RETRYABLE, lost=False, retry=retry) is None:
            return None
        try:
            self.task.backend.mark_as_failure(self.id, error, request=request_context(self), call_errbacks=False)
        except Exception:
            logger.exception("celery-dlq: could not record FAILURE of %s[%s]", self.name, self.id)
        return super().on_failure(exc_info, send_failed_event, return_ok)

    def _dlq_final(self, exc, exc_info, send_failed_event, return_ok):
        ctx = self.dlq_context()
        policy, delivery = ctx.policy, ctx.delivery
        if isinstance(exc, SoftTimeLimitExceeded):
            reason = Reason.TIME_LIMIT
        elif self._dlq_expired(exc, ctx):
            reason = Reason.EXPIRED
        elif policy.attempts_left(delivery) or (policy.dead_letter_on and isinstance(exc, policy.dead_letter_on)):
            reason = Reason.NON_RETRYABLE  # the child would have redelivered otherwise; or never retried
        else:
            reason = Reason.MAX_DELIVERY_ATTEMPTS
        retry = lambda: self._dlq_final(exc, exc_info, send_failed_event, return_ok)  # noqa: E731
        failure = _failure(exc, exc_info.traceback)
        if self._dlq_takeover(failure, reason, lost=False, retry=retry) is None:
            return None
        chain = runtime_of(self.app).chain
        chain.delivery_failed(self, ctx, failure)
        if self._dlq_letter is not None:   # the child recorded the FAILURE (the chain's last_failure)
            chain.dead_lettered(self._dlq_letter, request_context(self))
        return super().on_failure(exc_info, send_failed_event, return_ok)

    def _dlq_celery_records(self, record: Callable[[], Any]) -> Any:
        """Celery records the FAILURE of a dead-lettered task itself (``record``); the chain hears of it around."""
        stored, context, chain = self._dlq_letter, request_context(self), runtime_of(self.app).chain
        if stored is None:
            return record()
        chain.recording_failure(stored, context)
        try:
            return record()
        finally:
            chain.dead_lettered(stored, context)

    def _dlq_expired(self, exc, ctx: MessageContext) -> bool:
        """Whether the child gave up because the next delivery would come after the message's ``expires``.

        The child raises the task's own exception then (its state is FAILURE,
        as for a last failure), so this is read back: a message that has an
        expiry, failed with an exception the policy retries and had attempts
        left was only not parked because of its expiry; ``self.retry()``
        without an ``exc`` says so with :class:`MessageExpired`.
        """
        if isinstance(exc, MessageExpired):
            return True
        return (H.expires_at({"expires": self.expires}) is not None and ctx.policy.attempts_left(ctx.delivery)
                and ctx.policy.is_retryable(exc))

    def _dlq_lost(self, exc, reason, exc_info, send_failed_event, return_ok):
        retry = lambda: self._dlq_lost(exc, reason, exc_info, send_failed_event, return_ok)  # noqa: E731
        failure = _failure(exc, exc_info.traceback)
        outcome = self._dlq_takeover(failure, reason, lost=True, retry=retry)
        self._dlq_handled = True
        if outcome is None:
            return None
        if outcome == "parked":
            return self._dlq_finish_parked(exc, exc_info.traceback)
        return self._dlq_celery_records(
            lambda: super(RedeliveryRequest, self).on_failure(exc_info, send_failed_event, return_ok))

    def _dlq_takeover(self, failure, reason, *, lost: bool, retry: Callable[[], Any]) -> str | None:
        """Park (a lost worker with deliveries left) or dead-letter; None if the write failed (``retry`` later)."""
        ctx = self.dlq_context()
        runtime = runtime_of(self.app)
        try:
            if lost and ctx.policy.attempts_left(ctx.delivery):
                delay = ctx.policy.delay_after(ctx.delivery)
                if not H.expires_before(ctx.envelope.headers, time.time() + delay):
                    runtime.parking.redeliver_later(ctx.envelope, delivery=ctx.delivery, failure=failure,
                                            delay=delay, message=ctx.message)
                    return "parked"
                reason = Reason.EXPIRED
            dlq = runtime.redis().dead_letter(ctx.envelope, delivery=ctx.delivery, policy=ctx.policy,
                                              reason=reason, failure=failure, worker=self.hostname)
            envelope = ctx.envelope
            self._dlq_letter = Letter(envelope.task_name, envelope.task_id, envelope.headers, dlq, reason,
                                      ctx.delivery, failure, ctx.policy)
            return "dead_lettered"
        except Exception:
            self._dlq_write_failed("dead-letter" if not lost else "park or dead-letter", retry)
            return None

    def _dlq_finish_parked(self, exc, traceback):
        """What Celery does for a retry: request done, RETRY state, message acknowledged."""
        task_ready(self)
        try:
            self.task.backend.mark_as_retry(self.id, exc, traceback, request=request_context(self))
        except Exception:
            logger.exception("celery-dlq: could not record RETRY state of %s[%s]", self.name, self.id)
        self.acknowledge()
        self.send_event("task-retried", exception=repr(exc), traceback=traceback or "")

    def _dlq_write_failed(self, what: str, retry: Callable[[], Any]) -> None:
        """Our write failed: leave the message unacknowledged and try the write again later.

        The task is not run again: its outcome is known, only storing it
        failed. Retrying from the worker's timer (1 s, doubling to 60 s) frees
        the prefetch slot soon after Redis is back, instead of holding it until
        kombu's visibility timeout (an hour by default) restores the message.
        """
        runtime = runtime_of(self.app)
        attempt = self._dlq_write_attempts = self._dlq_write_attempts + 1
        delay = min(WRITE_RETRY_MAX, WRITE_RETRY_FIRST * 2 ** (attempt - 1))
        timer = runtime.consumer.timer
        logger.exception("celery-dlq: could not %s %s[%s] (redis %s); leaving the message "
                         "unacknowledged, %s", what, self.name, self.id,
                         runtime.config.settings.safe_redis_url,
                         f"trying again in {delay:.0f}s" if timer is not None else "for the broker to deliver again")
        task_ready(self)
        if timer is not None:
            timer.call_after(delay, self._dlq_retry_write, (retry,))

    def _dlq_retry_write(self, retry: Callable[[], Any]) -> None:
        if self.acknowledged:  # settled meanwhile (e.g. the consumer restarted)
            return
        try:
            retry()
        except Exception:  # never into the consumer's event loop
            logger.exception("celery-dlq: retrying the write of %s[%s] failed", self.name, self.id)

    def _dlq_succeeded(self) -> bool:
        """Whether the result backend already holds SUCCESS for this task (read through its public API).

        Not knowable when results are ignored or go back over ``rpc://``
        (False then, as in Celery 5.7's own check); a backend outage also reads
        as not stored, the safe side for a lost worker (at least once).
        """
        backend = self.task.backend
        as_uri = getattr(backend, "as_uri", None)
        if self.ignore_result or (callable(as_uri) and as_uri() == "rpc://"):
            return False
        try:
            return backend.get_task_meta(self.id).get("status") == states.SUCCESS
        except Exception:
            return False

    def _dlq_process_exit(self, exc) -> bool:
        return isinstance(exc, (SystemExit, KeyboardInterrupt)) and not was_revoked_or_cancelled(self)

    def dlq_context(self) -> MessageContext:
        """This message's queue, policy, delivery and envelope: resolved once per request (the features' too)."""
        ctx = self.__dict__.get("_dlq_ctx")
        if ctx is None:
            ctx = self._dlq_ctx = runtime_of(self.app).config.context(self.task, self.message, self.request_dict)
        return ctx
