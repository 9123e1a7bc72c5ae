"""Parking a failed message for its next delivery: the copy, its entry id, and the acknowledgement in one script.

:meth:`Parking.redeliver_later` is the one path by which the worker parks
(a retry from the child, a lost worker with attempts left). Where the broker
is Redis and also the store, what is parked is the element kombu will pop,
moved back inside Redis by the mover; and the park script also settles what
the hook chain's ``park_settles`` answers (a message celery-dlq's channel fetched:
its in-flight record, ``worker/features/inflight_records.py``), so the channel's ack
costs no round trip. Elsewhere the parked copy is an :class:`Envelope` the
mover publishes.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from kombu.utils import json
from kombu.utils.uuid import uuid

from celery_dlq import headers as H
from celery_dlq.element import SOURCE_TAG_PROPERTY, redelivery_element, with_body
from celery_dlq.internals.base import usable
from celery_dlq.internals.kombu_redis import DIRECT_PARK, raw_element
from celery_dlq.message import Envelope
from celery_dlq.signals import send_isolated, task_redelivery_scheduled
from celery_dlq.storage.archive import PAYLOAD_HASH
from celery_dlq.storage.keys import UNKNOWN_TASK_ID
from celery_dlq.storage.store import DirectPayload, ParkedStore
from celery_dlq.storage.totals import Metric
from celery_dlq.worker.config import Config, MessageContext
from celery_dlq.worker.connections import Connections
from celery_dlq.worker.features.snooze import snooze_failure, snooze_headers
from celery_dlq.worker.middleware import Chain
from celery_dlq.worker.run.events import TaskEvents

#: ``Envelope.extra`` key: the delivery tag of the consumed message a parked copy came from.
SOURCE_TAG = "source_delivery_tag"
#: The ``failure`` a delivery held by an open circuit breaker records (it did not run).
HELD_FAILURE = {"type": "celery_dlq.BreakerOpen", "message": "held by an open circuit breaker (no attempt used)",
                "traceback": ""}


class Parking:
    """Parks one app's failed messages (``redis``: this process's connections; ``chain``: the runtime's)."""

    def __init__(self, config: Config, redis: Callable[[], Connections], events: TaskEvents,
                 chain: Callable[[], Chain]) -> None:
        self.config, self.redis, self.events, self.chain = config, redis, events, chain

    def _payload(self, envelope: Envelope, copy: Envelope, raw: Any, new_body: bool, event: Any) -> bytes:
        """What is parked: kombu's own element with the next delivery's headers (``raw``: a direct park), or
        the envelope with the next delivery's headers."""
        if raw is not None:
            if new_body:
                raw = with_body(raw, envelope.body, envelope.content_type, envelope.content_encoding)
            element = redelivery_element(raw, copy.headers, tag=uuid(), source_tag=envelope.delivery_tag)
            dest = self.config.lists.key(envelope.queue, element["properties"].get("priority"))
            return DirectPayload(envelope.queue, dest, envelope.task_name or "",
                                 json.dumps(element).encode("utf-8")).dumps()
        extra = {**copy.extra, **({SOURCE_TAG: envelope.delivery_tag} if envelope.delivery_tag else {})}
        if event and event.get("payload_hash"):  # the mover's redelivered event reuses it
            extra[PAYLOAD_HASH] = event["payload_hash"]
        return replace(copy, extra=extra).dumps()

    def redeliver_later(self, envelope: Envelope, *, delivery: int, failure: Mapping[str, str], delay: float,
                        message: Any = None, new_body: bool = False, metric: str = Metric.PARKED,
                        archived: bool = True) -> float:
        """Park the message to be delivered again as number ``delivery + 1`` after ``delay`` seconds.

        ``message`` is the consumed kombu message: on a Redis broker that is
        also the store, what is parked is the element kombu will pop (its
        body as kombu encoded it, the next delivery's headers), moved back
        inside Redis. ``new_body``: ``envelope`` carries another body than the
        consumed message (:func:`celery_dlq.message.with_arguments`), which
        the parked copy takes. The message's expiry (Celery's ``expires``) is
        stored with it, for the mover. ``metric`` is the counter raised
        (``snoozed_total`` and ``breaker_held_total`` park with ``delivery`` one
        lower: no attempt used). ``archived``: False parks without a
        ``parked`` event (a breaker's hold: its own events tell the story).
        Returns the due time. Raises on any
        Redis error, before which nothing was acknowledged.
        """
        now = time.time()
        due = now + max(0.0, float(delay))
        nxt = delivery + 1
        headers = H.redelivery_headers(envelope.headers, delivery=nxt, queue=envelope.queue,
                                       exchange=envelope.exchange, routing_key=envelope.routing_key,
                                       failure=failure, now=now)
        copy = envelope.with_headers(headers)
        shard = self.redis().shard(envelope.task_id or UNKNOWN_TASK_ID)   # the shard of the entry id park_once makes
        event, max_length = shard.archive.parked_fields(copy, failure=failure, delivery=delivery, due=due, now=now) \
            if archived else (None, 0)
        raw = raw_element(message) if message is not None and self.config.direct and usable(DIRECT_PARK) else None
        payload = self._payload(envelope, copy, raw, new_body, event)
        # What the chain answers (a message our channel fetched: its in-flight record) is settled by the park
        # script itself: its ack then only forgets it.
        tag = envelope.delivery_tag
        ack = self.chain().park_settles(message, tag) if raw is not None and tag else None
        parked = park_once(shard.store, payload, envelope, nxt, due, event, max_length, ack, H.expires_at(headers),
                           metric)
        if ack is not None and tag:
            self.chain().park_settled(message, tag)
        if not parked:
            return due
        send_isolated(task_redelivery_scheduled, sender=envelope.task_name, task_id=envelope.task_id,
                      task_name=envelope.task_name, delivery_count=nxt, due=due, exception=dict(failure))
        self.events.redelivery_scheduled(envelope.task_id, envelope.task_name, delivery=nxt, due=due,
                                         queue=envelope.queue, exception_type=failure.get("type", ""))
        return due


    def park_again(self, ctx: MessageContext, *, delay: float, snooze: bool = False) -> float:
        """Park without using an attempt: the next delivery keeps this one's number.

        A snooze (``snooze``: its count and seconds go into the copy's
        headers, counted as ``snoozed_total``) or a delivery an open circuit
        breaker holds (``breaker_held_total``, no ``parked`` event: one per
        held delivery would fill the archive during an outage; the breaker's
        own events are archived). Returns the due time.
        """
        envelope, failure = ctx.envelope, snooze_failure(delay) if snooze else HELD_FAILURE
        if snooze:
            envelope = envelope.with_headers(snooze_headers(envelope.headers, delay))
        return self.redeliver_later(envelope, delivery=ctx.delivery - 1, failure=failure, delay=delay,
                                    message=ctx.message, metric=Metric.SNOOZED if snooze else Metric.HELD,
                                    archived=snooze)


def park_once(store: ParkedStore, payload: bytes, envelope: Envelope, nxt: int, due: float, event: Any,
              max_length: int, ack: Any = None, expires: float | None = None, metric: str = Metric.PARKED) -> bool:
    """Park ``payload`` as entry ``<task id>:<next delivery>``; False if this very message is parked already.

    The entry id makes a park idempotent when the same message instance
    is delivered again after its worker died mid-park (kombu keeps its
    delivery tag). Two *different* messages that share a task id (ids
    chosen by the application) must both be parked: the second gets the
    delivery tag in its entry id instead of being mistaken for a repeat.
    """
    entry_id = f"{envelope.task_id or UNKNOWN_TASK_ID}:{nxt}"
    if store.park(entry_id, payload, envelope.queue, due, event, max_length, ack, envelope.task_name, expires,
                  metric):
        return True
    existing = store.get(entry_id)
    tag = envelope.delivery_tag
    if existing is None or not tag or source_tag_of(existing.payload) == tag:
        return False  # parked already by an earlier delivery of this same message
    return store.park(f"{entry_id}:{tag}", payload, envelope.queue, due, event, max_length,
                      task=envelope.task_name, expires=expires, metric=metric)


def source_tag_of(payload: bytes) -> str | None:
    """The delivery tag of the consumed message a parked payload (either format) came from."""
    direct = DirectPayload.loads(payload)
    if direct is not None:
        return (json.loads(direct.element).get("properties") or {}).get(SOURCE_TAG_PROPERTY)
    return Envelope.loads(payload).extra.get(SOURCE_TAG)
