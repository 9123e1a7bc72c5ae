"""kombu internals: the Redis transport's fetch, its health stamp and ack records, and a message's raw element.

celery-dlq's fetch (:mod:`celery_dlq.worker.fetch.transport`) subclasses kombu's
Redis ``Channel`` and ``QoS`` and overrides their private fetch methods,
holds what it fetched in the virtual QoS only, and stamps each fetch for
kombu's (>= 5.7) health check of a blocked fetch, waiting less than that
check allows; its parking reads the element kombu popped. kombu has no
public extension point for any of it (docs/internals.md). Everything
private it touches is listed here and read through the functions below.
"""
from __future__ import annotations

import logging
import socket
import time
from typing import Any

from kombu.transport.virtual.base import QoS as VirtualQoS

from celery_dlq.internals.base import ATTRIBUTE, INSTANCE_ATTRIBUTE, METHOD, Feature, Internal, resolve, usable

logger = logging.getLogger("celery_dlq.internals")

_CHANNEL, _QOS = "kombu.transport.redis:Channel", "kombu.transport.redis:QoS"
_VIRTUAL = "kombu.transport.virtual.base"
_POLLER = "kombu.transport.redis:MultiChannelPoller"


def _redis_qos_extends_virtual_qos() -> str | None:
    """celery-dlq's QoS calls virtual ``QoS.append``/``ack`` to skip only what kombu's Redis QoS adds (its
    ``unacked`` records): that holds while the Redis QoS derives from the virtual one directly."""
    redis_qos, virtual_qos = resolve(_QOS), resolve(f"{_VIRTUAL}:QoS")
    if redis_qos.__bases__ != (virtual_qos,):
        return f"{_QOS.replace(':', '.')} no longer derives from {_VIRTUAL}.QoS alone ({redis_qos.__bases__})"
    return None


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
        Internal(f"{_VIRTUAL}:QoS", "append", METHOD, "holds a fetched message in memory only (kombu's Redis "
                 "QoS.append, which records it in unacked, is skipped)", ("self", "message", "delivery_tag")),
        Internal(f"{_VIRTUAL}:QoS", "ack", METHOD, "forgets a message a script settled (kombu's Redis QoS.ack, "
                 "which deletes its unacked record, is skipped)", ("self", "delivery_tag")),
        Internal(f"{_VIRTUAL}:Channel", "_qos", INSTANCE_ATTRIBUTE, "a channel's QoS, None until used (the qos "
                 "property would create one)"),
    ),
    behaves=_redis_qos_extends_virtual_qos,
)

DIRECT_PARK = Feature(
    name="direct park",
    does="parking kombu's own element (moved back inside Redis by one script)",
    fallback="parked copies are stored as envelopes that the mover publishes through kombu",
    internals=(Internal(f"{_VIRTUAL}:Message", "_raw", INSTANCE_ATTRIBUTE,
                        "the element kombu popped, parked as it is"),),
)


def _drops_only_overdue_fetches() -> str | None:
    """kombu drops a blocked fetch's connection once its reply is overdue by ``brpop_timeout +
    health_check_interval`` (since the stamp), and not before: what :func:`bounded_wait` stays below."""
    ours, theirs = socket.socketpair()   # a connection whose reply never comes (nothing is ever written)

    class Connection:
        _sock, dropped = ours, False

        def disconnect(self) -> None:
            self.dropped = True

    class Channel:
        brpop_timeout, health_check_interval, _in_poll = 1, 3, Connection()
        _brpop_sent_at: float | None = None

    poller, quiet = resolve(_POLLER)(), logging.getLogger("kombu.transport.redis")
    quiet.disabled, was = True, quiet.disabled   # its "dropping stale connection" WARNING
    try:
        poller._channels.add(Channel)
        found = []
        for overdue in (-0.5, 0.5):
            Channel._brpop_sent_at = time.monotonic() - (Channel.brpop_timeout + Channel.health_check_interval
                                                         + overdue)
            poller.maybe_check_brpop_health()
            found.append(Channel._in_poll.dropped)
        if found != [False, True]:
            return (f"{_POLLER.replace(':', '.')}.maybe_check_brpop_health no longer drops a fetch exactly when "
                    f"overdue by brpop_timeout + health_check_interval (0.5 s before, after: dropped {found})")
        return None
    finally:
        quiet.disabled = was
        poller.close()
        ours.close()
        theirs.close()


FETCH_HEALTH = Feature(
    name="fetch health",
    does="kombu's health check of a blocked fetch, for celery-dlq's fetch (a half-open connection is dropped)",
    fallback="celery-dlq's fetch is not checked: a fetch on a half-open connection waits until the OS gives up "
             "on it, as before kombu 5.7",
    internals=(
        Internal(_CHANNEL, "_brpop_sent_at", ATTRIBUTE, "stamped when a fetch is sent, as kombu's BRPOP is"),
        Internal(_POLLER, "maybe_check_brpop_health", METHOD, "drops a fetch connection overdue by brpop_timeout "
                 "+ health_check_interval: every idle wait stays below that", ("self",)),
    ),
    behaves=_drops_only_overdue_fetches,
    since="kombu 5.7",
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
    """The tags a channel's QoS (None: none made yet) holds and has not acknowledged (kombu forgets acknowledged
    ones at its next fetch, which an idle channel may not make for a while)."""
    return set() if qos is None else set(qos._delivered) - set(qos._dirty)


def forget_held(qos: Any, tag: str) -> None:
    """Drop ``tag`` from what the QoS (None: none made yet) holds (its records in Redis stay)."""
    if qos is not None:
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
    """Mark the channel's connection busy with a fetch sent now (``None``: idle again); a fetch is stamped for
    kombu's health check of a blocked fetch (kombu >= 5.7), as kombu's ``_brpop_start`` stamps its BRPOP."""
    channel._in_poll = connection
    if connection is not None and usable(FETCH_HEALTH):
        channel._brpop_sent_at = time.monotonic()


def health_window(channel: Any) -> float | None:
    """Seconds after which kombu drops a stamped fetch's connection still waiting for its reply (None: never)."""
    timeout, interval = getattr(channel, "brpop_timeout", None), getattr(channel, "health_check_interval", None)
    if not timeout or not interval or not usable(FETCH_HEALTH):
        return None
    return float(timeout) + float(interval)


def longest_wait(window: float) -> float:
    """The longest a stamped fetch may wait inside kombu's health-check ``window`` (seconds): a margin for
    the reply's way back and Redis' timeout resolution."""
    return window - min(1.0, window / 2)


_shortened: set[tuple[float, float]] = set()


def bounded_wait(channel: Any, wait: float) -> float:
    """``wait`` (seconds), shortened to end a margin before kombu's health check would drop the fetch (one
    WARNING per process and value the first time)."""
    window = health_window(channel)
    if window is None:
        return wait
    longest = longest_wait(window)
    if wait <= longest:
        return wait
    if (wait, longest) not in _shortened:
        _shortened.add((wait, longest))
        logger.warning("celery-dlq: dlq_fetch_wait %gs is longer than kombu's health check lets a fetch wait "
                       "(brpop_timeout + health_check_interval = %gs): an idle fetch waits %gs", wait, window,
                       longest)
    return longest


def existing_qos(channel: Any) -> Any:
    """The channel's QoS, or None where none was made yet (kombu makes one at first use of ``qos``)."""
    return getattr(channel, "_qos", None)


def hold_in_memory(qos: Any, message: Any, delivery_tag: str) -> None:
    """Hold a fetched message unacknowledged, in memory only (kombu's Redis QoS would also record it)."""
    VirtualQoS.append(qos, message, delivery_tag)


def forget_settled(qos: Any, delivery_tag: str) -> None:
    """Acknowledge in memory only a message a script settled in Redis (kombu's Redis QoS would delete it)."""
    VirtualQoS.ack(qos, delivery_tag)


def flush_reauth(channel: Any) -> None:
    """Send a pending re-auth token on an idle fetch connection, where kombu has that (>= 5.7)."""
    flush = getattr(channel, OPTIONAL_REAUTH.name, None)
    if flush is not None:
        flush()


def raw_element(message: Any) -> dict | None:
    """The element kombu popped for ``message`` (a dict), or None."""
    raw = getattr(message, "_raw", None)
    return raw if isinstance(raw, dict) else None
