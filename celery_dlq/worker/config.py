"""One app's celery-dlq configuration in a worker: its settings, each task's policy, each message's context.

Settings are read from the app's configuration on first use (``install()``
may run before the app is configured) and checked again by the worker's
``Settings`` bootstep. A consumed message's queue, policy and delivery
number are resolved once, into a :class:`MessageContext`. Nothing here
talks to Redis.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from celery_dlq import headers as H
from celery_dlq.errors import BrokerNotSupported
from celery_dlq.message import Envelope, queue_of
from celery_dlq.policy import RedeliveryPolicy
from celery_dlq.settings import DLQSettings
from celery_dlq.storage.client import broker_url
from celery_dlq.storage.keys import QueueLists
from celery_dlq.tasklevel import task_levels

#: Tasks whose class sets this attribute true are managed by celery-dlq (``RedeliveryTask`` does).
MANAGED = "celery_dlq_managed"


def is_managed(task: Any) -> bool:
    """Whether ``task`` is a celery-dlq task (a ``RedeliveryTask`` or a subclass)."""
    return bool(getattr(task, MANAGED, False))


@dataclass(frozen=True)
class MessageContext:
    """One consumed message as the engine needs it, resolved once: where it came from, its policy, its delivery.

    ``envelope`` (the message captured whole) is built on first use, so a
    message that never fails costs no copy.
    """

    message: Any
    queue: str
    policy: RedeliveryPolicy
    delivery: int

    @cached_property
    def envelope(self) -> Envelope:
        return Envelope.from_message(self.message, self.queue)


class Config:
    """The ``dlq_*`` settings of one app and the policies they give its tasks."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._settings: DLQSettings | None = None

    @property
    def settings(self) -> DLQSettings:
        if self._settings is None:
            self._settings = DLQSettings.from_conf(self.app.conf)
        return self._settings

    def validate(self) -> None:
        """Raise :class:`ConfigurationError` now for any bad setting or task policy.

        Resolves the policy of every registered task for every configured
        queue, so cross-level merges are checked before the first failure.
        """
        self._settings = DLQSettings.from_conf(self.app.conf)
        for task in list(self.app.tasks.values()):
            if getattr(task, "redelivery_policy", None) is None and not is_managed(task):
                continue
            for queue in self._queues():
                self.policy(task, queue)

    def capped_delay_warnings(self) -> list[str]:
        """One line per registered task (and queue) whose own delay a cap it did not set cuts short."""
        warnings: list[str] = []
        for task in list(self.app.tasks.values()):
            if not is_managed(task):
                continue
            levels = task_levels(task)
            for queue in self._queues():
                for warning in self.settings.capped_delays(task.name, queue, levels):
                    if warning not in warnings:
                        warnings.append(warning)
        return warnings

    def _queues(self) -> list[str]:
        return list(self.app.amqp.queues) or [self.app.conf.task_default_queue]

    def policy(self, task: Any, queue: str | None) -> RedeliveryPolicy:
        """The effective policy of ``task`` (a task object or a name) on ``queue``."""
        name = task if isinstance(task, str) else task.name
        task_obj = self.app.tasks.get(name) if isinstance(task, str) else task
        return self.settings.policy_for(name, queue, lambda: task_levels(task_obj))

    def context(self, task: Any, message: Any, headers: Mapping[str, Any] | None = None) -> MessageContext:
        """The context of a consumed kombu ``message`` of ``task``; ``headers`` (default: the message's) give
        the delivery number."""
        queue = queue_of(self.app, message.delivery_info)
        headers = message.headers if headers is None else headers
        return MessageContext(message, queue, self.policy(task, queue),
                              H.delivery_count_of(headers if isinstance(headers, Mapping) else None))

    @cached_property
    def direct(self) -> bool:
        """Whether parked copies are kombu's own elements, moved inside Redis (``storage.store.DirectPayload``).

        True when the broker is Redis and is also the store (``dlq_redis_url``
        unset, or the broker's URL): the mover then LPUSHes parked copies onto
        kombu's lists in one script. Otherwise (RabbitMQ, a separate store)
        parked copies are envelopes a mover publishes through kombu.
        """
        try:
            return broker_url(self.app.conf) == self.settings.redis_url
        except BrokerNotSupported:
            return False

    @cached_property
    def breakers(self) -> bool:
        """Whether any policy level (configuration or task) sets ``breaker``: only then do the fetch scripts look
        at what breakers hold (one command more per message), where the broker is the store."""
        s = self.settings
        levels = [s.default_policy, *(fields for _, fields in s.task_policies.items),
                  *(fields for _, fields in s.queue_policies.items)]
        levels += [fields for task in self.app.tasks.values() for _, fields in task_levels(task)]
        return any(isinstance(fields, Mapping) and fields.get("breaker", {}).get("enabled") for fields in levels)

    @cached_property
    def lists(self) -> QueueLists:
        """Where kombu's Redis transport keeps each queue (priority sub-lists, ``global_keyprefix``)."""
        return QueueLists.of(self.app.conf.broker_transport_options)
