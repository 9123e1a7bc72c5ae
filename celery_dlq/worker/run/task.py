"""``RedeliveryTask``: the Task base class, the child-process half of the takeover.

In the pool child, an exception that the policy will redeliver is turned into
:class:`Redeliver` (a Celery :class:`~celery.exceptions.Retry`), so Celery
records the state as RETRY and fires no error callbacks; the last failure is
raised as it is, so the task is a FAILURE as Celery users expect. Either way
the worker's main process (:mod:`celery_dlq.worker.run.request`) parks or dead-letters
the original message before it is acknowledged.
"""
from __future__ import annotations

import inspect
import time
from datetime import datetime, timezone
from typing import Any

from celery import Task, states
from celery.exceptions import Ignore, Reject, Retry

from celery_dlq import headers as H
from celery_dlq.errors import MessageExpired
from celery_dlq.message import queue_of
from celery_dlq.worker.features.snooze import Snooze
from celery_dlq.worker.install import install
from celery_dlq.worker.runtime import delivery_count, runtime_of

#: Request attribute: the exception ``self.retry()`` raised because the retry would come after ``expires``.
EXPIRED_RETRY = "celery_dlq_expired_retry"


class Redeliver(Retry):
    """Raised in the child: park the original message and deliver it again in ``when`` seconds.

    Carries the failure as plain strings (``failure``) so it crosses the pool
    boundary even when the original exception cannot be pickled, and the
    next delivery's ``(args, kwargs)`` when ``self.retry(args=..., kwargs=...)``
    changed them (``arguments``; None: the message's own).
    """

    def __init__(self, message: str | None = None, exc: BaseException | None = None,
                 when: float | None = None, failure: dict | None = None,
                 arguments: tuple[list, dict] | None = None, **kwargs: Any) -> None:
        super().__init__(message, exc, when, **kwargs)
        self.failure = failure or H.describe_exception(exc)
        self.arguments = arguments

    def __reduce__(self):
        return self.__class__, (self.message or str(self), None, self.when, self.failure, self.arguments)


def retry_arguments(run: Any, old_args: Any, old_kwargs: Any, args: Any, kwargs: Any) -> tuple[Any, Any]:
    """The arguments of a retry, as Celery's ``Task.retry`` computes them (celery#6494).

    A side not given is inherited from the request, less what would conflict
    with the new calling convention: new ``args`` drop inherited kwargs of the
    positional parameters they fill; new ``kwargs`` replace inherited
    positional arguments of the same name.
    """
    if (args is not None and kwargs is None and old_kwargs) or \
            (kwargs is not None and args is None and old_args):
        try:
            signature = inspect.signature(run)
        except (TypeError, ValueError):
            signature = None   # the task's own argument checks decide
        if signature is not None and args is not None:
            positional = [p for p in signature.parameters.values()
                          if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                        inspect.Parameter.POSITIONAL_OR_KEYWORD)]
            kwargs = dict(old_kwargs)
            for p in positional[:len(args)]:
                if p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD:
                    kwargs.pop(p.name, None)
        elif signature is not None:
            try:
                bound = signature.bind_partial(*old_args)
            except TypeError:
                bound = None
            if bound is not None:
                kwargs = dict(kwargs or {})
                for name in list(kwargs):
                    if name in bound.arguments and \
                            signature.parameters[name].kind == inspect.Parameter.POSITIONAL_OR_KEYWORD:
                        bound.arguments[name] = kwargs.pop(name)
                args, kwargs = bound.args, {**bound.kwargs, **kwargs}
    return (old_args if args is None else args), (old_kwargs if kwargs is None else kwargs)


class RedeliveryTask(Task):
    """Base class for tasks with a redelivery policy and a dead-letter queue.

    ``redelivery_policy`` may be a :class:`~celery_dlq.RedeliveryPolicy` or a
    dict of its fields; unset fields come from ``app.conf`` (see README).
    Messages are acknowledged late, after the parked copy or the dead letter
    is stored; a lost worker process is handled here, not requeued by Celery.
    """

    abstract = True
    Request = "celery_dlq.worker.run.request:RedeliveryRequest"
    Strategy = "celery_dlq.worker.run.strategy:strategy"
    acks_late = True
    acks_on_failure = True   # only after the dead letter is stored (request.py)
    acks_on_timeout = True
    reject_on_worker_lost = False
    redelivery_policy: Any = None
    #: What the worker side checks (``config.is_managed``) without importing this class.
    celery_dlq_managed = True

    @classmethod
    def on_bound(cls, app: Any) -> None:
        install(app, validate=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly or request.is_eager:
            return super().__call__(*args, **kwargs)
        chain = runtime_of(self.app).chain
        try:
            retval = self.run(*args, **kwargs)
        except Exception as exc:
            # A feature's own exception (a snooze: worker/features/snooze.py).
            instead = chain.raised(self, request, exc)
            if instead is not None:
                if not isinstance(instead, Retry):
                    chain.last_failure(self, request)
                raise instead from None
            if isinstance(exc, (Retry, Ignore, Reject)):
                raise  # the task's own say (retry, replace(), reject): never a failed delivery
            delay = None if isinstance(exc, MessageExpired) or exc is getattr(request, EXPIRED_RETRY, None) \
                else self._redelivery_delay(exc)
            if delay is None:
                # The last failure (a retry past expiry too): the worker dead-letters the message, then the chain
                # hears of it (a chord's rule: worker/features/chords.py).
                chain.last_failure(self, request)
                raise
            # No traceback: a parked copy keeps "Type: message" only, and the
            # pool would pickle a formatted traceback across for nothing.
            raise Redeliver(exc=exc, when=delay, failure=H.describe_exception(exc, "")) from exc
        chain.before_success(self, request)
        return retval

    def after_return(self, status, retval, task_id, args, kwargs, einfo):
        """After a success was recorded: the chain's ``after_success`` (a chord member's replay settled)."""
        request = self.request
        if status == states.SUCCESS and not (request.called_directly or request.is_eager):
            runtime_of(self.app).chain.after_success(self, request)

    def _policy_and_delivery(self):
        request = self.request
        queue = queue_of(self.app, request.delivery_info)
        return runtime_of(self.app).config.policy(self, queue), delivery_count(request)

    def _redelivery_delay(self, exc: BaseException) -> float | None:
        """Seconds until the next delivery, or None when this failure is the last.

        It is the last, too, when the next delivery would come after the
        message's ``expires``: Celery would discard it then, so the worker
        dead-letters it now (reason ``expired``).
        """
        policy, delivery = self._policy_and_delivery()
        if not policy.is_retryable(exc) or not policy.attempts_left(delivery):
            return None
        delay = policy.delay_after(delivery)
        return None if self._expires_before(delay) else delay

    def _expires_before(self, delay: float) -> bool:
        return H.expires_before({"expires": self.request.expires}, time.time() + delay)

    def snooze(self, seconds: float, message: str | None = None) -> None:
        """Deliver this message again in ``seconds`` without using an attempt (raises :class:`Snooze`)."""
        raise Snooze(seconds, message)

    def retry(self, args=None, kwargs=None, exc=None, throw=True, eta=None, countdown=None,
              max_retries=None, **options):
        """Redeliver through the Redis-parked path; counts as a delivery.

        ``countdown``/``eta`` override the policy's delay for this one wait.
        New ``args``/``kwargs`` go into the parked copy (same task id, headers
        and delivery count). Celery's own path is kept for eager calls, for
        ``throw=False`` and for other ``apply_async`` options (queue,
        priority, ...). A retry that would come after the message's
        ``expires`` raises ``exc`` (or :class:`MessageExpired`): the message
        is dead-lettered with reason ``expired``.
        """
        request = self.request
        if request.called_directly or request.is_eager or not throw or options:
            return super().retry(args=args, kwargs=kwargs, exc=exc, throw=throw, eta=eta,
                                 countdown=countdown, max_retries=max_retries, **options)
        policy, delivery = self._policy_and_delivery()
        if not policy.attempts_left(delivery):
            if exc is not None:
                raise exc
            raise self.MaxRetriesExceededError(
                f"Can't retry {self.name}[{request.id}]: delivery {delivery} of "
                f"max_delivery_attempts={policy.max_delivery_attempts}")
        if countdown is not None:
            when = float(countdown)
        elif eta is not None:
            eta = eta if eta.tzinfo else eta.replace(tzinfo=timezone.utc)
            when = max(0.0, (eta - datetime.now(timezone.utc)).total_seconds())
        else:
            when = policy.delay_after(delivery)
        if self._expires_before(when):
            final = exc if exc is not None else MessageExpired(
                f"Can't retry {self.name}[{request.id}]: the next delivery (in {when:.3g}s) would come after "
                f"the message expires ({request.expires})")
            setattr(request, EXPIRED_RETRY, final)
            raise final
        failure = H.describe_exception(exc, "") if exc is not None else \
            {"type": "celery.exceptions.Retry", "message": "retry requested by the task", "traceback": ""}
        arguments = None
        if args is not None or kwargs is not None:
            new_args, new_kwargs = retry_arguments(self.run, request.args or (), request.kwargs or {}, args, kwargs)
            arguments = (list(new_args), dict(new_kwargs))
        raise Redeliver(exc=exc, when=when, failure=failure, arguments=arguments)
