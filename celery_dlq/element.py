"""kombu's Redis list elements: whether one can become a task message, and building the ones celery-dlq writes.

An *element* is what kombu's Redis transport pushes onto a queue list and
pops from it: JSON with ``body``, ``content-type``, ``content-encoding``,
``headers`` and ``properties`` (delivery tag, delivery info, priority, body
encoding). :func:`envelope_error` says why a decoded element cannot become a
task message; :func:`redelivery_element` and :func:`raw_dead_letter` build
the two kinds celery-dlq writes itself. Pure functions; no Redis.
"""
from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from kombu.utils import json

from celery_dlq import headers as H

#: kombu body encodings its virtual transports decode (anything else is an AttributeError in kombu).
BODY_ENCODINGS = (None, "base64")


def envelope_error(doc: Any) -> str | None:
    """Why ``doc`` (a decoded list element) cannot become a task message a worker runs; None when it can.

    Checks everything kombu's virtual ``Message`` and Celery's consumer take
    for granted before any error handling of theirs applies: an object with
    ``properties`` (a delivery tag, delivery info with exchange and routing
    key, an integer priority), a string body that decodes as its
    ``body_encoding`` says, ``headers`` an object, and for Celery's protocol
    2 (a ``task`` header) a string ``id``. Pure; never raises.
    """
    if not isinstance(doc, dict):
        return f"not a kombu message: a JSON {type(doc).__name__}, not an object"
    properties = doc.get("properties")
    if not isinstance(properties, dict):
        return "not a kombu message: no properties object"
    tag = properties.get("delivery_tag")
    if not isinstance(tag, str) or not tag:
        return "properties.delivery_tag is missing or not a string"
    info = properties.get("delivery_info")
    if not isinstance(info, dict) or not isinstance(info.get("exchange"), str) \
            or not isinstance(info.get("routing_key"), str):
        return "properties.delivery_info is missing or malformed"
    priority = properties.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        return f"properties.priority is not an integer: {priority!r}"[:200]
    for name in ("content-type", "content-encoding"):
        if doc.get(name) is not None and not isinstance(doc.get(name), str):
            return f"{name} is not a string"
    error = _body_error(doc.get("body"), properties.get("body_encoding"))
    if error:
        return error
    headers = doc.get("headers")
    if headers is not None and not isinstance(headers, dict):
        return f"headers is a {type(headers).__name__}, not an object"
    if headers and "task" in headers:
        if not isinstance(headers["task"], str) or not headers["task"]:
            return "the task header is not a task name"
        if not isinstance(headers.get("id"), str) or not headers["id"]:
            return "no id header (Celery protocol 2 needs one)"
    return None


def _body_error(body: Any, encoding: Any) -> str | None:
    if encoding not in BODY_ENCODINGS:
        return f"unknown body_encoding {encoding!r}"[:200]
    if body is None or body == "":
        return None
    if not isinstance(body, str):
        return f"the body is a JSON {type(body).__name__}, not a string"
    if encoding == "base64":
        try:
            base64.b64decode(body, validate=True)
        except (ValueError, binascii.Error) as exc:
            return f"the body is not valid base64: {exc}"
    return None


#: Property of a direct-format parked copy: the delivery tag of the consumed message it came from.
SOURCE_TAG_PROPERTY = "x-dlq-source-tag"


def redelivery_element(raw: Mapping[str, Any], headers: Mapping[str, Any], *, tag: str,
                       source_tag: str | None) -> dict:
    """The element kombu's Redis transport will pop for the next delivery of a consumed message.

    ``raw`` is the consumed element as kombu decoded it (``message._raw``):
    its body stays as kombu encoded it (no base64 round trip). It gets the
    next delivery's ``headers``, a new delivery ``tag`` (as a kombu publish
    would), no ``redelivered`` marks, and the tag of the instance it came
    from (``source_tag``, so a repeat of that same delivery is recognised).
    """
    properties = dict(raw.get("properties") or {})
    info = {k: v for k, v in (properties.get("delivery_info") or {}).items() if k != "redelivered"}
    properties.update(delivery_tag=tag, delivery_info=info)
    if source_tag:
        properties[SOURCE_TAG_PROPERTY] = source_tag
    element = {k: v for k, v in raw.items() if k not in ("redelivered", "headers", "properties")}
    element["headers"] = {k: v for k, v in headers.items() if k != "redelivered"}
    element["properties"] = properties
    return element


def with_body(raw: Mapping[str, Any], body: bytes, content_type: str | None,
              content_encoding: str | None) -> dict:
    """A consumed element (``message._raw``) with another body, base64-encoded as kombu stores binary bodies."""
    properties = {**(raw.get("properties") or {}), "body_encoding": "base64"}
    return {**raw, "body": base64.b64encode(body).decode("ascii"), "content-type": content_type,
            "content-encoding": content_encoding, "properties": properties}


def raw_dead_letter(raw: bytes, *, queue: str, dlq: str, error: str, worker: str, now: float,
                    tag: str) -> bytes:
    """A raw list element that is not a task message, as a dead letter of ``dlq`` (kombu's JSON).

    The element is the body, byte for byte (base64, as kombu stores binary
    bodies); the headers say where it came from and why it is not a message.
    ``x-dlq-raw`` marks it: it is evidence, not something to replay.
    """
    headers = {
        H.DELIVERY_COUNT: 1, H.ORIGINAL_QUEUE: queue, H.ORIGINAL_EXCHANGE: "", H.ORIGINAL_ROUTING_KEY: queue,
        H.REASON: H.Reason.INVALID_MESSAGE, H.EXCEPTION_TYPE: "celery_dlq.errors.InvalidMessage",
        H.EXCEPTION_MESSAGE: H.truncate(error), H.TRACEBACK: "", H.DEAD_LETTERED_AT: now, H.WORKER: worker,
        H.RAW: True,
    }
    return json.dumps({
        "body": base64.b64encode(bytes(raw)).decode("ascii"), "content-type": "application/octet-stream",
        "content-encoding": "binary", "headers": headers,
        "properties": {"body_encoding": "base64", "delivery_tag": tag, "priority": 0, "delivery_mode": 2,
                       "delivery_info": {"exchange": "", "routing_key": dlq}},
    }).encode("utf-8")
