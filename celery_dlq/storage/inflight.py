"""In-flight messages: each one belongs to the worker process that fetched it, for as long as that process beats.

``fetch.lua`` records every message it pops in its consumer's hash
(:meth:`Keys.inflight`: delivery tag -> the list it came from and the
element, byte for byte) and, when the consumer's last beat is not recent,
the beat itself in the consumers set (:attr:`Keys.consumers`, consumer ->
ms). While a process holds messages it beats every ``dlq_heartbeat_interval``;
each beat starts a lease of ``dlq_inflight_lease`` (the one lease, in its
index form: :class:`~celery_dlq.storage.lease.LeaseIndex`). A consumer
whose lease ran out is gone, and one sweeper (the leader) gives its messages
back to their lists (``lua/give_back.lua``, which checks the lease again).
Acknowledging is ``HDEL`` from the consumer's own hash, so a process that comes back after its messages were given back
settles nothing of another's. Keys are full names on the broker's Redis
(``global_keyprefix`` included); times are the workers' clocks, as the
parked store's due times are.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from celery_dlq.storage.keys import Keys
from celery_dlq.storage.lease import LeaseIndex
from celery_dlq.storage.scripts import Scripts


def parse_value(value: bytes) -> tuple[str, bytes]:
    """``(list, element)`` of an in-flight record (``in_flight_value`` in ``lua/lib.lua``)."""
    length, rest = value.split(b":", 1)
    size = int(length)
    return rest[:size].decode("utf-8"), rest[size:]


class InFlight:
    """The in-flight records of every consumer on one broker Redis (``client`` must not prefix keys)."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self.client, self.keys = client, keys
        self.beats = LeaseIndex(client, keys.consumers)
        self._scripts = Scripts(client)

    def beat(self, consumer: str, now_ms: int) -> None:
        """``consumer`` is alive and may hold messages: its lease starts again at ``now_ms``."""
        self.beats.hold(consumer, now_ms)

    def oldest(self) -> tuple[str, int] | None:
        """The consumer whose beat is oldest, and that beat (ms); None when no consumer is recorded."""
        return self.beats.first()

    def consumers(self) -> list[tuple[str, int]]:
        """Every recorded consumer and its last beat (ms)."""
        return self.beats.members()

    def stale(self, cutoff_ms: int, limit: int = 100) -> list[str]:
        """Consumers whose last beat is older than ``cutoff_ms`` (their lease ran out)."""
        return self.beats.lapsed(cutoff_ms, limit, inclusive=False)

    def tags(self, consumer: str) -> list[str]:
        """The delivery tags ``consumer`` holds in flight."""
        return [tag.decode("utf-8") for tag in self.client.hkeys(self.keys.inflight(consumer))]

    def give_back(self, consumer: str, tags: Iterable[str] | None = None, *, cutoff_ms: int | None = None,
                  left: bool = False, forget: bool = False) -> int:
        """Give ``consumer``'s messages (``tags``; None: all) back to their lists; how many went back.

        With ``cutoff_ms`` only if the consumer has not beaten since (else
        -1, nothing done). ``left`` pushes them behind what waits (kombu's
        requeue), else they are delivered next. ``forget`` drops the consumer
        from the consumers set once nothing of it is left in flight.
        """
        key = self.keys.inflight(consumer)
        if tags is None:
            records = self.client.hgetall(key)
        else:
            tags = list(tags)
            records = dict(zip(tags, self.client.hmget(key, tags))) if tags else {}
        lists: dict[str, int] = {}
        args: list[Any] = [consumer, "" if cutoff_ms is None else int(cutoff_ms), "left" if left else "right",
                           "1" if forget else ""]
        for tag, value in records.items():
            if value is None:
                continue
            destination, _ = parse_value(value)
            index = lists.setdefault(destination, len(lists) + 3)
            args += [tag, index]
        return int(self._scripts.run("give_back", [key, self.keys.consumers, *lists], args))
