"""Whose turn it is to move: one worker at a time, so the movers' Redis work does not grow with the workers.

Every worker runs a mover thread, which is also its heartbeat: every
``dlq_heartbeat_interval`` seconds it runs ``heartbeat.lua``
(:class:`~celery_dlq.redis.lease.MoverLease`), which records the worker as
alive and gives it the mover lease when the lease is free. Only the holder
moves:

* **The holder** knows the earliest due time from its last pass and blocks
  on the store's wake marker (``BZPOPMIN``) until shortly before it or its
  next beat; a park of an earlier entry (``park.lua``) or an operator's
  "redeliver now" writes the marker and wakes it at once. Redis ends a
  blocking command's timeout on its 10 Hz cron, up to ~100 ms late, so the
  last :data:`EARLY` seconds are slept locally. It also runs the fetch
  listener (``on_role``).
* **Every other worker** beats and sleeps until its next beat: one command
  per interval, nothing else.

Takeover: the lease outlives its holder's last beat by ``dlq_mover_lease``
minus one interval, and every live worker beats once per interval, so
whichever workers die (the holder, any others, all but one), a survivor
holds the lease and moves within ``dlq_mover_lease`` of the holder's last
beat. With several shards the holder cannot block on one marker (a Redis
Cluster forbids keys of several slots in one command) and looks every
``dlq_mover_interval`` instead; still only one worker does.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from celery_dlq.redis.lease import MoverLease

logger = logging.getLogger(__name__)

#: Block on the marker until this long before the due time, then sleep locally (seconds).
EARLY = 0.2
#: The shortest time between the starts of two passes (seconds): under a steady stream of due entries
#: (each with its own due time) at most 50 passes a second, each moving everything due by then.
MIN_GAP = 0.02
#: The longest the holder trusts the earliest due time it read (seconds): entries parked without the wake
#: marker (by a worker of an earlier release, during a rolling deploy) are moved this late at worst.
REFRESH = 60.0
#: The longest local sleep between two flushes of the delivery counters of acknowledged messages (seconds).
SLICE = 1.0


class MoverTurns:
    """One mover's heartbeat, role and waits (see the module docstring). ``between`` runs between wait slices;
    ``on_role(True)`` when this worker takes the lease, ``on_role(False)`` when it loses it."""

    def __init__(self, lease: MoverLease, stop: threading.Event, interval: float,
                 between: Callable[[], object] = lambda: None,
                 on_role: Callable[[bool], object] = lambda holds: None) -> None:
        self.lease, self.stop, self.interval, self.between, self.on_role = lease, stop, interval, between, on_role
        self.holder = False
        self.beat_at = 0.0         # monotonic: when this worker beats next (the holder renews its lease then)
        self.soonest: float | None = None   # unix seconds: the earliest due time, as of the last look
        self.fresh = False         # whether ``soonest`` still holds (no pass, no wake-up since)
        self.passed_at = 0.0       # monotonic: when the last pass started
        self.looked_at = 0.0       # monotonic: when ``soonest`` was read
        self._lock = threading.Lock()
        self._blocking = False     # the holder blocks on the marker (a stopping worker then writes it)

    def take_turn(self) -> bool:
        """Beat when it is time; True when this worker holds the lease, else sleep until the next beat, False."""
        now = time.monotonic()
        if now >= self.beat_at:
            holds = self.lease.beat()
            self.beat_at = now + self.lease.interval
            if holds != self.holder:
                self.holder, self.fresh = holds, False
                if holds:
                    logger.info("celery-dlq mover: this worker moves due messages now (lease %.1fs)",
                                self.lease.lease)
                else:
                    logger.warning("celery-dlq mover: another worker holds the mover lease now")
                self.on_role(holds)
        if self.holder:
            return True
        self._sleep(self.beat_at - time.monotonic())
        return False

    def due(self) -> bool:
        """Whether the holder should make a pass now (the earliest due time is unknown or has come)."""
        return not self.fresh or (self.soonest is not None and self.soonest <= time.time() + 0.001)

    def passed(self, started: float) -> None:
        """A pass that began at ``started`` (monotonic) ended: the earliest due time is to be looked up again."""
        self.fresh, self.passed_at = False, started

    def wait_for_due(self, next_due: Callable[[], float | None], can_block: bool) -> None:
        """The holder's wait between passes: returns when an entry is due or its next beat is due."""
        while not self.stop.is_set():
            now = time.monotonic()
            if not self.fresh or now - self.looked_at >= REFRESH:
                self.soonest, self.fresh, self.looked_at = next_due(), True, now
            beat_in = self.beat_at - now
            wait = beat_in if self.soonest is None else min(beat_in, max(self.soonest - time.time(),
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
            with self._lock:
                self._blocking = True
            try:
                if self.stop.is_set():   # a stop between the check above and the flag: it wrote no marker
                    return
                if self.lease.wait_for_due(wait - EARLY):
                    self.fresh = False
            finally:
                with self._lock:
                    self._blocking = False

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self.stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.stop.wait(min(left, SLICE))
            self.between()

    def stop_waiting(self) -> None:
        """End a blocking wait of this thread (called from the stopping thread, after it set ``stop``)."""
        with self._lock:
            blocking = self._blocking
        if blocking:
            self.lease.wake()

    def release(self) -> None:
        """Give the lease up and leave the live workers, so another worker takes over at its next beat."""
        self.lease.release()
        if self.holder:
            self.holder = False
            self.on_role(False)
