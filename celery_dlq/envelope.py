"""The original kombu message, captured whole so it can be parked and published again.

Publishing the original body bytes with ``content_type``/``content_encoding``
given makes kombu skip serialization, so the task id, args, kwargs and every
protocol-2 header survive unchanged; nothing is ever deserialized here.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from kombu.utils import json

#: kombu message properties worth carrying over (the rest are per-delivery).
CARRIED_PROPERTIES = ("correlation_id", "reply_to", "priority", "delivery_mode")
FORMAT_VERSION = 1


class TaskIdentity:
    """The task id and name of a Celery message: protocol 2 headers, or the correlation id."""

    headers: dict[str, Any]
    properties: dict[str, Any]

    @property
    def task_id(self) -> str | None:
        return self.headers.get("id") or self.properties.get("correlation_id")

    @property
    def task_name(self) -> str | None:
        return self.headers.get("task")


@dataclass(frozen=True)
class Envelope(TaskIdentity):
    body: bytes
    content_type: str | None
    content_encoding: str | None
    headers: dict[str, Any]
    properties: dict[str, Any]
    exchange: str
    routing_key: str
    queue: str
    extra: dict[str, Any] = field(default_factory=dict)
    #: The broker's delivery tag of the consumed instance (not stored, not republished).
    delivery_tag: str | None = field(default=None, compare=False)

    @classmethod
    def from_message(cls, message: Any, queue: str) -> Envelope:
        body = message.body
        if isinstance(body, str):
            body = body.encode("utf-8")
        properties = message.properties or {}
        info = message.delivery_info or {}
        return cls(
            body=body if body is not None else b"",
            content_type=message.content_type,
            content_encoding=message.content_encoding,
            headers=dict(message.headers or {}),
            properties={k: properties[k] for k in CARRIED_PROPERTIES if properties.get(k) is not None},
            exchange=info.get("exchange") or "",
            routing_key=info.get("routing_key") or queue,
            queue=queue,
            delivery_tag=tag if isinstance(tag := properties.get("delivery_tag"), str) else None,
        )

    def with_headers(self, headers: Mapping[str, Any]) -> Envelope:
        return replace(self, headers=dict(headers))

    def dumps(self) -> bytes:
        return json.dumps({
            "v": FORMAT_VERSION,
            "body": base64.b64encode(self.body).decode("ascii"),
            "content_type": self.content_type,
            "content_encoding": self.content_encoding,
            "headers": self.headers,
            "properties": self.properties,
            "exchange": self.exchange,
            "routing_key": self.routing_key,
            "queue": self.queue,
            **({"extra": self.extra} if self.extra else {}),
        }).encode("utf-8")

    @classmethod
    def loads(cls, data: bytes | str) -> Envelope:
        doc = json.loads(data)
        return cls(
            body=base64.b64decode(doc["body"]),
            content_type=doc.get("content_type"),
            content_encoding=doc.get("content_encoding"),
            headers=doc.get("headers") or {},
            properties=doc.get("properties") or {},
            exchange=doc.get("exchange") or "",
            routing_key=doc.get("routing_key") or doc["queue"],
            queue=doc["queue"],
            extra=doc.get("extra") or {},
        )

    def publish(self, producer: Any, *, exchange: str | None = None, routing_key: str | None = None,
                declare: tuple = ()) -> None:
        """Publish the message as it was, to its own exchange and routing key unless told otherwise."""
        producer.publish(
            self.body,
            exchange=self.exchange if exchange is None else exchange,
            routing_key=self.routing_key if routing_key is None else routing_key,
            headers=self.headers,
            content_type=self.content_type or "application/octet-stream",
            content_encoding=self.content_encoding or "binary",
            declare=list(declare),
            retry=True,
            retry_policy={"max_retries": 3, "interval_start": 0.1, "interval_step": 0.5},
            **self.properties,
        )


def queue_of(app: Any, delivery_info: Mapping[str, Any] | None) -> str:
    """The queue a message was consumed from.

    kombu's virtual transports only carry ``exchange`` and ``routing_key``.
    With Celery's default direct routing the exchange is ``''`` (or named
    after the queue) and the routing key is the queue name; otherwise the
    app's declared queues say which queue binds that exchange and key.
    """
    info = delivery_info or {}
    exchange = info.get("exchange") or ""
    routing_key = info.get("routing_key") or ""
    if not exchange:
        return routing_key
    queues = app.amqp.queues
    if routing_key in queues and _exchange_name(queues[routing_key]) in ("", exchange):
        return routing_key
    for name, queue in queues.items():
        if _exchange_name(queue) == exchange and queue.routing_key in (routing_key, "#", ""):
            return name
    return routing_key or exchange


def _exchange_name(queue: Any) -> str:
    return queue.exchange.name if queue.exchange is not None else ""
