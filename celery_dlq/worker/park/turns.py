"""Whose turn it is to move: one worker at a time, so the movers' Redis work does not grow with the workers.

Every worker runs a mover thread, but only the leader moves (the holder of
the leader's lease: :mod:`celery_dlq.worker.leader.lease`); every worker's beat
takes a free lease, so whichever workers die, a survivor moves within
``dlq_mover_lease`` of the holder's last beat. The holder knows the
earliest due time from its last pass and blocks on the store's wake marker
(``BZPOPMIN``) until shortly before it; a park of an earlier entry
(``park.lua``) or an operator's "redeliver now" writes the marker and wakes
it at once: its look writes the earliest due time it read, and a park due
sooner writes the marker, whatever else is parked (a worker of an earlier
release, in a rolling deploy, parks without the marker). Claims another
mover holds (that release gives them back early, silently) count as due
within ``dlq_mover_interval``. Redis ends a blocking command's timeout on its 10 Hz cron, up
to ~100 ms late, so the last :data:`EARLY` seconds are slept locally. Every
other worker's mover thread waits for the lease without a command. With
several shards the holder cannot block on one marker (a Redis Cluster
forbids keys of several slots in one command) and looks every
``dlq_mover_interval`` instead; still only one worker does.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

from celery_dlq.storage.wake import DueWake

#: Block on the marker until this long before the due time, then sleep locally (seconds).
EARLY = 0.2
#: The shortest time between the starts of two passes (seconds): under a steady stream of due entries
#: (each with its own due time) at most 50 passes a second, each moving everything due by then.
MIN_GAP = 0.02
#: The longest the holder trusts the earliest due time it read (seconds): entries parked without the wake
#: marker (by a worker of an earlier release, during a rolling deploy) are moved this late at worst.
REFRESH = 60.0
#: The longest blocking wait on the marker (seconds), on a client whose socket timeout outlasts it
#: (``redis.client.blocking_client``): redis-py 8's default of 5 s does not stretch for blocking commands.
MAX_BLOCK = 30.0
#: How long a mover of a worker that does not lead waits for the lease at a time (seconds), between looks at its stop.
SLICE = 1.0


class MoverTurns:
    """One mover's turns and waits (see the module docstring); ``holder`` is set while this worker leads."""

    def __init__(self, wake: DueWake, stop: threading.Event, interval: float,
                 holder: threading.Event | None = None) -> None:
        self.wake, self.stop, self.interval = wake, stop, interval
        self.holder = holder if holder is not None else threading.Event()
        self.soonest: float | None = None   # unix seconds: the earliest due time, as of the last look
        self.fresh = False         # whether ``soonest`` still holds (no pass, no wake-up since)
        self.passed_at = 0.0       # monotonic: when the last pass started
        self.looked_at = 0.0       # monotonic: when ``soonest`` was read
        #: Set while the holder blocks on the marker (or is about to): a stopping worker then writes it.
        self._blocking = threading.Event()

    def take_turn(self) -> bool:
        """True when this worker holds the lease; else wait a slice for it (no command), False."""
        if self.holder.is_set():
            return True
        if self.holder.wait(SLICE):
            self.fresh = False     # taken over: look up the earliest due time afresh
            return True
        return False

    def due(self) -> bool:
        """Whether the holder should make a pass now (the earliest due time is unknown or has come)."""
        return not self.fresh or (self.soonest is not None and self.soonest <= time.time() + 0.001)

    def passed(self, started: float) -> None:
        """A pass that began at ``started`` (monotonic) ended: the earliest due time is to be looked up again."""
        self.fresh, self.passed_at = False, started

    def wait_for_due(self, next_due: Callable[[], float | None], can_block: bool) -> None:
        """The holder's wait between passes: returns when an entry is due, or it is time to look again."""
        while not self.stop.is_set() and self.holder.is_set():
            now = time.monotonic()
            if not self.fresh or now - self.looked_at >= REFRESH:
                self.soonest, self.fresh, self.looked_at = next_due(), True, now
            refresh_in = self.looked_at + REFRESH - now
            wait = refresh_in if self.soonest is None else min(refresh_in, max(self.soonest - time.time(),
                                                                           self.passed_at + MIN_GAP - now))
            if wait <= 0:
                return
            if not can_block:
                self.stop.wait(min(wait, self.interval))
                self.fresh = False
                return
            if wait <= EARLY:
                self.stop.wait(wait)
                continue
            # Flag first, then look at ``stop``; the stopper sets ``stop``, then looks at the flag. Whatever the
            # interleaving, either this thread sees the stop or the stopper sees the flag and writes the marker
            # (which a BZPOPMIN not yet sent still finds).
            self._blocking.set()
            try:
                if self.stop.is_set():
                    return
                if self.wake.wait_for_due(min(wait - EARLY, MAX_BLOCK)):
                    self.fresh = False
            finally:
                self._blocking.clear()

    def stop_waiting(self) -> None:
        """End a blocking wait of this thread (called from the stopping thread, after it set ``stop``)."""
        if self._blocking.is_set():
            self.wake.wake()
