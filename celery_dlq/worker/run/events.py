"""Celery task events celery-dlq sends when worker events are on (``celery worker -E``).

Two event types, sent from the worker's main process through the consumer's
own event dispatcher right after the dead letter or the parked copy is
stored (next to the :mod:`celery_dlq.signals` of the same name):

* ``task-dead-lettered``: ``dlq`` (None when the policy drops the message),
  ``queue`` (where it came from), ``reason``, ``delivery_count``,
  ``exception_type``;
* ``task-redelivery-scheduled``: ``delivery_count`` (of the coming
  delivery), ``due`` (unix seconds), ``queue``, ``exception_type``;
* ``task-breaker-changed``: a circuit breaker's ``state``, ``queue``,
  ``group`` and ``cooldown``, filed under the task whose outcome changed it.

Both carry ``uuid`` (the task id) and ``name`` (the task name) as Celery's own
task events do, so ``celery events``, Flower and any ``app.events.Receiver``
file them under the task. The dispatcher decides as for Celery's events: with
task events off (no ``-E``, ``worker_send_task_events`` false) nothing is
sent, and a task class with ``send_events = False`` sends none either. On a
worker with an event loop (prefork, solo) task events are buffered and
published by the loop, so sending never waits for the broker; a failure to
send is logged and never reaches the worker.

Celery's events ``State`` (what Flower keeps) merges these fields into the
task, but its ``as_dict()`` (Flower's ``/api/task/info``) lists only Celery's
own fields. So the ``task-failed`` event of a dead-lettered task also says it
in its ``exception`` field (:func:`failed_exception`).
"""
from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

DEAD_LETTERED = "task-dead-lettered"
REDELIVERY_SCHEDULED = "task-redelivery-scheduled"
BREAKER_CHANGED = "task-breaker-changed"


def failed_exception(exception: str, dlq: str | None, reason: str, delivery: int) -> str:
    """The ``exception`` field of a dead-lettered task's ``task-failed`` event: Celery's repr, then where it went."""
    where = f"dead-lettered to {dlq}" if dlq else "dropped (dead_letter=False)"
    return f"{exception} [celery-dlq: {where}, reason {reason}, delivery {delivery}]"


class TaskEvents:
    """Sends celery-dlq's task events through a worker consumer's event dispatcher.

    ``consumer`` (a :class:`~celery_dlq.worker.consumer_link.ConsumerLink`)
    gives the dispatcher at each send, since the consumer makes a new one
    whenever it reconnects. Without one (a process that is not a worker)
    nothing is sent.
    """

    def __init__(self, app: Any, consumer: Any = None) -> None:
        self.app = app
        self.consumer = consumer

    def dead_lettered(self, task_id: str | None, task_name: str | None, *, dlq: str | None, queue: str,
                      reason: str, delivery: int, exception_type: str) -> None:
        self._send(DEAD_LETTERED, task_id, task_name, dlq=dlq, queue=queue, reason=reason,
                   delivery_count=delivery, exception_type=exception_type)

    def redelivery_scheduled(self, task_id: str | None, task_name: str | None, *, delivery: int, due: float,
                             queue: str, exception_type: str) -> None:
        self._send(REDELIVERY_SCHEDULED, task_id, task_name, delivery_count=delivery, due=due, queue=queue,
                   exception_type=exception_type)

    def breaker_changed(self, task_id: str | None, task_name: str | None, *, queue: str, group: str, state: str,
                        cooldown: float) -> None:
        """A circuit breaker of ``task_name`` on ``queue`` is now ``state``; ``task_id``'s outcome changed it."""
        self._send(BREAKER_CHANGED, task_id, task_name, queue=queue, group=group, state=state, cooldown=cooldown)

    def _send(self, type_: str, task_id: str | None, task_name: str | None, **fields: Any) -> None:
        dispatcher = getattr(self.consumer, "event_dispatcher", None)
        if dispatcher is None or not task_id or not getattr(dispatcher, "enabled", False):
            return
        try:
            task = self.app.tasks.get(task_name) if task_name else None
            if task is not None and not getattr(task, "send_events", True):
                return
            dispatcher.send(type_, uuid=task_id, name=task_name, **fields)
        except Exception:  # an event is a notice: never fail the worker's settled write for it
            logger.warning("celery-dlq: could not send the %s event of %s[%s]", type_, task_name, task_id,
                           exc_info=True)
