"""Every message header celery-dlq writes, in one place, with encode/decode helpers.

Headers ride on the original message, beside Celery's protocol-2 headers, so
they survive in Redis and are visible to any kombu consumer or ``redis-cli``.
"""
from __future__ import annotations

import time
import traceback as traceback_module
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from celery.utils.time import maybe_iso8601, maybe_make_aware

PREFIX = "x-dlq-"
DELIVERY_COUNT = "x-dlq-delivery-count"          # this delivery's number, 1-based
ORIGINAL_QUEUE = "x-dlq-original-queue"
ORIGINAL_EXCHANGE = "x-dlq-original-exchange"
ORIGINAL_ROUTING_KEY = "x-dlq-original-routing-key"
FIRST_FAILURE_AT = "x-dlq-first-failure-at"      # unix seconds
LAST_EXCEPTION = "x-dlq-last-exception"          # "Type: message", truncated
# Dead letters only:
REASON = "x-dlq-reason"
EXCEPTION_TYPE = "x-dlq-exception-type"
EXCEPTION_MESSAGE = "x-dlq-exception-message"
TRACEBACK = "x-dlq-traceback"
DEAD_LETTERED_AT = "x-dlq-dead-lettered-at"
WORKER = "x-dlq-worker"
RAW = "x-dlq-raw"                                # true: the body is a raw element that was not a message
GROUP = "x-dlq-group"                            # failure group id (fingerprint.group_id), counted in the DLQ's index
PAYLOAD_HASH = "x-dlq-payload-hash"              # message.payload_hash of the letter's task and body, as dead-lettered
# Replays (operator tools):
REPLAYED_AT = "x-dlq-replayed-at"
REPLAY_COUNT = "x-dlq-replay-count"
# Waits that are not failures (worker/features/snooze.py):
SNOOZES = "x-dlq-snoozes"                        # how often the task snoozed (used no attempt)
SNOOZED_SECONDS = "x-dlq-snoozed-seconds"        # the seconds of those snoozes, in all

# Workflows (set by the caller, per call):
CHORD_RULE = "x-dlq-chord-rule"                  # wait | fail | continue: this chord member's rule (workflow.py)

#: Stored exception text is cut to this many characters, as Sidekiq does.
MAX_TEXT = 10 * 1024
#: The one-line summary in ``x-dlq-last-exception`` is shorter.
MAX_SUMMARY = 1024


class Reason:
    """Why a message was dead-lettered (``x-dlq-reason``)."""

    MAX_DELIVERY_ATTEMPTS = "max_delivery_attempts"
    NON_RETRYABLE = "non_retryable"
    WORKER_LOST = "worker_lost"
    TIME_LIMIT = "time_limit"
    UNKNOWN_TASK = "unknown_task"
    INVALID_MESSAGE = "invalid_message"
    EXPIRED = "expired"  # Celery's ``expires`` passed, or would pass before the next delivery

    ALL = (MAX_DELIVERY_ATTEMPTS, NON_RETRYABLE, WORKER_LOST, TIME_LIMIT, UNKNOWN_TASK, INVALID_MESSAGE, EXPIRED)


def truncate(text: str | None, limit: int = MAX_TEXT) -> str:
    """Cut ``text`` to ``limit`` characters, saying so at the end."""
    text = "" if text is None else str(text)
    if len(text) <= limit:
        return text
    marker = f"... [truncated {len(text) - limit + 40} chars]"
    return text[: max(0, limit - len(marker))] + marker


def exception_type_name(exc: BaseException | type) -> str:
    cls = exc if isinstance(exc, type) else type(exc)
    module = cls.__module__
    return cls.__qualname__ if module in ("builtins", None) else f"{module}.{cls.__qualname__}"


def describe_exception(exc: BaseException | None, tb: str | None = None) -> dict[str, str]:
    """The failure as plain strings: safe to pickle between processes and to store."""
    if exc is None:
        return {"type": "", "message": "", "traceback": truncate(tb or "")}
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not lose the message
        message = repr(exc)
    if tb is None and exc.__traceback__ is not None:
        tb = "".join(traceback_module.format_exception(type(exc), exc, exc.__traceback__))
    return {"type": exception_type_name(exc), "message": truncate(message), "traceback": truncate(tb or "")}


def summary(failure: Mapping[str, str]) -> str:
    """``"Type: message"`` for ``x-dlq-last-exception``."""
    message = failure.get("message", "")
    text = f"{failure['type']}: {message}" if failure.get("type") else message
    return truncate(text, MAX_SUMMARY)


def expires_at(headers: Mapping[str, Any] | None) -> float | None:
    """When a message expires (unix seconds), from Celery's ``expires`` header; None when it never does.

    Read as Celery's worker reads it (ISO 8601; a naive time is UTC). A value
    Celery could not read either is treated as no expiry: Celery rejects that
    message as invalid before it runs.
    """
    value = headers.get("expires") if headers else None
    if not value or not isinstance(value, (str, datetime)):
        return None
    try:
        return maybe_make_aware(maybe_iso8601(value)).timestamp()
    except (ValueError, TypeError, OverflowError):
        return None


def expires_before(headers: Mapping[str, Any] | None, due: float) -> bool:
    """Whether a message would have expired by ``due`` (unix seconds): a delivery then would be discarded."""
    expiry = expires_at(headers)
    return expiry is not None and due > expiry


def last_failure(headers: Mapping[str, Any]) -> dict[str, str]:
    """The failure a parked copy carries in ``x-dlq-last-exception`` (``"Type: message"``), as a failure mapping."""
    text = str(headers.get(LAST_EXCEPTION) or "")
    kind, sep, message = text.partition(": ")
    if not sep or " " in kind:
        return {"type": "", "message": text, "traceback": ""}
    return {"type": kind, "message": message, "traceback": ""}


def delivery_count_of(headers: Mapping[str, Any] | None) -> int:
    """The delivery number a message's headers claim; 1 when it has none or a bad one."""
    if not headers:
        return 1
    try:
        count = int(headers.get(DELIVERY_COUNT) or 1)
    except (TypeError, ValueError):
        return 1
    return max(count, 1)


#: RabbitMQ's own count of a quorum-queue message's earlier, returned deliveries.
BROKER_DELIVERY_COUNT = "x-delivery-count"


def broker_delivery_count(headers: Mapping[str, Any] | None) -> int:
    """How many times a quorum queue says it delivered this message before (``x-delivery-count``); 0 if unsaid."""
    try:
        count = int((headers or {}).get(BROKER_DELIVERY_COUNT) or 0)
    except (TypeError, ValueError):
        return 0
    return max(count, 0)


#: A count header above this is not believed even without a limit (UNLIMITED attempts).
MAX_BELIEVED_COUNT = 1_000_000


def delivery_count_problem(headers: Mapping[str, Any] | None, max_delivery_attempts: int) -> str | None:
    """Why a message's ``x-dlq-delivery-count`` cannot be believed, or None (absent, or in range).

    Only celery-dlq writes the header, always an integer from 1 to
    ``max_delivery_attempts``; anything else (text, a float, 0, 10**30, one
    more than ``max_delivery_attempts + 1``) came from somewhere else and must
    not cost the task its attempts. ``max_delivery_attempts`` < 1 means unlimited.
    """
    if not headers or DELIVERY_COUNT not in headers:
        return None
    value = headers[DELIVERY_COUNT]
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{DELIVERY_COUNT} is not an integer: {value!r}"[:200]
    ceiling = max_delivery_attempts + 1 if max_delivery_attempts >= 1 else MAX_BELIEVED_COUNT
    if not 1 <= value <= ceiling:
        return f"{DELIVERY_COUNT} {value} is outside 1..{ceiling}"[:200]
    return None


def redelivery_headers(headers: Mapping[str, Any], *, delivery: int, queue: str, exchange: str,
                       routing_key: str, failure: Mapping[str, str], now: float | None = None) -> dict:
    """Headers of the copy that will be delivered as number ``delivery``.

    Celery's own ``retries`` header follows along (``delivery - 1``), so
    ``task.request.retries`` keeps meaning what Celery users expect.
    """
    now = time.time() if now is None else now
    out = dict(headers)
    out[DELIVERY_COUNT] = delivery
    out[ORIGINAL_QUEUE] = headers.get(ORIGINAL_QUEUE) or queue
    out[ORIGINAL_EXCHANGE] = headers.get(ORIGINAL_EXCHANGE, exchange)
    out[ORIGINAL_ROUTING_KEY] = headers.get(ORIGINAL_ROUTING_KEY, routing_key)
    out[FIRST_FAILURE_AT] = headers.get(FIRST_FAILURE_AT) or now
    out[LAST_EXCEPTION] = summary(failure)
    if "task" in out:  # Celery protocol 2
        out["retries"] = delivery - 1
    return out


def dead_letter_headers(headers: Mapping[str, Any], *, delivery: int, queue: str, exchange: str,
                        routing_key: str, failure: Mapping[str, str], reason: str, worker: str,
                        now: float | None = None) -> dict:
    """Headers of a dead letter: the redelivery headers plus why, what, when and where."""
    now = time.time() if now is None else now
    out = redelivery_headers(headers, delivery=delivery, queue=queue, exchange=exchange,
                             routing_key=routing_key, failure=failure, now=now)
    out[REASON] = reason
    out[EXCEPTION_TYPE] = failure.get("type", "")
    out[EXCEPTION_MESSAGE] = truncate(failure.get("message", ""))
    out[TRACEBACK] = truncate(failure.get("traceback", ""))
    out[DEAD_LETTERED_AT] = now
    out[WORKER] = worker
    return out


def dlq_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    """Only the ``x-dlq-*`` headers."""
    return {k: v for k, v in headers.items() if isinstance(k, str) and k.startswith(PREFIX)}
