"""The fetch listener's Redis commands (:mod:`celery_dlq.worker.fetch.listener`): its two connections and what
it sends on them.

:class:`Invalidations` is the pub/sub connection Redis redirects key
invalidations to (RESP2), also subscribed to the fetch queues' channel;
:class:`Tracking` is the connection whose reads are tracked: it turns
tracking on, reads and renews the registered queues and the listening SET,
and runs ``lua/mark_queues.lua`` (its reads arm the lists it looks at).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from celery_dlq.storage.keys import Keys
from celery_dlq.storage.scripts import Scripts

#: The pub/sub channel Redis sends key invalidations on (RESP2 redirect).
INVALIDATE = "__redis__:invalidate"


class Invalidations:
    """The listener's pub/sub connection on ``client``: its id (the tracking's redirect), subscribed to the
    invalidations and to ``keys.fetch_queues`` (a fetch publishes there when it registers a new queue)."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self.pubsub = client.pubsub()
        try:
            self.pubsub.execute_command("CLIENT", "ID")
            self.redirect = int(self.pubsub.parse_response(timeout=5))
            self.pubsub.subscribe(INVALIDATE, keys.fetch_queues)
        except BaseException:
            self.pubsub.close()
            raise

    def next(self, timeout: float) -> Any:
        """The next message (None after ``timeout`` seconds; 0: only what has arrived)."""
        return self.pubsub.get_message(timeout=timeout)

    def close(self) -> None:
        self.pubsub.close()


class Tracking:
    """The connection whose reads Redis tracks: one connection of ``client``'s pool of its own, or ``client``
    itself with ``own_connection=False`` (a test's)."""

    def __init__(self, client: Any, keys: Keys, own_connection: bool = True) -> None:
        self.client = redis.Redis(connection_pool=client.connection_pool, single_connection_client=True) \
            if own_connection else client
        self.keys = keys
        self.scripts = Scripts(self.client)

    def tracking_info(self) -> Any:
        """``CLIENT TRACKINGINFO`` of this connection (no pipeline: it must be this connection's own)."""
        return self.client.execute_command("CLIENT", "TRACKINGINFO")

    def track(self, redirect: int) -> None:
        """Track this connection's reads again, per key, invalidations to ``redirect``, not its own writes."""
        self.client.execute_command("CLIENT", "TRACKING", "OFF")
        self.client.execute_command("CLIENT", "TRACKING", "ON", "REDIRECT", redirect, "NOLOOP")

    def registered(self, since_ms: int, listening_ttl_ms: int) -> tuple[frozenset[str], bool]:
        """The queues fetches registered since ``since_ms``, and whether the listening SET was there (its life
        renewed to ``listening_ttl_ms``): one round trip."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zrangebyscore(self.keys.fetch_queues, since_ms, "+inf")
        pipe.pexpire(self.keys.fetch_listening, listening_ttl_ms)
        registered, published = pipe.execute()
        return frozenset(member.decode("utf-8", "surrogateescape") if isinstance(member, bytes) else member
                         for member in registered), bool(published)

    def listening(self, queues: Sequence[str], listening_ttl_ms: int, stale_before_ms: int) -> None:
        """Publish ``queues`` as the listening SET (living ``listening_ttl_ms``) and forget the registrations
        older than ``stale_before_ms``: one transaction."""
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(self.keys.fetch_listening)
        pipe.sadd(self.keys.fetch_listening, *sorted(queues))
        pipe.pexpire(self.keys.fetch_listening, listening_ttl_ms)
        pipe.zremrangebyscore(self.keys.fetch_queues, "-inf", stale_before_ms)
        pipe.execute()

    def mark_queues(self, lists: Sequence[str], markers: Sequence[str], heard: bool,
                    holds: tuple[int, Sequence[str]] | None = None) -> tuple[int, list[int]]:
        """``mark_queues.lua`` over ``lists`` and their queues' ``markers``; ``heard``: a write was heard to each;
        ``holds``: breakers hold in Redis, ``(now_ms, each list's queue)``. The number of markers written and
        the (1-based) positions of the lists heard but left unmarked."""
        keys, args = [*lists, *markers], ["1" if heard else ""]
        if holds is not None:
            now_ms, queues = holds
            keys += [self.keys.breaker_holds, self.keys.breaker_held_raw, self.keys.breaker_kept_total]
            args += [str(now_ms), *queues]
        marked, *kept = self.scripts.run("mark_queues", keys, args)
        return int(marked), [int(i) for i in kept]

    def close(self) -> None:
        self.client.close()


def forget_listening(client: Any, keys: Keys) -> None:
    """Take the listening SET down (fetches then wait without markers)."""
    client.delete(keys.fetch_listening)
