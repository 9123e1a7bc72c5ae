"""kombu internals: the Redis transport's fetch and ack records, and the raw element of a consumed message.

celery-dlq's fetch (:mod:`celery_dlq.worker.transport`) subclasses kombu's
Redis ``Channel`` and ``QoS`` and overrides their private fetch methods;
its parking reads the element kombu popped. kombu has no public extension
point for either (docs/internals.md). Everything private it touches is
listed here and read through the functions below.
"""
from __future__ import annotations

from typing import Any

from celery_dlq.internals.base import ATTRIBUTE, INSTANCE_ATTRIBUTE, METHOD, Feature, Internal

_CHANNEL, _QOS = "kombu.transport.redis:Channel", "kombu.transport.redis:QoS"
_VIRTUAL = "kombu.transport.virtual.base"

FETCH = Feature(
    name="fetch",
    does="celery-dlq's fetch (one script pops and records a message; malformed elements are dead-lettered)",
    fallback="the worker fetches with kombu's own BRPOP (a malformed element is handled as kombu handles it)",
    internals=(
        Internal(_CHANNEL, "_brpop_start", METHOD, "sends the fetch script instead of BRPOP", ("self", "timeout")),
        Internal(_CHANNEL, "_brpop_read", METHOD, "reads the fetch script's reply", ("self",)),
        Internal(_CHANNEL, "_queue_cycle", INSTANCE_ATTRIBUTE, "the queue order kombu's BRPOP uses (consume, rotate)"),
        Internal(_CHANNEL, "_q_for_pri", METHOD, "the list of each queue's priority", ("self", "queue", "pri")),
        Internal(_CHANNEL, "_in_poll", ATTRIBUTE, "marks the connection busy while the fetch is in flight"),
        Internal(f"{_VIRTUAL}:Transport", "_deliver", METHOD, "hands a fetched message to its consumer",
                 ("self", "message", "queue")),
        Internal(_QOS, "_remove_from_indices", METHOD, "an in-flight message's ack: out of its process's own hash",
                 ("self", "delivery_tag", "pipe")),
        Internal(_QOS, "restore_by_tag", METHOD, "gives an in-flight message back (requeue, close)", ("self", "tag")),
        Internal(_QOS, "restore_unacked", METHOD, "the close path, made to never raise", ("self", "client")),
        Internal(f"{_VIRTUAL}:QoS", "_delivered", INSTANCE_ATTRIBUTE, "the tags a channel holds unacknowledged"),
        Internal(f"{_VIRTUAL}:QoS", "_dirty", INSTANCE_ATTRIBUTE, "the tags acknowledged, not yet forgotten"),
    ),
)

DIRECT_PARK = Feature(
    name="direct park",
    does="parking kombu's own element (moved back inside Redis by one script)",
    fallback="parked copies are stored as envelopes that the mover publishes through kombu",
    internals=(Internal(f"{_VIRTUAL}:Message", "_raw", INSTANCE_ATTRIBUTE,
                        "the element kombu popped, parked as it is"),),
)

#: kombu >= 5.7 only (streaming re-auth of the BRPOP connection); older kombu has nothing to flush.
OPTIONAL_REAUTH = Internal(_CHANNEL, "_flush_brpop_reauth", METHOD, "flushes a pending re-auth token", ("self",))


def deliver(channel: Any, message: Any, queue: str) -> None:
    """Hand a fetched message to the channel's consumer, as kombu's BRPOP read does."""
    channel.connection._deliver(message, queue)


def held_tags(qos: Any) -> list[str]:
    """The delivery tags a channel's QoS holds unacknowledged."""
    return list(qos._delivered)


def unsettled_tags(qos: Any) -> set[str]:
    """The tags a channel's QoS holds and has not acknowledged (kombu forgets acknowledged ones at its next
    fetch, which an idle channel may not make for a while)."""
    return set(qos._delivered) - set(qos._dirty)


def forget_held(qos: Any, tag: str) -> None:
    """Drop ``tag`` from what the QoS holds (its records in Redis stay)."""
    qos._delivered.pop(tag, None)


def consume_order(channel: Any) -> list[str]:
    """The channel's queues in the order kombu's BRPOP would watch them now."""
    return channel._queue_cycle.consume(len(channel.active_queues))


def rotate(channel: Any, queue: str) -> None:
    """Move ``queue`` to the back of the order (it just gave a message), as kombu does."""
    channel._queue_cycle.rotate(queue)


def list_key(channel: Any, queue: str, priority: int) -> str:
    """The Redis list of ``queue`` at ``priority`` (without ``global_keyprefix``)."""
    return channel._q_for_pri(queue, priority)


def set_in_poll(channel: Any, connection: Any) -> None:
    """Mark the channel's connection busy with a blocking command (``None``: idle again)."""
    channel._in_poll = connection


def flush_reauth(channel: Any) -> None:
    """Send a pending re-auth token on an idle fetch connection, where kombu has that (>= 5.7)."""
    flush = getattr(channel, OPTIONAL_REAUTH.name, None)
    if flush is not None:
        flush()


def raw_element(message: Any) -> dict | None:
    """The element kombu popped for ``message`` (a dict), or None."""
    raw = getattr(message, "_raw", None)
    return raw if isinstance(raw, dict) else None
