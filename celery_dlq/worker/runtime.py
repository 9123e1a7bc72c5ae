"""The per-app runtime inside a worker: settings, Redis connections, the store, counters, archive, dead-letterer.

:func:`celery_dlq.worker.install.install` builds one :class:`Runtime` per app
and hands it to the consumer bootsteps; the Task, Request and Strategy
classes (which Celery instantiates itself) find it on their app with
:func:`runtime_of`. Every Redis connection is made lazily and per process, so
prefork children never share a socket with their parent.

A message's context (its queue, policy, delivery number and captured
envelope) is resolved once per message, by :meth:`Runtime.context`.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from celery.utils.saferepr import saferepr
from kombu.compression import compress
from kombu.serialization import dumps as encode_body
from kombu.serialization import loads as decode_body
from kombu.serialization import prepare_accept_content, registry
from kombu.utils import json
from kombu.utils.uuid import uuid

from celery_dlq import headers as H
from celery_dlq.element import SOURCE_TAG_PROPERTY, redelivery_element, with_body
from celery_dlq.errors import BrokerNotSupported
from celery_dlq.internals.base import usable
from celery_dlq.internals.kombu_redis import DIRECT_PARK, raw_element
from celery_dlq.message import Envelope, queue_of, with_task_arguments
from celery_dlq.policy import RedeliveryPolicy
from celery_dlq.settings import DLQSettings
from celery_dlq.signals import send_isolated, task_redelivery_scheduled
from celery_dlq.storage.archive import PAYLOAD_HASH, EventLog
from celery_dlq.storage.client import broker_client, broker_url, worker_client
from celery_dlq.storage.counters import DeliveryCounters
from celery_dlq.storage.keys import UNKNOWN_TASK_ID, QueueLists
from celery_dlq.storage.replication import Replication
from celery_dlq.storage.scripts import Scripts
from celery_dlq.storage.shards import Shard, ShardedStore, shards_of
from celery_dlq.storage.store import DirectPayload, ParkedStore
from celery_dlq.tasklevel import task_levels
from celery_dlq.worker.chords import ChordMembers
from celery_dlq.worker.deadletter import DeadLetterer
from celery_dlq.worker.fetch_moves import FetchMoves, MoveTally, fetch_moves
from celery_dlq.worker.task_events import TaskEvents

logger = logging.getLogger(__name__)

#: ``Envelope.extra`` key: the delivery tag of the consumed message a parked copy came from.
SOURCE_TAG = "source_delivery_tag"
#: The app attribute holding its runtime.
ATTR = "_celery_dlq"
#: Tasks whose class sets this attribute true are managed by celery-dlq (``RedeliveryTask`` does).
MANAGED = "celery_dlq_managed"


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


def is_managed(task: Any) -> bool:
    """Whether ``task`` is a celery-dlq task (a ``RedeliveryTask`` or a subclass)."""
    return bool(getattr(task, MANAGED, False))


class Runtime:
    """celery-dlq's state for one app in one worker, its Redis half built on first use in each process."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.installed = False
        #: Names this runtime in ``broker_transport_options`` (plain data), for the worker's transport.
        self.ident = f"{getattr(app, 'main', None) or 'app'}:{id(self):x}"
        _by_ident[self.ident] = self
        self._settings: DLQSettings | None = None
        self._pid: int | None = None
        self._lock = threading.Lock()
        #: The worker consumer's timer (set by the task strategy); retries failed writes.
        self.timer: Any = None
        #: Celery task events (``-E``); the task strategy hands it the worker's consumer.
        self.events = TaskEvents(app)
        #: Due entries this process's fetches moved (``worker/fetch_moves.py``), written by the mover thread.
        self.fetch_moved = MoveTally()

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
        for task in list(self.app.tasks.values()):
            if getattr(task, "redelivery_policy", None) is None and not is_managed(task):
                continue
            for queue in queues:
                self.policy(task, queue)

    def capped_delay_warnings(self) -> list[str]:
        """One line per registered task (and queue) whose own delay a cap it did not set cuts short."""
        queues = list(self.app.amqp.queues) or [self.app.conf.task_default_queue]
        warnings: list[str] = []
        for task in list(self.app.tasks.values()):
            if not is_managed(task):
                continue
            levels = task_levels(task)
            for queue in queues:
                for warning in self.settings.capped_delays(task.name, queue, levels):
                    if warning not in warnings:
                        warnings.append(warning)
        return warnings

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

    # -- Redis --------------------------------------------------------------

    def _connect(self) -> None:
        settings = self.settings
        self._client = worker_client(settings.redis_url, settings.redis_cluster)
        self.shards = shards_of(settings)
        #: The home key set (the only one unless ``dlq_store_shards`` > 1): fetch sets, quarantines.
        self.keys = self.shards.home
        scripts = Scripts(self._client)
        replication = (Replication(self._client, settings.store_min_replicas, settings.store_replica_timeout)
                       if settings.store_min_replicas else None)
        self._sharded = ShardedStore(self._client, self.shards, events_max_length=settings.events_max_length,
                                     replication=replication, register=True)
        self._counters = DeliveryCounters(self._client, self.shards, scripts, settings.delivery_count_ttl)
        self._deadletterer = DeadLetterer(self.app, self._client, self._sharded, audit_ttl=settings.audit_ttl,
                                          redis_url=settings.redis_url, events=self.events)
        self._chords = ChordMembers(self.app, self._client, self.keys)
        self._broker: Any = None
        self._pid = os.getpid()

    def _ensure(self) -> None:
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._connect()

    @property
    def client(self) -> Any:
        self._ensure()
        return self._client

    @property
    def sharded(self) -> ShardedStore:
        """Every shard of the store (one unless ``dlq_store_shards`` > 1): the mover serves them all."""
        self._ensure()
        return self._sharded

    def shard(self, task_id: str | None) -> Shard:
        """The shard holding ``task_id``'s parked entries and archive events."""
        return self.sharded.of(task_id)

    @property
    def store(self) -> ParkedStore:
        """The home shard's store: the whole store unless ``dlq_store_shards`` > 1."""
        return self.sharded.home.store

    @property
    def counters(self) -> DeliveryCounters:
        self._ensure()
        return self._counters

    @property
    def archive(self) -> EventLog:
        """The home shard's archive stream: the whole archive unless ``dlq_store_shards`` > 1."""
        return self.sharded.home.archive

    @property
    def deadletterer(self) -> DeadLetterer:
        self._ensure()
        return self._deadletterer

    @property
    def chords(self) -> ChordMembers:
        """Dead-lettered chord members: their rule, their replay (docs/workflows.md)."""
        self._ensure()
        return self._chords

    # -- operations ---------------------------------------------------------

    @cached_property
    def direct(self) -> bool:
        """Whether parked copies are kombu's own elements, moved inside Redis (``redis.store.DirectPayload``).

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
    def fetch_moves(self) -> FetchMoves | None:
        """What a fetch needs to move its own queues' due entries first, or None (``worker/fetch_moves.py``)."""
        return fetch_moves(self)

    @property
    def broker(self) -> Any:
        """The broker's Redis (the store's client when they are one server); only on a Redis broker."""
        self._ensure()
        if self._broker is None:
            self._broker = broker_client(self.app.conf, self._client, self.settings.redis_url)
        return self._broker

    @cached_property
    def lists(self) -> QueueLists:
        """Where kombu's Redis transport keeps each queue (priority sub-lists, ``global_keyprefix``)."""
        return QueueLists.of(self.app.conf.broker_transport_options)

    def redeliver_later(self, envelope: Envelope, *, delivery: int, failure: Mapping[str, str], delay: float,
                        message: Any = None, new_body: bool = False) -> float:
        """Park the message to be delivered again as number ``delivery + 1`` after ``delay`` seconds.

        ``message`` is the consumed kombu message: on a Redis broker that is
        also the store, what is parked is the element kombu will pop (its
        body as kombu encoded it, the next delivery's headers), moved back
        inside Redis. ``new_body``: ``envelope`` carries another body than the
        consumed message (:meth:`with_arguments`), which the parked copy takes.
        The message's expiry (Celery's ``expires``) is stored with it, for the
        mover. Returns the due time. Raises on any Redis error, before which
        nothing was acknowledged.
        """
        now = time.time()
        due = now + max(0.0, float(delay))
        nxt = delivery + 1
        headers = H.redelivery_headers(envelope.headers, delivery=nxt, queue=envelope.queue,
                                       exchange=envelope.exchange, routing_key=envelope.routing_key,
                                       failure=failure, now=now)
        copy = envelope.with_headers(headers)
        shard = self.shard(envelope.task_id or UNKNOWN_TASK_ID)   # the shard of the entry id _park_once makes
        event, max_length = shard.archive.parked_fields(copy, failure=failure, delivery=delivery, due=due, now=now)
        raw = raw_element(message) if message is not None and self.direct and usable(DIRECT_PARK) else None
        if raw is not None:
            if new_body:
                raw = with_body(raw, envelope.body, envelope.content_type, envelope.content_encoding)
            element = redelivery_element(raw, headers, tag=uuid(), source_tag=envelope.delivery_tag)
            dest = self.lists.key(envelope.queue, element["properties"].get("priority"))
            payload = DirectPayload(envelope.queue, dest, envelope.task_name or "",
                                    json.dumps(element).encode("utf-8")).dumps()
        else:
            extra = {**copy.extra, **({SOURCE_TAG: envelope.delivery_tag} if envelope.delivery_tag else {})}
            if event and event.get("payload_hash"):  # the mover's redelivered event reuses it
                extra[PAYLOAD_HASH] = event["payload_hash"]
            payload = replace(copy, extra=extra).dumps()
        channel = getattr(message, "channel", None) if raw is not None else None
        settle = channel if callable(getattr(channel, "settled", None)) else None
        ack = (settle.ack_keys(), envelope.delivery_tag) if settle is not None and envelope.delivery_tag else None
        parked = self._park_once(shard.store, payload, envelope, nxt, due, event, max_length, ack,
                                 H.expires_at(headers))
        if ack is not None:   # the park script acknowledged the consumed message: kombu's ack only forgets it
            settle.settled(envelope.delivery_tag)
        if not parked:
            return due
        send_isolated(task_redelivery_scheduled, sender=envelope.task_name, task_id=envelope.task_id,
                      task_name=envelope.task_name, delivery_count=nxt, due=due, exception=dict(failure))
        self.events.redelivery_scheduled(envelope.task_id, envelope.task_name, delivery=nxt, due=due,
                                         queue=envelope.queue, exception_type=failure.get("type", ""))
        return due

    def with_arguments(self, envelope: Envelope, args: list, kwargs: dict) -> Envelope:
        """The message with new task arguments, encoded as the original was (``self.retry(args=...)``).

        The original body is decoded only as the app's ``accept_content``
        allows (the worker accepted it to run it); the new one is encoded
        with the same serializer, so callbacks, errbacks and chains in it are
        kept. A compressed message (kombu's ``compression`` header; the
        consumed body is the decompressed one) is compressed again. Celery's
        ``argsrepr``/``kwargsrepr`` headers follow. Raises if the body cannot
        be decoded or the arguments encoded.
        """
        accept = prepare_accept_content(self.app.conf.accept_content)
        decoded = decode_body(envelope.body, envelope.content_type, envelope.content_encoding, accept=accept)
        serializer = registry.type_to_name[envelope.content_type]
        content_type, content_encoding, body = encode_body(with_task_arguments(decoded, args, kwargs),
                                                           serializer=serializer)
        body = body if isinstance(body, bytes) else body.encode(content_encoding)
        headers = dict(envelope.headers)
        if headers.get("compression"):
            body, _ = compress(body, headers["compression"])
        if "argsrepr" in headers:
            headers["argsrepr"] = saferepr(args)
        if "kwargsrepr" in headers:
            headers["kwargsrepr"] = saferepr(kwargs)
        return replace(envelope, body=body, content_type=content_type, content_encoding=content_encoding,
                       headers=headers)

    def _park_once(self, store: ParkedStore, payload: bytes, envelope: Envelope, nxt: int, due: float,
                   event: Any, max_length: int, ack: Any = None, expires: float | None = None) -> bool:
        """Park ``payload`` as entry ``<task id>:<next delivery>``; False if this very message is parked already.

        The entry id makes a park idempotent when the same message instance
        is delivered again after its worker died mid-park (kombu keeps its
        delivery tag). Two *different* messages that share a task id (ids
        chosen by the application) must both be parked: the second gets the
        delivery tag in its entry id instead of being mistaken for a repeat.
        """
        task_id = envelope.task_id or UNKNOWN_TASK_ID
        entry_id = f"{task_id}:{nxt}"
        if store.park(entry_id, payload, envelope.queue, due, event, max_length, ack, envelope.task_name, expires):
            return True
        existing = store.get(entry_id)
        tag = envelope.delivery_tag
        if existing is None or not tag or source_tag_of(existing.payload) == tag:
            return False  # parked already by an earlier delivery of this same message
        return store.park(f"{entry_id}:{tag}", payload, envelope.queue, due, event, max_length,
                               task=envelope.task_name, expires=expires)

    def dead_letter(self, envelope: Envelope, **kwargs: Any) -> str | None:
        return self.deadletterer.dead_letter(envelope, **kwargs)


_by_ident: weakref.WeakValueDictionary[str, Runtime] = weakref.WeakValueDictionary()


def runtime_by_ident(ident: str | None) -> Runtime | None:
    """The runtime named ``Runtime.ident`` (what the transport finds through its transport options), or None."""
    return _by_ident.get(ident) if ident else None


def source_tag_of(payload: bytes) -> str | None:
    """The delivery tag of the consumed message a parked payload (either format) came from."""
    direct = DirectPayload.loads(payload)
    if direct is not None:
        return (json.loads(direct.element).get("properties") or {}).get(SOURCE_TAG_PROPERTY)
    return Envelope.loads(payload).extra.get(SOURCE_TAG)


def runtime_of(app: Any) -> Runtime:
    """The app's runtime, made on first use (``install()`` makes it and adds the worker bootsteps)."""
    runtime = app.__dict__.get(ATTR)
    if runtime is None:
        runtime = Runtime(app)
        setattr(app, ATTR, runtime)
    return runtime


def delivery_count(request: Any) -> int:
    """This delivery's number inside a task (1 on the first delivery).

    ``request`` is ``task.request``; the count is the persisted one when
    ``persist_delivery_count_before_delivery`` is on, else the header's.
    """
    getter = request.get if hasattr(request, "get") else (lambda k, d=None: getattr(request, k, d))
    return H.delivery_count_of({H.DELIVERY_COUNT: getter(H.DELIVERY_COUNT, None)})
