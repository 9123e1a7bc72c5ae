"""The mover lease and the workers' heartbeats: which one worker moves due entries and runs the fetch listener.

Every worker beats every ``dlq_heartbeat_interval`` seconds with one script
(``lua/heartbeat.lua``): it records the worker as alive and takes the lease
when it is free (renews it when it holds it). The lease lives
``dlq_mover_lease`` minus one interval, so whichever workers die (the holder,
any others, all but one), a survivor's next beat takes the lease within
``dlq_mover_lease`` of the holder's last beat. The keys live in the home
set (``{<prefix>}``), so the lease covers every shard. Public times are
seconds; Redis holds milliseconds.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from celery_dlq.redis.keys import Keys
from celery_dlq.redis.scripts import Scripts
from celery_dlq.redis.store import to_ms

#: A worker silent this many leases is dropped from the live workers' set.
FORGET_AFTER = 6


class MoverLease:
    """The lease of one store (its home key set) for the worker ``ident``, renewed by its heartbeats."""

    def __init__(self, client: Any, keys: Keys, ident: str, lease: float, interval: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.client, self.keys, self.ident, self.clock = client, keys, ident, clock
        self.lease, self.interval = lease, interval
        self._scripts = Scripts(client)

    @property
    def ttl(self) -> float:
        """How long the lease outlives its holder's last beat (seconds)."""
        return self.lease - self.interval

    def _run(self, release: bool) -> int:
        k = self.keys
        return int(self._scripts.run("heartbeat", [k.mover_lease, k.workers],
                                     [self.ident, to_ms(self.ttl), to_ms(self.clock()),
                                      to_ms(FORGET_AFTER * self.lease), "release" if release else ""]))

    def beat(self) -> bool:
        """Say this worker is alive; True when it holds the lease (taken now or renewed)."""
        return self._run(release=False) == 1

    def release(self) -> None:
        """Give up the lease and leave the live workers (a stopping worker): no waiting for it to expire."""
        self._run(release=True)

    def wait_for_due(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds on the home set's wake marker (``park.lua`` writes it); True if woken."""
        return self.client.bzpopmin(self.keys.due_wake, timeout=max(0.01, timeout)) is not None

    def wake(self) -> None:
        """Write the wake marker (a stopping holder ends its own wait this way)."""
        self.client.zadd(self.keys.due_wake, {"due": 0})
