"""The task Strategy wrapper: count a delivery before it runs, and take counts back at shutdown.

With ``persist_delivery_count_before_delivery`` a delivery's number is known
in the worker's main process before the request is handed on, and survives
the death of any process, so a poison task that kills its whole worker still
reaches its dead-letter queue. It costs nothing on a first delivery:

- a message kombu does not mark ``redelivered`` is delivered for the first
  time as this instance, and its number is the one its header carries (1,
  or the redelivery number the mover gave it): no Redis call;
- a message kombu marks ``redelivered`` (restored after its worker died, or
  by the visibility timeout) was delivered before: its counter in Redis is
  incremented, and a missing counter means one earlier, unrecorded delivery.
  Only these cost a round trip.

Two cases must not count as deliveries:

- a message with a future ETA: the worker holds it and kombu's visibility
  timeout restores it while it waits; it is counted when it runs;
- a message the worker reserved but never started when it stops (warm
  shutdown, lost connection): kombu gives it back marked ``redelivered``, so
  :func:`uncount_unstarted` records that this delivery did not happen.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from billiard.exceptions import WorkerLostError
from celery import signals
from celery.worker import state
from celery.worker.strategy import default as default_strategy
from kombu.utils.imports import symbol_by_name

from celery_dlq import headers as H
from celery_dlq.errors import InvalidMessage
from celery_dlq.headers import Reason
from celery_dlq.internals.celery_worker import request_context
from celery_dlq.message import instance_of, was_redelivered
from celery_dlq.storage.chords import take_chord
from celery_dlq.worker.config import Config, MessageContext, is_managed
from celery_dlq.worker.connections import Connections
from celery_dlq.worker.runtime import runtime_of

logger = logging.getLogger(__name__)


def strategy(task, app, consumer, **kwargs):
    """Celery's default strategy, with the delivery counted in Redis first.

    A message whose count is already past ``max_delivery_attempts`` (its last
    delivery never reported back: the worker died) is dead-lettered with
    reason ``worker_lost`` instead of run.
    """
    handler = default_strategy(task, app, consumer, **kwargs)
    runtime = runtime_of(app)
    config, redis, breakers = runtime.config, runtime.redis, runtime.breakers
    hostname = consumer.hostname

    def dlq_task_message_handler(message, body, ack, reject, callbacks, **kw):
        headers = message.headers
        if isinstance(headers, dict):
            ctx = config.context(task, message)
            problem = _invalid(headers, ctx.policy.max_delivery_attempts)
            if problem:
                _dead_letter_invalid(redis(), task, message, ctx, hostname, problem)
                return None
            if ctx.policy.breaker and not _waits_for_eta(headers) and breakers.hold(task.name, headers["id"], ctx):
                return None   # an open circuit breaker parked it: not run, no attempt used (worker/breaker.py)
            if not _waits_for_eta(headers) and ctx.policy.persist_delivery_count_before_delivery:
                if _count_or_dead_letter(redis(), task, message, ctx, hostname):
                    return None
        return handler(message, body, ack, reject, callbacks, **kw)

    return dlq_task_message_handler


def _invalid(headers: dict, max_delivery_attempts: int) -> str | None:
    """Why Celery must not get this message: no task id (its Request would fail), or an unbelievable count."""
    if not isinstance(headers.get("id"), str) or not headers["id"]:
        return "no id header (Celery protocol 2 needs one)"
    return H.delivery_count_problem(headers, max_delivery_attempts)


def _dead_letter_invalid(redis: Connections, task, message, ctx: MessageContext, hostname, problem: str) -> None:
    """Dead-letter a message Celery must not run (``invalid_message``), or leave it unacknowledged if that fails."""
    failure = {"type": "celery_dlq.errors.InvalidMessage", "message": problem, "traceback": ""}
    try:
        redis.dead_letter(ctx.envelope, delivery=1, policy=ctx.policy, reason=Reason.INVALID_MESSAGE,
                          failure=failure, worker=hostname)
    except Exception:
        logger.exception("celery-dlq: could not dead-letter an invalid %s message; leaving it unacknowledged",
                         task.name)
        return
    logger.warning("celery-dlq: %s[%s] is not a valid message (%s): dead-lettered", task.name,
                   message.headers.get("id"), problem)
    if message.headers.get("id"):   # a result may be awaited: record FAILURE, as for any dead letter
        _mark_failed(task, message, hostname, InvalidMessage(problem))
    message.ack()


def _waits_for_eta(headers: dict) -> bool:
    """Whether the message has an ETA still in the future (the worker will hold it, not run it)."""
    eta = headers.get("eta")
    if not eta:
        return False
    try:
        when = datetime.fromisoformat(str(eta))
    except ValueError:
        return False
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when > datetime.now(timezone.utc)


def _count_or_dead_letter(redis: Connections, task, message, ctx: MessageContext, hostname) -> bool:
    """Persist this delivery; True when the message was dead-lettered instead of run."""
    headers = message.headers
    floor = ctx.delivery
    tag = instance_of(message)
    count = floor
    if was_redelivered(message):
        try:
            count = redis.counters.count(headers["id"], tag, floor)
        except Exception:
            # It was delivered before: never grant it an extra attempt. A quorum
            # queue says how often (x-delivery-count); otherwise at least once.
            count = floor + max(1, H.broker_delivery_count(headers))
            logger.exception("celery-dlq: could not persist the delivery count of %s[%s]; using %d",
                             headers.get("task"), headers.get("id"), count)
    headers[H.DELIVERY_COUNT] = count
    if ctx.policy.attempts_left(count - 1):
        return False
    text = f"delivery {count - 1} never reported an outcome (the worker was lost)"
    failure = {"type": "billiard.exceptions.WorkerLostError", "message": text, "traceback": ""}
    try:
        dlq = redis.dead_letter(ctx.envelope, delivery=count - 1, policy=ctx.policy,
                                reason=Reason.WORKER_LOST, failure=failure, worker=hostname)
    except Exception:
        logger.exception("celery-dlq: could not dead-letter %s[%s]; leaving it unacknowledged",
                         headers.get("task"), headers.get("id"))
        return True
    _mark_failed(task, message, hostname, WorkerLostError(text), tell_chord=lambda fields: redis.chords.dead_lettered(
        fields, headers=headers, dlq=dlq, delivery=count - 1, failure=failure, policy=ctx.policy))
    message.ack()
    redis.counters.forget(headers["id"], tag)
    return True


def _mark_failed(task: Any, message: Any, hostname: str, exc: BaseException,
                 tell_chord: Callable[[dict], Any] | None = None) -> None:
    """Record FAILURE, with error callbacks and chords, as Celery does for a lost worker.

    Without it a message dead-lettered here, never run, stays PENDING in the
    result backend: ``result.get()`` and chords would wait forever. The dead
    letter is stored already, so a backend error is logged, not raised. With
    ``tell_chord``, a chord member's chord hears of it by its chord rule
    (worker/chords.py), not from Celery's FAILURE.
    """
    try:
        request_cls = symbol_by_name(task.Request)  # Celery allows a class or its dotted name
        request = request_cls(message, app=task.app, hostname=hostname, task=task)
        context = request_context(request)
        told = take_chord(context) if tell_chord is not None else None
        task.backend.mark_as_failure(request.id, exc, request=context, store_result=request.store_errors)
        if told is not None and tell_chord is not None:
            tell_chord(told)
        signals.task_failure.send(sender=task, task_id=request.id, exception=exc, args=request.args,
                                  kwargs=request.kwargs, traceback=None, einfo=None)
    except Exception:
        logger.exception("celery-dlq: dead-lettered %s[%s] but could not record its FAILURE",
                         task.name, (message.headers or {}).get("id"))


def uncount_unstarted(config: Config, redis: Connections) -> int:
    """Take back the count of every reserved request that never started; returns how many.

    Called from the consumer's ``on_close``, just before it forgets these
    requests (so each is taken back once): kombu restores their messages, and
    their next receipt counts them again. Left alone, those counts would let a
    few restarts dead-letter messages that never ran.
    """
    unstarted = [req for req in list(state.reserved_requests)
                 if req not in state.active_requests
                 and getattr(req, "message", None) is not None
                 and is_managed(getattr(req, "task", None))]
    keys = []
    for req in unstarted:
        try:
            ctx = config.context(req.task, req.message)
            if ctx.policy.persist_delivery_count_before_delivery and not _waits_for_eta(req.message.headers or {}):
                keys.append((req.id, instance_of(req.message), ctx.delivery))
        except Exception:
            logger.debug("celery-dlq: skipping %s when un-counting", req.id, exc_info=True)
    if keys:
        redis.counters.uncount(keys)
        logger.info("celery-dlq: %d reserved message(s) never started; their delivery counts were "
                    "taken back", len(keys))
    return len(keys)
