"""This process's in-flight messages: its consumer id, its beats while it holds any, and the sweeper.

Every message celery-dlq's fetch pops is recorded as this process's
(:mod:`celery_dlq.storage.inflight`). The leader's thread
(:mod:`celery_dlq.worker.leader.lease`) calls :meth:`Beats.tick` after each beat
of the leader's lease, on every worker: while the process holds a message
(prefetched, running, or waiting for its ETA) it writes its beat, one
command; an idle process writes nothing, and the fetch writes the beat
itself when it takes a message after a quiet spell. Each beat starts the
process's in-flight lease (``dlq_inflight_lease``). The leader also sweeps
(its in-flight sweep duty): it looks when the oldest beat can have gone stale
(one command, at most every ``dlq_inflight_lease``) and gives the messages
of every consumer silent for longer than the lease back to their lists. A
dead worker's messages are back within the lease plus one
``dlq_heartbeat_interval`` of its last beat (two leases when the sweeper
died too: the leader's lease passes first). The beat runs in its own thread, so a busy pool child
or a long task in the main process that releases the GIL never starves it;
one that holds the GIL past the lease has its messages taken over (docs:
"When a worker dies").
"""
from __future__ import annotations

import logging
import os
import socket
import time
import weakref
from collections.abc import Callable
from typing import Any

from celery_dlq.internals.kombu_redis import existing_qos, unsettled_tags
from celery_dlq.storage.inflight import InFlight

logger = logging.getLogger(__name__)

_live_channels: weakref.WeakSet = weakref.WeakSet()
_consumer: tuple[int, str] | None = None
_beat_at = float("-inf")   # monotonic: when this process last wrote its beat


def consumer_id() -> str:
    """This process's consumer id (host, pid and a random part): its in-flight hash and member of the consumers set."""
    global _consumer
    if _consumer is None or _consumer[0] != os.getpid():
        _consumer = (os.getpid(), f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}")
    return _consumer[1]


def live_channels() -> list[Any]:
    """This process's open fetch channels."""
    return list(_live_channels)


def opened(channel: Any) -> None:
    _live_channels.add(channel)


def closed(channel: Any) -> None:
    _live_channels.discard(channel)


def held() -> set[str]:
    """The delivery tags this process's channels hold (taken by a fetch, not yet settled)."""
    tags: set[str] = set()
    for channel in live_channels():
        tags.update(channel._dlq_recorded)
        tags.update(unsettled_tags(existing_qos(channel)))
    return tags


def beat_is_due(lease: float) -> bool:
    """Whether a fetch that takes a message must write this process's beat (the last is a third of a lease old)."""
    return time.monotonic() - _beat_at > lease / 3


def beaten(at: float | None = None) -> None:
    """This process's beat was written (``at``: monotonic time, now by default)."""
    global _beat_at
    _beat_at = time.monotonic() if at is None else at


def previous_runs(consumers: list[tuple[str, int]], me: str) -> list[str]:
    """Consumers of this host whose process is gone, a restarted worker's earlier runs among them (no lease to
    wait for).

    A consumer id is ``host:pid:random``. Same host and a pid that is not
    running, or this process's own pid under another id (a container that
    restarted), means that run is over.
    """
    host, pid = me.rsplit(":", 2)[0], os.getpid()
    gone = []
    for name, _ in consumers:
        parts = name.rsplit(":", 2)
        if name == me or len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
            continue
        if int(parts[1]) == pid or not _running(int(parts[1])):
            gone.append(name)
    return gone


def recover(inflight: InFlight, me: str) -> int:
    """Give back what consumer ``me`` (this process) holds in flight but no live channel of it holds (a reply
    lost with a connection), and what gone worker processes of this host left; how many went back."""
    orphans = sorted(set(inflight.tags(me)) - held())
    given = inflight.give_back(me, orphans) if orphans else 0
    if given:
        logger.warning("celery-dlq: gave back %d message(s) fetched before the connection was lost", given)
    for earlier in previous_runs(inflight.consumers(), me):
        n = inflight.give_back(earlier, forget=True)
        if n > 0:
            logger.warning("celery-dlq: gave back %d message(s) left in flight by %s, a worker process of this "
                           "host that is gone", n, earlier)
        given += max(n, 0)
    return given


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Beats:
    """Called after each beat of the leader's lease: beat while this process holds messages; the leader also
    sweeps."""

    def __init__(self, inflight: InFlight, lease: float, clock: Callable[[], float] = time.time) -> None:
        self.inflight, self.lease_ms, self.clock = inflight, int(lease * 1000), clock
        self._next_look = 0
        self._was_holder = False

    def tick(self, holder: bool) -> int:
        """One beat; how many messages of gone consumers this tick gave back (never raises)."""
        try:
            now_ms = int(self.clock() * 1000)
            if held():
                self.inflight.beat(consumer_id(), now_ms)
                beaten()
            if holder and not self._was_holder:
                self._next_look = 0   # a new sweeper looks at once: the last one may be the consumer that died
            self._was_holder = holder
            return self.sweep(now_ms) if holder else 0
        except Exception as exc:   # Redis down: beats resume with it; a lease outlived is a documented duplicate
            logger.warning("celery-dlq in-flight: could not beat or sweep (%s: %s)", type(exc).__name__, exc)
            return 0

    def sweep(self, now_ms: int) -> int:
        """Give back the messages of consumers silent for longer than the lease, when one can be."""
        if now_ms < self._next_look:
            return 0
        cutoff, given = now_ms - self.lease_ms, 0
        oldest = self.inflight.oldest()
        if oldest is not None and oldest[1] < cutoff:
            for consumer in self.inflight.stale(cutoff):
                n = self.inflight.give_back(consumer, cutoff_ms=cutoff, forget=True)
                if n > 0:
                    given += n
                    logger.warning("celery-dlq in-flight: gave back %d message(s) of %s, silent for more than "
                                   "%.1fs", n, consumer, self.lease_ms / 1000)
            oldest = self.inflight.oldest()
        if oldest is not None and oldest[1] < cutoff:
            self._next_look = now_ms   # more than one look's worth: the next beat goes on
        else:   # nothing can go stale before the oldest beat does (beats only rise; a new one starts at now)
            self._next_look = (now_ms if oldest is None else oldest[1]) + self.lease_ms
        return given
