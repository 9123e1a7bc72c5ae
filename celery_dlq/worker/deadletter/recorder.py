"""Recording the end of a message: the one place every dead letter and every drop is counted and told.

Every path that ends a message goes through :meth:`Recorder.record` once the
letter is stored (or the policy dropped the message), whatever the reason
(:class:`celery_dlq.headers.Reason`): a last failure, a lost worker, a time
limit, an expiry, an unknown task, an invalid message found by Celery or by
the fetch (:mod:`celery_dlq.worker.fetch.rejects`). It writes, in this order:

* the ``stats`` counter (``dead_lettered`` or ``dropped``, and ``expired``),
  the exporter's ``dead_lettered_total`` / ``dropped_total`` and the
  ``dead_lettered`` trends, in one pipeline (with what the caller queued);
* the archive event (``dead_lettered`` or ``dropped``);
* one WARNING;
* the ``task_dead_lettered`` signal and Flower's task event;
* the DLQ's retention limits.

The failure group is not written here: the script that pushes a letter
counts it in the same step, so a group's count never drifts from its list
(raw letters of invalid messages have none, :mod:`celery_dlq.storage.groups`).
Counting raises (the caller decides whether the message stays
unacknowledged); the archive, signal receivers and retention never do.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from celery_dlq import headers as H
from celery_dlq.message import Envelope
from celery_dlq.policy import RedeliveryPolicy
from celery_dlq.signals import send_isolated, task_dead_lettered
from celery_dlq.storage import trends
from celery_dlq.storage.keys import UNKNOWN_TASK_ID, Stat
from celery_dlq.storage.shards import ShardedStore
from celery_dlq.storage.totals import Metric
from celery_dlq.worker.deadletter.retention import Retention
from celery_dlq.worker.run.events import TaskEvents

logger = logging.getLogger(__name__)


class Recorder:
    """Counts, archives, logs, signals and trims for each message that ended; one per app and process."""

    def __init__(self, store: ShardedStore, retention: Retention, events: TaskEvents | None = None) -> None:
        #: A task's counters and archive events go to its shard of the store.
        self.store = store
        self.retention = retention
        self.events = events

    def record(self, message: Envelope, dlq: str | None, *, reason: str, failure: Mapping[str, str],
               delivery: int, policy: RedeliveryPolicy, pipe: Any = None) -> None:
        """``message`` ended with ``reason`` after delivery ``delivery``: stored in ``dlq``, or dropped (None).

        ``message`` is the letter as stored in ``dlq`` (its ``x-dlq-*``
        headers say when and why), or the dropped message. ``pipe``: a
        pipeline on the store's client with the caller's own writes queued,
        executed with the counts. Raises if the counts cannot be written.
        """
        shard = self.store.of(message.task_id or UNKNOWN_TASK_ID)
        task = message.task_name or ""
        stats = [Stat.EXPIRED] if reason == H.Reason.EXPIRED else []
        if dlq is None:
            shard.raise_counts([*stats, Stat.DROPPED], Metric.DROPPED, {"queue": message.queue, "task": task},
                               pipe=pipe)
        else:
            shard.raise_counts([*stats, Stat.DEAD_LETTERED], Metric.DEAD_LETTERED,
                               {"queue": message.queue, "task": task, "reason": reason},
                               trends.series("dead_lettered", message.queue, reason), pipe=pipe)
        if dlq is None:
            shard.archive.dropped(message, reason=reason, failure=failure, delivery=delivery)
        else:
            shard.archive.dead_lettered(message, dlq)
        _log(message, dlq, reason, failure, delivery, policy)
        self._notify(message, dlq, reason, failure, delivery)
        if dlq is not None:
            self.retention.after_dead_letter(dlq, policy)

    def _notify(self, message: Envelope, dlq: str | None, reason: str, failure: Mapping[str, str],
                delivery: int) -> None:
        """The signal (sender: the task name; None, as the task id, for what is not a task) and the task event."""
        send_isolated(task_dead_lettered, sender=message.task_name, task_id=message.task_id,
                      task_name=message.task_name, original_queue=message.queue, dead_letter_queue=dlq,
                      reason=reason, exception=dict(failure), delivery_count=delivery)
        if self.events is not None:
            self.events.dead_lettered(message.task_id, message.task_name, dlq=dlq, queue=message.queue,
                                      reason=reason, delivery=delivery, exception_type=failure.get("type", ""))


def _log(message: Envelope, dlq: str | None, reason: str, failure: Mapping[str, str], delivery: int,
         policy: RedeliveryPolicy) -> None:
    """One WARNING per message ended (docs/operating.md shows one); what is not a task is an invalid message."""
    summary = H.summary(failure)
    if dlq is None:
        cause = "expired='drop'" if reason == H.Reason.EXPIRED and policy.dead_letter is not False \
            else "dead_letter=False"
        logger.warning("celery-dlq: dropping %s[%s] from %r after delivery %d (%s: %s): %s", message.task_name,
                       message.task_id or UNKNOWN_TASK_ID, message.queue, delivery, reason, summary, cause)
    elif message.task_name or message.task_id:
        logger.warning("celery-dlq: %s[%s] dead-lettered to %s after delivery %d (%s: %s)", message.task_name,
                       message.task_id or UNKNOWN_TASK_ID, dlq, delivery, reason, summary)
    else:
        logger.warning("celery-dlq: an invalid message from %r dead-lettered to %s (%s: %s)",
                       message.queue, dlq, reason, summary)
