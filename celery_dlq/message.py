"""A message, in one place: the captured original (:class:`Envelope`) and the one decoder of kombu's raw form.

* :class:`Envelope` is a consumed kombu message captured whole, so it can be
  parked and published again. Publishing the original body bytes with
  ``content_type``/``content_encoding`` given makes kombu skip
  serialization, so the task id, args, kwargs and every protocol-2 header
  survive unchanged.
* :func:`decode_raw` reads a message as kombu's Redis transport stores it (a
  list element: JSON with ``body``, ``headers``, ``properties``); it is the
  only code that knows that shape. :func:`task_arguments` turns a decoded
  task body (protocol 1 or 2) into ``(args, kwargs)``.
* :func:`queue_of` and :func:`was_redelivered` read a consumed message's
  delivery info.

Only :func:`with_arguments` deserializes a body, as its caller's ``accept_content`` allows.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json as std_json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from celery.utils.saferepr import saferepr
from kombu.compression import compress
from kombu.serialization import dumps as encode_body
from kombu.serialization import loads as decode_body
from kombu.serialization import prepare_accept_content, registry
from kombu.utils import json

from celery_dlq import headers as H

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

    def element(self, exchange: str, routing_key: str, tag: str) -> bytes:
        """The message as kombu's Redis transport would push it after a publish to ``exchange``/``routing_key``.

        What ``publish`` makes kombu write (``Channel.prepare_message`` and
        ``_inplace_augment_message``): the body base64-encoded, the carried
        properties, priority 0 and persistent delivery unless set, a new
        delivery ``tag``. For code that pushes inside a Lua script.
        """
        properties = {"delivery_mode": 2, **self.properties}
        properties["priority"] = properties.get("priority") or 0
        properties.update(delivery_info={"exchange": exchange, "routing_key": routing_key},
                          body_encoding="base64", delivery_tag=tag)
        return json.dumps({
            "body": base64.b64encode(self.body).decode("ascii"),
            "content-encoding": self.content_encoding or "binary",
            "content-type": self.content_type or "application/octet-stream",
            "headers": self.headers,
            "properties": properties,
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


@dataclass(frozen=True)
class RawMessage(TaskIdentity):
    """A message as kombu's Redis transport stores it; ``doc`` is its JSON ({} when it is not a JSON object)."""

    doc: dict

    @property
    def headers(self) -> dict:  # type: ignore[override]
        value = self.doc.get("headers")
        return value if isinstance(value, dict) else {}

    @property
    def properties(self) -> dict:  # type: ignore[override]
        value = self.doc.get("properties")
        return value if isinstance(value, dict) else {}

    @property
    def content_type(self) -> str | None:
        return self.doc.get("content-type")

    @property
    def content_encoding(self) -> str | None:
        return self.doc.get("content-encoding")

    @property
    def body(self) -> bytes:
        """The body bytes: base64-decoded when the properties say so (as stored when that fails)."""
        body = self.doc.get("body") or ""
        body = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        if self.properties.get("body_encoding") == "base64":
            try:
                return base64.b64decode(body, validate=True)
            except (ValueError, binascii.Error):
                pass  # not what it claims: keep it as stored
        return body

    @property
    def dead_lettered_at(self) -> float | None:
        value = self.headers.get(H.DEAD_LETTERED_AT)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def as_envelope(self) -> Envelope:
        """The message as an :class:`Envelope` addressed to its original queue (``x-dlq-*`` headers).

        For a dead letter that is where :meth:`Envelope.publish` sends it home.
        """
        headers, properties = self.headers, self.properties
        queue = headers.get(H.ORIGINAL_QUEUE) or ""
        return Envelope(
            body=self.body, content_type=self.content_type, content_encoding=self.content_encoding,
            headers=headers,
            properties={k: properties[k] for k in CARRIED_PROPERTIES if properties.get(k) is not None},
            exchange=headers.get(H.ORIGINAL_EXCHANGE) or "",
            routing_key=headers.get(H.ORIGINAL_ROUTING_KEY) or queue, queue=queue)


def decode_raw(raw: bytes | str) -> RawMessage:
    """A list element of kombu's Redis transport; never raises (not JSON, or not an object: ``doc`` is {}).

    Decoded as ``kombu.utils.json.loads`` does (UTF-8, kombu's typed values
    restored by its ``object_hook``), with one decoder built once and the
    hook asked only about the objects it could change (``loads`` builds a
    decoder per call and the hook a set per object: a replay decodes every
    letter it moves, BENCHMARKS.md section 11).
    """
    try:
        text = bytes(raw).decode("utf-8") if isinstance(raw, (bytes, bytearray, memoryview)) else raw
        doc = _DECODER.decode(text)
    except (ValueError, TypeError, UnicodeDecodeError, RecursionError):
        doc = None
    return RawMessage(doc if isinstance(doc, dict) else {})


def _typed(o: dict) -> Any:
    """kombu's ``object_hook`` for the objects it restores (exactly the keys ``__type__`` and ``__value__``)."""
    return json.object_hook(o) if len(o) == 2 and "__type__" in o and "__value__" in o else o


_DECODER = std_json.JSONDecoder(object_hook=_typed)


def delivery_tags(n: int) -> list[str]:
    """``n`` new delivery tags as kombu makes them (``str(uuid.uuid4())``), from one ``os.urandom`` call.

    Formatted here rather than through ``uuid.UUID``: a replay tags every
    letter it moves, and ``uuid4()`` per letter showed in its profile (BENCHMARKS.md section 11).
    """
    digits = os.urandom(16 * n).hex()
    tags = []
    for at in range(0, 32 * n, 32):
        h = digits[at:at + 32]   # version 4, RFC 4122 variant (10xx): 122 random bits, as uuid4
        tags.append(f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}")
    return tags


_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}


def task_arguments(body: Any) -> tuple[list, dict] | None:
    """``(args, kwargs)`` of a decoded Celery task body (protocol 2 ``[args, kwargs, embed]`` or 1); else None."""
    if isinstance(body, (list, tuple)) and len(body) >= 2:
        args, kwargs = body[0], body[1]
    elif isinstance(body, dict) and "args" in body:
        args, kwargs = body.get("args"), body.get("kwargs")
    else:
        return None
    if not isinstance(args or (), (list, tuple)) or not isinstance(kwargs or {}, dict):
        return None
    return list(args or ()), dict(kwargs or {})


def with_task_arguments(body: Any, args: list | tuple, kwargs: Mapping[str, Any]) -> Any:
    """A decoded Celery task body with new ``args`` and ``kwargs``, everything else (``embed``) kept.

    Protocol 2 bodies are ``[args, kwargs, embed]``, protocol 1 bodies a dict
    with ``args`` and ``kwargs``. Raises ValueError for anything else.
    """
    if isinstance(body, (list, tuple)) and len(body) >= 2:
        return [list(args), dict(kwargs), *body[2:]]
    if isinstance(body, dict) and "args" in body:
        return {**body, "args": list(args), "kwargs": dict(kwargs)}
    raise ValueError(f"not a Celery task body: a {type(body).__name__}")


def with_arguments(envelope: Envelope, args: list, kwargs: dict, accept_content: Any) -> Envelope:
    """The message with new task arguments, encoded as the original was (``self.retry(args=...)``).

    The body is decoded only as ``accept_content`` (the app's) allows, and
    encoded again with its serializer, so callbacks and chains in it stay; a
    compressed one (kombu's ``compression`` header) is compressed again, and
    Celery's ``argsrepr``/``kwargsrepr`` follow. Raises if either step fails.
    """
    decoded = decode_body(envelope.body, envelope.content_type, envelope.content_encoding,
                          accept=prepare_accept_content(accept_content))
    content_type, content_encoding, body = encode_body(with_task_arguments(decoded, args, kwargs),
                                                       serializer=registry.type_to_name[envelope.content_type])
    body, headers = body if isinstance(body, bytes) else body.encode(content_encoding), dict(envelope.headers)
    if headers.get("compression"):
        body, _ = compress(body, headers["compression"])
    headers.update({name: saferepr(value) for name, value in (("argsrepr", args), ("kwargsrepr", kwargs))
                    if name in headers})
    return replace(envelope, body=body, content_type=content_type, content_encoding=content_encoding,
                   headers=headers)


#: JSON bodies larger than this are hashed as raw bytes (bounds the cost).
MAX_PARSED_BODY = 1024 * 1024
JSON_TYPES = ("application/json",)


def payload_hash(task_name: str | None, body: bytes, content_type: str | None = None,
                 content_encoding: str | None = None) -> str:
    """A stable 32-hex-digit hash of task name + arguments: it spots a payload that keeps failing.

    SHA-256 over the task name and the message's arguments. For a JSON body
    (Celery's default) the arguments are ``[args, kwargs]`` parsed with the
    standard ``json`` module and re-serialized canonically (sorted keys, no
    whitespace), so the same call hashes the same whatever the client's key
    order or Celery's ``embed`` (callbacks, chain) part. Any other content
    type (pickle, yaml, msgpack, ...) is hashed as its raw body bytes:
    decoding it would mean deserializing untrusted data, and pickle is never
    loaded here. The two kinds never collide (the hash input says which it is).
    """
    canonical = _json_arguments(body, content_type, content_encoding)
    digest = hashlib.sha256()
    digest.update((b"json\0" if canonical is not None else b"raw\0") + (task_name or "").encode("utf-8") + b"\0")
    digest.update(canonical if canonical is not None else bytes(body or b""))
    return digest.hexdigest()[:32]


def _json_arguments(body: bytes, content_type: str | None, content_encoding: str | None) -> bytes | None:
    """``[args, kwargs]`` as canonical JSON bytes, or None when the body is not plain JSON."""
    if (content_type or "").split(";")[0].strip().lower() not in JSON_TYPES:
        return None
    if (content_encoding or "utf-8").lower().replace("_", "-") not in ("utf-8", "utf8", "binary"):
        return None
    if not body or len(body) > MAX_PARSED_BODY:
        return None
    try:
        doc = std_json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    decoded = task_arguments(doc)
    arguments = list(decoded) if decoded is not None else [doc, None]
    try:
        return std_json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError, RecursionError):
        return None


def as_text(value: Any) -> str:
    """A Redis reply (bytes) or anything else as text; undecodable bytes are replaced, never raised on."""
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def instance_of(message: Any) -> str:
    """What tells one broker message apart across its redeliveries, beside its task id.

    On Redis, kombu's delivery tag (a restored message keeps it). On AMQP a
    redelivery gets a new tag, so a hash of the body: two messages an
    application sent under one task id are still counted apart, and a
    message that kills its whole worker is counted across restarts.
    """
    tag = (getattr(message, "properties", None) or {}).get("delivery_tag")
    if isinstance(tag, str) and tag:
        return tag
    body = getattr(message, "body", b"") or b""
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogatepass")
    return "b" + hashlib.blake2b(body, digest_size=8).hexdigest()


def was_redelivered(message: Any) -> bool:
    """Whether kombu delivered this very message instance before (restored it)."""
    return bool((getattr(message, "delivery_info", None) or {}).get("redelivered"))


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
