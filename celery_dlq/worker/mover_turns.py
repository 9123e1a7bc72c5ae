"""Whose turn it is to move: one worker at a time, so the movers' Redis work does not grow with the workers.

Every worker runs a mover thread, but only the holder of the store's mover
lease (:class:`~celery_dlq.redis.lease.MoverLease`) moves:

* **The holder** knows the earliest due time from its last pass and blocks
  on the store's wake marker (``BZPOPMIN``) until shortly before it; a park
  of an earlier entry (``park.lua``) or an operator's "redeliver now" writes
  the marker and wakes it at once. Redis ends a blocking command's timeout
  on its 10 Hz cron, up to ~100 ms late, so the last :data:`EARLY` seconds
  are slept locally. It renews the lease when half of it is spent.
* **The standby** reads the lease's time to live (one ``PTTL``) and sleeps
  until then; when the lease has expired (the holder died or stalled) it
  takes it over in the same try. It renews its own place (six leases long)
  every two leases.
* **Every other worker** counts itself in the store and looks again after
  2 x ``dlq_mover_lease`` x (how many count) x U(0.5, 1.5) seconds, so all of
  them together look about once per two leases, however many they are: one
  ``EXISTS`` of the lease and the standby's place, and a full try (which
  takes what is free and renews the count) when either is free or every
  fourth look. They matter only when the holder and the standby both died.

Takeover: when the holder dies, its lease expires at most ``dlq_mover_lease``
seconds after its last renewal, and the standby takes it over then (plus a
round trip) and moves at once. Only when the standby died too does it take
longer: the free lease is taken by the first other worker to look, on
average two leases later (one worker alone: within three leases).
With several shards the holder cannot block on one marker
(a Redis Cluster forbids keys of several slots in one command) and looks
every ``dlq_mover_interval`` instead, as before; still only one worker does.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from typing import Callable

from celery_dlq.redis.lease import MoverLease, Role

logger = logging.getLogger(__name__)

#: Block on the marker until this long before the due time, then sleep locally (seconds).
EARLY = 0.2
#: The shortest time between the starts of two passes (seconds): under a steady stream of due entries
#: (each with its own due time) at most 50 passes a second, each moving everything due by then.
MIN_GAP = 0.02
#: The longest the holder trusts the earliest due time it read (seconds): entries parked without the wake
#: marker (by a worker of an earlier release, during a rolling deploy) are moved this late at worst.
REFRESH = 60.0
#: Together the other movers look about once per this many leases (to take a lease or a standby's place
#: that is free: the holder and the standby both died).
OTHERS_EVERY = 2
#: An other mover's looks are one EXISTS each, and a full try (which renews its count) every this many.
RECOUNT = 4
#: The longest local sleep between two flushes of the delivery counters of acknowledged messages (seconds).
SLICE = 1.0


class MoverTurns:
    """One mover's role and its waits (see the module docstring). ``between`` runs between wait slices."""

    def __init__(self, lease: MoverLease, stop: threading.Event, interval: float,
                 between: Callable[[], object] = lambda: None, rng: Callable[[], float] = random.random) -> None:
        self.lease, self.stop, self.interval, self.between, self.rng = lease, stop, interval, between, rng
        self.role = Role.OTHER
        self.others = 1
        self.checks = RECOUNT      # cheap checks since the last try (a first try is a full one)
        self.renew_at = 0.0        # monotonic: when the holder renews its lease
        self.standby_until = 0.0   # monotonic: when the standby renews its place
        self.soonest: float | None = None   # unix seconds: the earliest due time, as of the last look
        self.fresh = False         # whether ``soonest`` still holds (no pass, no wake-up since)
        self.passed_at = 0.0       # monotonic: when the last pass started
        self.looked_at = 0.0       # monotonic: when ``soonest`` was read
        #: True while the holder blocks on the marker (a stopping worker then writes it).
        self.blocking = False

    @property
    def ttl(self) -> float:
        return self.lease.lease

    def take_turn(self) -> bool:
        """True when this worker holds the lease (renewed here when half spent); else wait, return False."""
        now = time.monotonic()
        if self.role is Role.HOLDER and now < self.renew_at:
            return True
        if self.role is Role.STANDBY:
            if now >= self.standby_until:
                self.lease.keep_place()
                self.standby_until = now + 2 * self.ttl
            left = self.lease.remaining()
            if left > 0:
                self._sleep(left + 0.005)
                return False
        if self.role is Role.OTHER and self.checks < RECOUNT and self.lease.both_held():
            self.checks += 1   # a holder and a standby: nothing to do (one EXISTS); the count stands
            self._sleep(self._other_wait(0.5 + self.rng()))
            return False
        turn = self.lease.try_turn(counted_for=(RECOUNT + 1) * self._other_wait(1.5) + self.ttl)
        self.checks = 0
        was, self.role = self.role, turn.role
        if turn.role is Role.HOLDER:
            self.renew_at = now + self.ttl / 2
            if was is not Role.HOLDER:
                self.fresh = False
                logger.info("celery-dlq mover: this worker moves due messages now (lease %.1fs)", self.ttl)
            return True
        if was is Role.HOLDER:
            logger.warning("celery-dlq mover: lost the mover lease (renewed too late); another worker moves")
        if turn.role is Role.STANDBY:
            self.standby_until = now + 2 * self.ttl
            return False
        self.others = max(1, turn.others)
        self._sleep(self._other_wait(0.5 + self.rng()))
        return False

    def _other_wait(self, factor: float) -> float:
        return OTHERS_EVERY * self.ttl * self.others * factor

    def due(self) -> bool:
        """Whether the holder should make a pass now (the earliest due time is unknown or has come)."""
        return not self.fresh or (self.soonest is not None and self.soonest <= time.time() + 0.001)

    def passed(self, started: float) -> None:
        """A pass that began at ``started`` (monotonic) ended: the earliest due time is to be looked up again."""
        self.fresh, self.passed_at = False, started

    def wait_for_due(self, next_due: Callable[[], float | None], can_block: bool) -> None:
        """The holder's wait between passes: returns when an entry is due or the lease is to be renewed."""
        while not self.stop.is_set():
            now = time.monotonic()
            if not self.fresh or now - self.looked_at >= REFRESH:
                self.soonest, self.fresh, self.looked_at = next_due(), True, now
            renew_in = self.renew_at - now
            wait = renew_in if self.soonest is None else min(renew_in, max(self.soonest - time.time(),
                                                                           self.passed_at + MIN_GAP - now))
            if wait <= 0:
                return
            if not can_block:
                self._sleep(min(wait, self.interval))
                self.fresh = False
                return
            if wait <= EARLY:
                self.stop.wait(wait)
                continue
            self.between()
            self.blocking = True
            try:
                if self.lease.wait_for_due(wait - EARLY):
                    self.fresh = False
            finally:
                self.blocking = False

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.stop.wait(min(left, SLICE))
            self.between()

    def stop_waiting(self) -> None:
        """End a blocking wait of this thread (called from the stopping thread)."""
        if self.blocking:
            self.lease.wake()

    def release(self) -> None:
        """Give the lease (or the standby's place) up, so another worker takes over without waiting for it to expire."""
        if self.role in (Role.HOLDER, Role.STANDBY):
            self.lease.release()
        self.role = Role.OTHER
