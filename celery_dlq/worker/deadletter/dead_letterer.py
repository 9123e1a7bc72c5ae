"""Dead letters: naming the DLQ, publishing the original message there once, then recording it.

A dead letter is the original message (body untouched) published to a plain
kombu queue, ``DLQ.<queue>`` by default, with ``x-dlq-*`` headers saying where
it came from and why it died. ``redis-cli LLEN DLQ.orders`` shows it on a
Redis broker (a list needs no declaring; off Redis the queue is declared on
first use).

On a Redis broker the dead letter is pushed by a Lua script
(``lua/dead_letter.lua``) that also counts it in the DLQ's failure-group
index (:mod:`celery_dlq.storage.groups`), so the counts never drift from the
lists, whatever is killed when; the letter is exactly what a kombu publish
would have pushed, plus its group id (``x-dlq-group``). On another broker
it is published through kombu, without groups. Counting, archiving, the
signal and retention are the recorder's (:mod:`celery_dlq.worker.deadletter.recorder`),
for a dropped message too.

Idempotence (ActiveMQ's DLQ audit): an audit key per (task id, delivery,
delivery tag of the consumed message instance)
moves from ``pending`` to ``done`` around the publish. A redelivered copy of a
message whose dead letter is ``done`` is acknowledged without a second dead
letter; one that is still ``pending`` (the worker died between publish and
mark) is published again: never lost, duplicated only in that narrow window.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from functools import partial
from typing import Any

from kombu import Exchange, Queue
from kombu.utils.uuid import uuid

from celery_dlq import headers as H
from celery_dlq.fingerprint import failure_group
from celery_dlq.message import Envelope, payload_hash
from celery_dlq.policy import RedeliveryPolicy
from celery_dlq.storage.client import BrokerLink
from celery_dlq.storage.dlq import DeadLetterLists
from celery_dlq.storage.factory import redis_side
from celery_dlq.storage.keys import UNKNOWN_TASK_ID, QueueLists
from celery_dlq.storage.letter_audit import LetterAudit
from celery_dlq.storage.shards import ShardedStore
from celery_dlq.worker.deadletter.recorder import Recorder
from celery_dlq.worker.deadletter.retention import Retention
from celery_dlq.worker.run.events import TaskEvents

logger = logging.getLogger(__name__)


def dead_letter_queue(name: str) -> Queue:
    """A plain durable queue on the default exchange, routed by its own name."""
    return Queue(name, Exchange(""), routing_key=name, durable=True, auto_delete=False)


class DeadLetterer:
    """Publishes dead letters through the app's producer pool; one per app and process."""

    def __init__(self, app: Any, client: Any, store: ShardedStore, *, audit_ttl: float,
                 redis_url: str, events: TaskEvents | None = None, broker: Any = None,
                 link: BrokerLink | None = None) -> None:
        self.app = app
        self.client = client
        #: A task's audit markers, counters and archive events go to its shard of the store.
        self.store = store
        self.audit_ttl_s = max(1, int(audit_ttl))
        #: Each dead letter's audit key, on the store's client (its shard's keys name it).
        self.audit = LetterAudit(client, self.audit_ttl_s)
        self._declared: set[str] = set()
        self._lock = threading.Lock()
        self.redis_url = redis_url
        self.lists = QueueLists.of(app.conf.broker_transport_options)
        #: The broker's Redis, where DLQs are lists (connected on first use unless given), shared with retention.
        self.link = link if link is not None else BrokerLink(app.conf, client, redis_url, broker)
        #: Every dead letter and drop is counted, archived, told and trimmed there.
        self.recorder = Recorder(store, Retention(redis_side(app, client=client, sharded=store, link=self.link)),
                                 events)

    def dead_letter(self, envelope: Envelope, *, delivery: int, policy: RedeliveryPolicy, reason: str,
                    failure: Mapping[str, str], worker: str) -> str | None:
        """Dead-letter (or drop, with ``dead_letter=False``) one message.

        Returns the DLQ name, or None when dropped. Raises if Redis or the
        broker fails, so that the caller leaves the original unacknowledged.
        """
        expired = reason == H.Reason.EXPIRED
        dlq = policy.expired_queue(envelope.queue) if expired else policy.dead_letter_queue(envelope.queue)
        task_id = envelope.task_id or UNKNOWN_TASK_ID
        keys = self.store.of(task_id).keys
        record = partial(self.recorder.record, reason=reason, failure=failure, delivery=delivery, policy=policy)
        if dlq is None:
            record(envelope, None)
            return None
        audit = keys.audit(task_id, delivery, envelope.delivery_tag)
        if not self.audit.begin(audit) and self.audit.done_already(audit, keys.stats):
            logger.info("celery-dlq: %s[%s] delivery %d is already in %s; not dead-lettering twice",
                        envelope.task_name, task_id, delivery, dlq)
            return dlq
        letter_headers = H.dead_letter_headers(
            envelope.headers, delivery=delivery, queue=envelope.queue, exchange=envelope.exchange,
            routing_key=envelope.routing_key, failure=failure, reason=reason, worker=worker)
        letter_headers[H.GROUP] = failure_group(envelope.task_name, failure)
        # Archiving its replay, purge or trim then needs no second parse of the body (redis/archive.py).
        letter_headers[H.PAYLOAD_HASH] = payload_hash(envelope.task_name, envelope.body, envelope.content_type,
                                                      envelope.content_encoding)
        letter = envelope.with_headers(letter_headers)
        self.publish(letter, dlq)
        record(letter, dlq, pipe=self.audit.done(audit))
        return dlq

    def publish(self, envelope: Envelope, dlq: str) -> None:
        """Push ``envelope`` onto ``dlq`` and count it in its failure group (one script); kombu off Redis."""
        letters = self.broker_letters()
        if letters is not None:
            letters.push(self.lists.key(dlq, envelope.properties.get("priority")), self.lists.groups(dlq),
                         envelope.element("", dlq, uuid()), envelope.headers, envelope.task_id)
            return
        declare = () if dlq in self._declared else (dead_letter_queue(dlq),)
        with self.app.producer_or_acquire() as producer:
            envelope.publish(producer, exchange="", routing_key=dlq, declare=declare)
        with self._lock:
            self._declared.add(dlq)

    def broker_letters(self) -> DeadLetterLists | None:
        """The DLQ lists' scripts on the broker's Redis; None when the broker is not Redis."""
        return DeadLetterLists(self.link.scripts.client, self.link.scripts) if self.link.on_redis() else None
