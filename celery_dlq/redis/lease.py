"""The mover lease: which one worker moves due entries, which one stands by, and how many others there are.

One script (``lua/mover_lease.lua``) takes or renews the lease, else the
standby's place, else counts the caller among the other movers. The keys
live in the home set (``{<prefix>}``), so the lease covers every shard.
Public times are seconds; Redis holds milliseconds.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Any, Callable

from celery_dlq.redis.keys import Keys
from celery_dlq.redis.scripts import Scripts
from celery_dlq.redis.store import to_ms


class Role(enum.IntEnum):
    """What a mover is after a try for the lease."""

    OTHER = 0     # neither: counts itself, tries again after an interval scaled by the count
    HOLDER = 1    # holds the lease: the one that moves
    STANDBY = 2   # watches the lease and takes it the moment it expires
    RELEASED = 3


@dataclass(frozen=True)
class Turn:
    """The answer of one try: the role, and for :attr:`Role.OTHER` how many other movers count."""

    role: Role
    others: int = 0


class MoverLease:
    """The lease of one store (its home key set) for the mover ``ident``."""

    def __init__(self, client: Any, keys: Keys, ident: str, lease: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.client, self.keys, self.ident, self.lease, self.clock = client, keys, ident, lease, clock
        self._scripts = Scripts(client)

    def _run(self, counted_for: float, release: bool = False) -> Turn:
        k, now = self.keys, self.clock()
        role, others = self._scripts.run(
            "mover_lease", [k.mover_lease, k.mover_standby, k.movers],
            [self.ident, to_ms(self.lease), to_ms(self.standby_ttl), to_ms(now), to_ms(now + counted_for),
             "release" if release else ""])
        return Turn(Role(int(role)), int(others))

    @property
    def standby_ttl(self) -> float:
        """How long the standby's place outlives its last renewal (seconds): six leases."""
        return 6 * self.lease

    def keep_place(self) -> None:
        """Renew the standby's place (one ``PEXPIRE``; should another worker hold it meanwhile, its place is
        renewed instead, which does no harm: the next try sorts the roles out)."""
        self.client.pexpire(self.keys.mover_standby, to_ms(self.standby_ttl))

    def try_turn(self, counted_for: float) -> Turn:
        """Take or renew the lease, else the standby's place, else count this mover for ``counted_for`` seconds."""
        return self._run(counted_for)

    def release(self) -> None:
        """Give up the lease and the standby's place (a stopping worker): no waiting for them to expire."""
        self._run(0.0, release=True)

    def both_held(self) -> bool:
        """Whether the lease and the standby's place are both held (one ``EXISTS``)."""
        return int(self.client.exists(self.keys.mover_lease, self.keys.mover_standby)) == 2

    def remaining(self) -> float:
        """Seconds until the lease expires; 0 when nobody holds it (one ``PTTL``)."""
        ms = self.client.pttl(self.keys.mover_lease)
        return max(0.0, ms / 1000) if ms is not None and ms > 0 else 0.0

    def wait_for_due(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds on the home set's wake marker (``park.lua`` writes it); True if woken."""
        return self.client.bzpopmin(self.keys.due_wake, timeout=max(0.01, timeout)) is not None

    def wake(self) -> None:
        """Write the wake marker (a stopping holder ends its own wait this way)."""
        self.client.zadd(self.keys.due_wake, {"due": 0})
