"""The per-app runtime: settings, the Redis client, the store, the dead-letterer.

:func:`install` attaches one :class:`DLQ` to an app and adds the worker's
consumer bootsteps. Every Redis connection is made lazily and per process, so
prefork children never share a socket with their parent.
"""
from __future__ import annotations

import collections
import logging
import os
import threading
import time
from dataclasses import replace
from typing import Any, Mapping

import redis

from celery_dlq import events
from celery_dlq import headers as H
from celery_dlq.deadletter import DeadLetterer
from celery_dlq.envelope import Envelope
from celery_dlq.keys import Keys, Scripts
from celery_dlq.policy import RedeliveryPolicy
from celery_dlq.settings import DLQSettings
from celery_dlq.signals import send_isolated, task_redelivery_scheduled
from celery_dlq.store import DelayedStore

logger = logging.getLogger(__name__)

#: ``Envelope.extra`` key: the delivery tag of the consumed message a parked copy came from.
SOURCE_TAG = "source_delivery_tag"

ATTR = "_celery_dlq"


class DLQ:
    """celery-dlq's state for one app, built on first use."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._settings: DLQSettings | None = None
        self._pid: int | None = None
        self._lock = threading.Lock()
        #: The worker consumer's timer (set by the task strategy); retries failed writes.
        self.timer: Any = None

    # -- configuration ------------------------------------------------------

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
        queues = list(self.app.amqp.queues) or [self.app.conf.task_default_queue]
        for name, task in list(self.app.tasks.items()):
            if getattr(task, "redelivery_policy", None) is None and not is_redelivery_task(task):
                continue
            for queue in queues:
                self.policy(task, queue)

    def policy(self, task: Any, queue: str | None) -> RedeliveryPolicy:
        """The effective policy of ``task`` (a task object or a name) on ``queue``."""
        name = task if isinstance(task, str) else task.name
        task_obj = self.app.tasks.get(name) if isinstance(task, str) else task
        return self.settings.policy_for(name, queue, lambda: task_policy_fields(task_obj))

    # -- Redis --------------------------------------------------------------

    def _connect(self) -> None:
        settings = self.settings
        self._client = redis.Redis.from_url(settings.redis_url, health_check_interval=30)
        self.keys = Keys(settings.key_prefix, settings.global_keyprefix)
        self.scripts = Scripts(self._client)
        self._store = DelayedStore(self._client, self.keys)
        self._deadletterer = DeadLetterer(self.app, self._client, self.keys, settings.audit_ttl)
        self._spent: collections.deque[str] = collections.deque()
        self._pid = os.getpid()

    def _ensure(self) -> None:
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._connect()

    @property
    def client(self) -> redis.Redis:
        self._ensure()
        return self._client

    @property
    def store(self) -> DelayedStore:
        self._ensure()
        return self._store

    @property
    def deadletterer(self) -> DeadLetterer:
        self._ensure()
        return self._deadletterer

    # -- operations ---------------------------------------------------------

    def _counter_key(self, task_id: str, tag: Any) -> str:
        return self.keys.delivery_count(f"{task_id}:{tag}" if isinstance(tag, str) and tag else task_id)

    def count_delivery(self, task_id: str, tag: Any, floor: int) -> int:
        """Count a repeated (``redelivered``) delivery of a message instance; return its number (> ``floor`` when unrecorded)."""
        self._ensure()
        return self.scripts.count_delivery(self._counter_key(task_id, tag), floor,
                                           int(self.settings.delivery_count_ttl))

    def forget_delivery(self, task_id: str, tag: Any) -> None:
        """The message was acknowledged: its delivery counter is no longer needed.

        A counter only matters while its message may be delivered again (a
        lost worker, kombu's visibility timeout). Left alone, every delivery
        would leave one behind for ``dlq_delivery_count_ttl``: at 1,000 tasks/s
        and 7 days, hundreds of millions of keys. Keys are queued here and
        deleted in batches by the mover thread, off the consumer's path.
        """
        self._ensure()
        self._spent.append(self._counter_key(task_id, tag))

    def uncount_deliveries(self, messages: list[tuple[str, Any, int]]) -> None:
        """``(task id, delivery tag, delivery number)`` of messages that never started: take those deliveries back.

        Each counter is set to one less than the delivery it recorded (0 for a
        first delivery), so the message's next, restored delivery counts as the
        same number again.
        """
        self._ensure()
        ttl = max(1, int(self.settings.delivery_count_ttl))
        pipe = self._client.pipeline(transaction=False)
        for task_id, tag, delivery in messages:
            pipe.set(self._counter_key(task_id, tag), max(0, int(delivery) - 1), ex=ttl)
        pipe.execute()

    def flush_spent_counters(self, batch: int = 1000) -> int:
        """Delete the counters of acknowledged messages, ``batch`` keys per round trip."""
        self._ensure()
        deleted = 0
        while self._spent:
            keys = []
            while self._spent and len(keys) < batch:
                keys.append(self._spent.popleft())
            self._client.unlink(*keys)
            deleted += len(keys)
        return deleted

    def park(self, envelope: Envelope, *, delivery: int, failure: Mapping[str, str], delay: float) -> float:
        """Park the message to be delivered again as number ``delivery + 1`` after ``delay`` seconds.

        Returns the due time. Raises on any Redis error, before which nothing
        was acknowledged.
        """
        now = time.time()
        due = now + max(0.0, float(delay))
        nxt = delivery + 1
        copy = envelope.with_headers(H.redelivery_headers(
            envelope.headers, delivery=nxt, queue=envelope.queue, exchange=envelope.exchange,
            routing_key=envelope.routing_key, failure=failure, now=now))
        if envelope.delivery_tag:  # which consumed instance this copy came from (see _park_once)
            copy = replace(copy, extra={**copy.extra, SOURCE_TAG: envelope.delivery_tag})
        event, max_length = events.parked_fields(self, copy, failure=failure, delivery=delivery, due=due, now=now)
        if event and event.get("payload_hash"):  # the redelivered event reuses it (no second parse and hash)
            copy = replace(copy, extra={**copy.extra, events.PAYLOAD_HASH: event["payload_hash"]})
        if not self._park_once(copy, envelope, nxt, due, event, max_length):
            return due
        send_isolated(task_redelivery_scheduled, sender=envelope.task_name, task_id=envelope.task_id,
                      task_name=envelope.task_name, delivery_count=nxt, due=due, exception=dict(failure))
        return due

    def _park_once(self, copy: Envelope, envelope: Envelope, nxt: int, due: float,
                   event: Any, max_length: int) -> bool:
        """Park ``copy`` as entry ``<task id>:<next delivery>``; False if this very message is parked already.

        The entry id makes a park idempotent when the same message instance
        is delivered again after its worker died mid-park (kombu keeps its
        delivery tag). Two *different* messages that share a task id (ids
        chosen by the application) must both be parked: the second gets the
        delivery tag in its entry id instead of being mistaken for a repeat.
        """
        task_id = envelope.task_id or "unknown"
        payload = copy.dumps()
        entry_id = f"{task_id}:{nxt}"
        if self.store.park(entry_id, payload, envelope.queue, due, event, max_length):
            return True
        existing = self.store.get(entry_id)
        tag = envelope.delivery_tag
        if existing is None or not tag or Envelope.loads(existing.payload).extra.get(SOURCE_TAG) == tag:
            return False  # parked already by an earlier delivery of this same message
        return self.store.park(f"{entry_id}:{tag}", payload, envelope.queue, due, event, max_length)

    def dead_letter(self, envelope: Envelope, **kwargs: Any) -> str | None:
        return self.deadletterer.dead_letter(envelope, **kwargs)


def install(app: Any, validate: bool = True) -> DLQ:
    """Enable celery-dlq on ``app``: idempotent; adds the worker bootsteps, validates settings.

    Settings are validated now (unless ``validate=False``: binding a
    ``RedeliveryTask`` installs that way, since the app may not be configured
    yet), and always again when a worker starts, so a bad setting stops the
    worker with the setting's name.
    """
    dlq = app.__dict__.get(ATTR)
    if dlq is None:
        from celery_dlq.guard import Guard
        from celery_dlq.mover import Mover

        dlq = DLQ(app)
        setattr(app, ATTR, dlq)
        app.steps["consumer"].add(Guard)
        app.steps["consumer"].add(Mover)
    if validate:
        dlq.validate()
    return dlq


def get_dlq(app: Any) -> DLQ:
    dlq = app.__dict__.get(ATTR)
    return dlq if dlq is not None else install(app, validate=False)


def resolve_policy(app: Any, task_name: str, queue: str | None) -> RedeliveryPolicy:
    """The effective :class:`RedeliveryPolicy` of a task on a queue (cached per pair)."""
    return get_dlq(app).policy(task_name, queue)


def task_policy_fields(task: Any) -> dict[str, Any]:
    from celery_dlq.policy import validate_fields

    spec = getattr(task, "redelivery_policy", None) if task is not None else None
    if spec is None:
        return {}
    return validate_fields(spec, f"task {getattr(task, 'name', task)!r} redelivery_policy")


def is_redelivery_task(task: Any) -> bool:
    from celery_dlq.task import RedeliveryTask

    return isinstance(task, RedeliveryTask)


def delivery_count(request: Any) -> int:
    """This delivery's number inside a task (1 on the first delivery).

    ``request`` is ``task.request``; the count is the persisted one when
    ``persist_delivery_count_before_delivery`` is on, else the header's.
    """
    getter = request.get if hasattr(request, "get") else (lambda k, d=None: getattr(request, k, d))
    return H.delivery_count_of({H.DELIVERY_COUNT: getter(H.DELIVERY_COUNT, None)})
