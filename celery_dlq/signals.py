"""Signals celery-dlq sends, so applications can alert or clean up.

Both are sent in the worker's main process after the parked copy or the dead
letter is safely stored. Celery's :class:`~celery.utils.dispatch.Signal`
already logs a receiver that raises and carries on; :func:`send_isolated`
adds a second guard so nothing a receiver does can lose the message.
"""
from __future__ import annotations

import logging

from celery.utils.dispatch import Signal

logger = logging.getLogger(__name__)

#: sender: the task name. Arguments: task_id, task_name, delivery_count (of the
#: coming delivery), due (unix seconds), exception (a dict: type, message, traceback).
task_redelivery_scheduled = Signal(
    name="task_redelivery_scheduled",
    providing_args={"task_id", "task_name", "delivery_count", "due", "exception"},
)

#: sender: the task name. Arguments: task_id, task_name, original_queue,
#: dead_letter_queue (None when dropped), reason, exception (a dict), delivery_count.
#: Sent for every reason; for a list element that is not a task (invalid_message,
#: from the worker's fetch) sender, task_id and task_name are None.
task_dead_lettered = Signal(
    name="task_dead_lettered",
    providing_args={"task_id", "task_name", "original_queue", "dead_letter_queue",
                    "reason", "exception", "delivery_count"},
)


def send_isolated(signal: Signal, **kwargs) -> None:
    try:
        signal.send(**kwargs)
    except Exception:  # Signal.send is robust already; this guards BaseException-free bugs in it
        logger.exception("celery-dlq: signal %s failed", signal.name)
