"""Delivery counting: a delivery's number persisted before it runs, and taken back where it did not happen.

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

A message with a future ETA is counted when it runs (the strategy does not
hand it to the chain); a requeue by the task itself (``Reject(requeue=True)``)
takes its count back, and so does the consumer's close for a reserved message
that never started (``worker/run/strategy.py``: ``uncount_unstarted``). Once the
message is acknowledged its counter goes.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from billiard.exceptions import WorkerLostError

from celery_dlq import headers as H
from celery_dlq.headers import Reason
from celery_dlq.message import instance_of, was_redelivered
from celery_dlq.worker.config import MessageContext
from celery_dlq.worker.connections import Connections
from celery_dlq.worker.middleware import Chain, Letter, Middleware
from celery_dlq.worker.run.unrun import mark_failed

logger = logging.getLogger(__name__)


class DeliveryCounts(Middleware):
    """Counts each delivery in Redis before it runs (``chain``: the chain a dead letter is announced on)."""

    name = "delivery counts"

    def __init__(self, redis: Callable[[], Connections], chain: Callable[[], Chain]) -> None:
        self.redis, self.chain = redis, chain

    def fetched(self, task: Any, message: Any, ctx: MessageContext, hostname: str) -> bool:
        if not ctx.policy.persist_delivery_count_before_delivery:
            return False
        return count_or_dead_letter(self.redis(), task, message, ctx, hostname, self.chain())

    def acknowledged(self, request: Any) -> None:
        """Let the message's persisted counter go (``DeliveryCounters.forget``)."""
        try:
            message = request.message
            # Only a restored (redelivered) instance has a counter: first deliveries write none.
            if was_redelivered(message) and request.dlq_context().policy.persist_delivery_count_before_delivery:
                self.redis().counters.forget(request.id, instance_of(message))
        except Exception:  # the counter expires on its own; never fail an ack for it
            logger.debug("celery-dlq: could not queue the delivery counter of %s for deletion", request.id,
                         exc_info=True)

    def requeued(self, request: Any) -> None:
        """The task put its own message back: that delivery used up no attempt.

        The broker redelivers the message marked ``redelivered``, which
        :meth:`fetched` counts as the next delivery; setting the counter back
        makes that delivery count as this one again, so a requeue is never
        taken for a lost worker.
        """
        ctx = request.dlq_context()
        if not ctx.policy.persist_delivery_count_before_delivery:
            return
        try:
            self.redis().counters.uncount([(request.id, instance_of(request.message), ctx.delivery)])
        except Exception:  # at worst the requeued delivery counts as a new one: never lost
            logger.warning("celery-dlq: %s[%s] requeued itself, but its delivery count could not be taken back",
                           request.task.name, request.id, exc_info=True)


def count_or_dead_letter(redis: Connections, task: Any, message: Any, ctx: MessageContext, hostname: str,
                         chain: Chain) -> bool:
    """Persist this delivery; True when the message was dead-lettered (``worker_lost``) instead of run.

    A message whose count is already past ``max_delivery_attempts`` (its
    last delivery never reported back: the worker died) is dead-lettered.
    """
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
    letter = Letter(headers.get("task"), headers["id"], headers, dlq, Reason.WORKER_LOST, count - 1, failure,
                    ctx.policy)
    mark_failed(task, message, hostname, WorkerLostError(text), chain, letter)
    message.ack()
    redis.counters.forget(headers["id"], tag)
    return True
