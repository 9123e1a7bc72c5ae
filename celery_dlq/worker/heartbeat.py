"""Every worker's heartbeat: a thread that takes or renews the mover lease and says when the role changes.

One beat per ``dlq_heartbeat_interval`` (:class:`~celery_dlq.storage.lease.MoverLease`:
one command for a worker without the lease). The holder moves due entries
(:mod:`celery_dlq.worker.mover_turns`) and runs the fetch listener; the
beat tells both through ``on_role``. It runs in its own thread so that a
mover pass or a blocked wait never delays a renewal; after each beat,
``each`` writes this process's in-flight beat and, on the holder, sweeps. A
stopping worker releases the lease, so another takes over at its next beat.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from celery_dlq.storage.lease import MoverLease

logger = logging.getLogger(__name__)


class Heartbeat(threading.Thread):
    """Beats until stopped; ``holder`` is set while this worker holds the mover lease."""

    def __init__(self, lease: MoverLease, on_role: Callable[[bool], object] = lambda holds: None,
                 each: Callable[[bool], object] = lambda holds: None) -> None:
        """``each(holds)`` runs after every beat (the in-flight beat and sweep: ``worker/inflight.py``)."""
        super().__init__(name="celery-dlq-heartbeat", daemon=True)
        self.lease, self.on_role, self.each = lease, on_role, each
        self.holder = threading.Event()
        self._stop_event = threading.Event()

    def beat(self) -> bool:
        """One beat; whether this worker holds the lease now (its role is kept when Redis cannot be reached)."""
        try:
            holds = self.lease.beat()
        except Exception as exc:   # Redis down: the lease expires there on its own
            logger.warning("celery-dlq heartbeat: could not beat (%s: %s)", type(exc).__name__, exc)
            return self.holder.is_set()
        if holds != self.holder.is_set():
            if holds:
                self.holder.set()
                logger.info("celery-dlq mover: this worker moves due messages now (lease %.1fs)", self.lease.lease)
            else:
                self.holder.clear()
                logger.warning("celery-dlq mover: another worker holds the mover lease now")
            self._role(holds)
        return holds

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.each(self.beat())
            self._stop_event.wait(self.lease.interval)
        try:
            self.lease.release()
        except Exception:
            logger.warning("celery-dlq mover: could not give up the mover lease; another worker takes over when "
                           "it expires", exc_info=True)
        finally:
            self.holder.clear()
            self._role(False)

    def _role(self, holds: bool) -> None:
        try:
            self.on_role(holds)
        except Exception:
            logger.exception("celery-dlq heartbeat: error on a change of role")

    def stop(self, timeout: float = 10.0) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout)
