"""The worker's consumer, as the parts Celery does not hand it to reach it: its timer and its event dispatcher.

The Request (which retries a failed write on the consumer's timer) and the
task events (sent through the consumer's dispatcher) are made by Celery or
before any consumer exists; the ``BindConsumer`` bootstep binds the
consumer here once, when the worker builds it. The dispatcher is read at
each use: the consumer makes a new one whenever it reconnects. Until bound
(a process that is not a worker) both are None.
"""
from __future__ import annotations

from typing import Any


class ConsumerLink:
    """One worker consumer, bound by its bootstep (:meth:`bind`); None's until then."""

    def __init__(self) -> None:
        self.consumer: Any = None

    def bind(self, consumer: Any) -> None:
        self.consumer = consumer

    @property
    def timer(self) -> Any:
        """The consumer's timer (retries of failed writes), or None."""
        return getattr(self.consumer, "timer", None)

    @property
    def event_dispatcher(self) -> Any:
        """The consumer's current event dispatcher, or None."""
        return getattr(self.consumer, "event_dispatcher", None)
