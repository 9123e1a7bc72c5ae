"""What the fetch finds that cannot be a task message: into its queue's DLQ, raw and wrapped, or its quarantine.

Used by the worker's transport (:mod:`celery_dlq.worker.fetch.transport`), which
builds one :class:`Rejects` per channel and hands it what it needs: an
element ``fetch.lua`` quarantined (not a kombu envelope) and a fetched one
that fails validation (:func:`celery_dlq.element.envelope_error`) each go to
the DLQ of their queue in one script, then are recorded as every dead
letter is (:mod:`celery_dlq.worker.deadletter.recorder`): counted, archived, trended,
one WARNING, the ``task_dead_lettered`` signal (sender and task id None:
it is not a task) and retention.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import redis
from kombu.utils.uuid import uuid

from celery_dlq import headers as H
from celery_dlq.element import raw_dead_letter
from celery_dlq.message import decode_raw
from celery_dlq.policy import RedeliveryPolicy
from celery_dlq.storage.dlq import DeadLetterLists
from celery_dlq.storage.keys import Keys
from celery_dlq.worker.fetch.setup import FetchContext

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rejects:
    """One channel's way to dead-letter what its fetch cannot hand over as a task.

    ``context`` (the channel's fetch context) names each queue's DLQ (its
    settings' policy for the queue) and records the letters; without a
    worker's settings (a transport used outside ``install()``) the default
    policy names the DLQ and nothing is recorded.
    """

    letters: DeadLetterLists   # on the broker's Redis, taking full key names
    keys: Keys                 # the channel's key set: its queues' quarantines
    key_prefix: str            # kombu's ``global_keyprefix``, before a DLQ's list name
    in_flight: list[str]       # the channel's ack keys: this process's in-flight hash
    worker: str                # written into each letter's ``x-dlq-worker``
    context: FetchContext

    def policy(self, queue: str) -> RedeliveryPolicy:
        """The policy of ``queue`` for a message that names no task."""
        return self.context.policy(queue)

    def reject(self, queue: str, element: bytes, tag: str, error: str) -> None:
        """A fetched element that cannot be a task: out of flight into its DLQ (raw, wrapped), in one script.

        Where the queue's dead letters are dropped by policy, a malformed
        message is still never dropped: it goes to the queue's quarantine, raw.
        """
        policy = self.policy(queue)
        dlq, letter = self._letter(policy, queue, element, error)
        target = self.keys.quarantine(queue) if dlq is None else self.key_prefix + dlq
        moved = self.letters.reject_invalid(self.in_flight, target, tag, element if letter is None else letter)
        if not moved:
            return   # no longer in flight: given back or handled meanwhile
        if dlq is None or letter is None:
            logger.warning("celery-dlq: quarantined an invalid message from %r in %s: %s", queue, target, error)
            return
        self._record(letter, dlq, policy)

    def release_quarantine(self, queue: str, element: bytes, error: str) -> None:
        """An element fetch.lua quarantined: on to its DLQ, wrapped; it stays quarantined if that is impossible."""
        policy = self.policy(queue)
        dlq, letter = self._letter(policy, queue, element, error)
        where = self.keys.quarantine(queue)
        if dlq is None or letter is None:
            logger.warning("celery-dlq: quarantined an invalid message from %r in %s: %s", queue, where, error)
            return
        try:
            moved = self.letters.release_quarantine(where, self.key_prefix + dlq, element, letter)
        except redis.RedisError:
            logger.warning("celery-dlq: quarantined an invalid message from %r in %s (could not move it to %s): "
                           "%s", queue, where, dlq, error, exc_info=True)
            return
        if moved:
            self._record(letter, dlq, policy)

    def _letter(self, policy: RedeliveryPolicy, queue: str, element: bytes,
                error: str) -> tuple[str | None, bytes | None]:
        dlq = policy.dead_letter_queue(queue)
        if dlq is None:
            return None, None
        return dlq, raw_dead_letter(element, queue=queue, dlq=dlq, error=error, worker=self.worker,
                                    now=time.time(), tag=uuid())

    def _record(self, letter: bytes, dlq: str, policy: RedeliveryPolicy) -> None:
        """Record the stored letter as every dead letter is; it is safe already, so a failure is only logged."""
        envelope = decode_raw(letter).as_envelope()
        headers = envelope.headers
        if self.context.redis is None:
            logger.warning("celery-dlq: dead-lettered an invalid message from %r to %s (invalid_message): %s",
                           envelope.queue, dlq, headers.get(H.EXCEPTION_MESSAGE))
            return
        failure = {"type": str(headers.get(H.EXCEPTION_TYPE) or ""),
                   "message": str(headers.get(H.EXCEPTION_MESSAGE) or ""), "traceback": ""}
        try:
            self.context.redis().deadletterer.recorder.record(envelope, dlq, reason=H.Reason.INVALID_MESSAGE,
                                                      failure=failure, delivery=1, policy=policy)
        except Exception:
            logger.exception("celery-dlq: could not record an invalid message's dead letter in %s", dlq)
