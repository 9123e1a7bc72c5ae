"""The task Strategy wrapper: a message's checks before Celery gets it, and counts taken back at shutdown.

Every message is first checked (a task id, a believable delivery count: an
invalid one is dead-lettered ``invalid_message``), then offered to the hook
chain (:meth:`~celery_dlq.worker.middleware.Middleware.fetched`: an open
circuit breaker holds it, delivery counting persists its number or
dead-letters it), unless it waits for its ETA: the worker holds such a
message and kombu's visibility timeout restores it while it waits, so it is
offered when it runs.

A message the worker reserved but never started when it stops (warm
shutdown, lost connection) is given back by kombu marked ``redelivered``:
:func:`uncount_unstarted` records that this delivery did not happen
(``worker/features/delivery_counts.py``).
"""
from __future__ import annotations

import logging
from datetime import datetime, timezone

from celery.worker import state
from celery.worker.strategy import default as default_strategy

from celery_dlq import headers as H
from celery_dlq.errors import InvalidMessage
from celery_dlq.headers import Reason
from celery_dlq.message import instance_of
from celery_dlq.worker.config import Config, MessageContext, is_managed
from celery_dlq.worker.connections import Connections
from celery_dlq.worker.run.unrun import mark_failed
from celery_dlq.worker.runtime import runtime_of

logger = logging.getLogger(__name__)


def strategy(task, app, consumer, **kwargs):
    """Celery's default strategy, with each valid message offered to the hook chain first."""
    handler = default_strategy(task, app, consumer, **kwargs)
    runtime = runtime_of(app)
    config, redis, chain = runtime.config, runtime.redis, runtime.chain
    hostname = consumer.hostname

    def dlq_task_message_handler(message, body, ack, reject, callbacks, **kw):
        headers = message.headers
        if isinstance(headers, dict):
            ctx = config.context(task, message)
            problem = _invalid(headers, ctx.policy.max_delivery_attempts)
            if problem:
                _dead_letter_invalid(redis(), task, message, ctx, hostname, problem)
                return None
            if not _waits_for_eta(headers) and chain.fetched(task, message, ctx, hostname):
                return None   # a feature took it (held or dead-lettered): not run
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
        mark_failed(task, message, hostname, InvalidMessage(problem))
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
