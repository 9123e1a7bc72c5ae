"""What the fetch finds that cannot be a task message: into its queue's DLQ, raw and wrapped, or its quarantine.

Used by the worker's transport (:mod:`celery_dlq.worker.transport`): an
element ``fetch.lua`` quarantined (not a kombu envelope) and a fetched one
that fails validation (:func:`celery_dlq.element.envelope_error`) each go to
the DLQ of their queue in one script, with one WARNING, counted and archived.
"""
from __future__ import annotations

import logging
import time
from typing import Any

import redis
from kombu.utils.uuid import uuid

from celery_dlq.element import raw_dead_letter
from celery_dlq.headers import Reason
from celery_dlq.message import decode_raw
from celery_dlq.storage import totals
from celery_dlq.storage.keys import Stat
from celery_dlq.storage.totals import Metric

logger = logging.getLogger(__name__)


def _letter(channel: Any, queue: str, element: bytes, error: str) -> tuple[str | None, bytes | None]:
    dlq = channel.fetch_context.policy(queue).dead_letter_queue(queue)
    if dlq is None:
        return None, None
    return dlq, raw_dead_letter(element, queue=queue, dlq=dlq, error=error, worker=channel._dlq_consumer,
                                now=time.time(), tag=uuid())


def reject(channel: Any, queue: str, element: bytes, tag: str, error: str) -> None:
    """A fetched element that cannot be a task: out of unacked into its DLQ (raw, wrapped), in one script.

    Where the queue's dead letters are dropped by policy, a malformed
    message is still never dropped: it goes to the queue's quarantine, raw.
    """
    dlq, letter = _letter(channel, queue, element, error)
    target = channel._dlq_keys.quarantine(queue) if dlq is None else (channel.global_keyprefix or "") + dlq
    moved = channel._dlq_scripts.run("reject_invalid", [*channel.ack_keys(), target],
                                     [tag, element if dlq is None else letter])
    if not moved:
        return   # no longer unacked: restored or handled meanwhile
    if dlq is None:
        logger.warning("celery-dlq: quarantined an invalid message from %r in %s: %s", queue, target, error)
        return
    _dead_lettered(channel, letter, queue, dlq, error)


def release_quarantine(channel: Any, queue: str, element: bytes, error: str) -> None:
    """An element fetch.lua quarantined: on to its DLQ, wrapped; it stays quarantined if that is impossible."""
    dlq, letter = _letter(channel, queue, element, error)
    where = channel._dlq_keys.quarantine(queue)
    if dlq is None:
        logger.warning("celery-dlq: quarantined an invalid message from %r in %s: %s", queue, where, error)
        return
    try:
        moved = channel._dlq_scripts.run("release_quarantine", [where, (channel.global_keyprefix or "") + dlq],
                                         [element, letter])
    except redis.RedisError:
        logger.warning("celery-dlq: quarantined an invalid message from %r in %s (could not move it to %s): "
                       "%s", queue, where, dlq, error, exc_info=True)
        return
    if moved:
        _dead_lettered(channel, letter, queue, dlq, error)


def _dead_lettered(channel: Any, letter: bytes, queue: str, dlq: str, error: str) -> None:
    """One WARNING per invalid message dead-lettered, counted and archived."""
    logger.warning("celery-dlq: dead-lettered an invalid message from %r to %s (invalid_message): %s",
                   queue, dlq, error)
    connections = channel.fetch_context.redis
    if connections is None:
        return
    try:
        envelope = decode_raw(letter).as_envelope()
        shard = connections().shard(envelope.task_id)
        pipe = connections().client.pipeline(transaction=False)
        pipe.hincrby(shard.keys.stats, Stat.DEAD_LETTERED, 1)
        totals.incr(pipe, shard.keys, Metric.DEAD_LETTERED, queue=envelope.queue, task="",
                     reason=Reason.INVALID_MESSAGE)
        pipe.execute()
        shard.archive.dead_lettered(envelope, dlq)
    except Exception:
        logger.exception("celery-dlq: could not count or archive an invalid message's dead letter")
