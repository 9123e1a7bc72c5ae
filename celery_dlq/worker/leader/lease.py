"""The leader: one worker at a time runs the shared duties, so their Redis work does not grow with the workers.

Every worker beats every ``dlq_heartbeat_interval`` seconds on the leader's
lease (:class:`LeaderLease`, over the one :class:`~celery_dlq.storage.lease.Lease`):
a worker without it tries to take it (``SET NX PX``: one command); the
holder renews it every :data:`RENEW_EVERY` beats (one script call,
owner-checked: a holder that stalled past its lease, whose lease another
took meanwhile, learns it at its next renewal and never renews the other's). The lease lives ``dlq_mover_lease``
minus one interval, so whichever workers die (the holder, any others, all but
one), a survivor's next beat takes it within ``dlq_mover_lease`` of the
holder's last beat. The key is in the home set (``{<prefix>}``), so one
leader serves every shard.

The holder is the **leader** and runs the duties of :data:`DUTIES`, each
declared once with its cadence and the one setting that turns it off (no
setting turns off a duty it does not name). :class:`Leader` is the loop: it
beats, sets ``holder`` while this worker leads, tells ``on_role`` of each
change (the fetch listener starts and stops there) and runs ``each`` after
every beat (this process's in-flight beat, and on the leader the in-flight
sweep). The mover (``worker/park/mover.py``) and the polled duties
(``worker/leader/jobs.py``) run in threads of their own that wait on ``holder``:
a mover blocks on the wake marker, and a redrive job runs for minutes, and
neither may delay a renewal. A stopping worker gives the lease up, so
another takes over at its next beat.

"Lease" is the leader's; "beat" is a beat of the leader's lease or of a
process's in-flight messages (``worker/leader/inflight.py``), never a lease itself.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery_dlq.settings import DEFAULTS
from celery_dlq.storage.lease import Lease
from celery_dlq.storage.store import to_ms

logger = logging.getLogger(__name__)

#: Where the lease outlives three intervals (``dlq_mover_lease`` at least four; the default is four), the
#: holder renews every second beat: the lease still has one interval to spare at each renewal, and a worker
#: at rest spends half the commands. Where it does not, every beat.
RENEW_EVERY = 2


@dataclass(frozen=True)
class Duty:
    """One of the leader's duties: the setting that sets its cadence, the one that turns it off ('' for none:
    it always runs), and where it runs."""

    name: str
    cadence: str
    off: str
    runs: str

    def on(self, settings: Any) -> bool:
        """Whether ``settings`` leave this duty on (its ``off`` setting, when it has one, is not 0 or False)."""
        return not self.off or bool(getattr(settings, self.off.removeprefix("dlq_")))


MOVER = Duty("mover", "dlq_mover_interval", "",
             "worker/park/mover.py, its own thread: a pass when an entry is due (woken by parks), else blocked")
FETCH_LISTENER = Duty("fetch listener", "", "dlq_fetch_listener",
                      "worker/fetch/listener.py, its own thread, for as long as this worker leads")
INFLIGHT_SWEEP = Duty("in-flight sweep", "dlq_inflight_lease", "",
                      "worker/leader/inflight.py, after each beat: a look at most every dlq_inflight_lease")
REDRIVE_JOBS = Duty("redrive jobs", "dlq_jobs_poll", "dlq_jobs_poll",
                    "worker/leader/jobs.py, the polls thread: every poll while a job is unfinished, backing off "
                    "while none")
BREAKER_SWEEP = Duty("breaker sweep", "dlq_jobs_poll", "",
                     "worker/leader/jobs.py, the polls thread: every poll while the fetch holds deliveries, "
                     "backing off "
                     "while it holds none; at the default poll where dlq_jobs_poll is 0")
#: Every duty of the leader, each once.
DUTIES: tuple[Duty, ...] = (MOVER, FETCH_LISTENER, INFLIGHT_SWEEP, REDRIVE_JOBS, BREAKER_SWEEP)


def polls_of(settings: Any) -> float:
    """How often the polled duties look (``dlq_jobs_poll``; its default where it is 0, which turns off redrive
    jobs alone: the breaker sweep keeps its cadence)."""
    return float(settings.jobs_poll or DEFAULTS["dlq_jobs_poll"])


class LeaderLease:
    """The leader's lease for worker ``owner`` as its beats take and renew it (``lease`` and ``interval`` in
    seconds: ``dlq_mover_lease`` and ``dlq_heartbeat_interval``)."""

    def __init__(self, client: Any, key: str, owner: str, lease: float, interval: float) -> None:
        self.lease, self.interval = lease, interval
        self.one = Lease(client, key, owner, to_ms(lease - interval))
        self.held = False
        self._beats = 0
        self._renew_every = RENEW_EVERY if lease - interval >= (RENEW_EVERY + 1) * interval - 1e-9 else 1

    @property
    def ttl_ms(self) -> int:
        """How long the lease outlives its holder's last renewal (ms): ``dlq_mover_lease`` minus one interval."""
        return self.one.ttl_ms

    def beat(self) -> bool:
        """One beat: take the lease if it is free, or renew it in turn; whether this worker holds it now."""
        if not self.held:
            self.held, self._beats = self.one.acquire(), 0
            return self.held
        self._beats += 1
        if self._beats % self._renew_every == 0:
            self.held = self.one.renew()
        return self.held

    def release(self) -> None:
        """Give the lease up (a stopping worker): another worker takes it at its next beat."""
        if self.held:
            self.held = False
            self.one.release()


class Leader(threading.Thread):
    """Beats until stopped; ``holder`` is set while this worker leads (see the module docstring)."""

    def __init__(self, lease: LeaderLease, on_role: Callable[[bool], object] = lambda holds: None,
                 each: Callable[[bool], object] = lambda holds: None) -> None:
        """``each(holds)`` runs after every beat (the in-flight beat and sweep: ``worker/leader/inflight.py``)."""
        super().__init__(name="celery-dlq-leader", daemon=True)
        self.lease, self.on_role, self.each = lease, on_role, each
        self.holder = threading.Event()
        self._stop_event = threading.Event()

    def beat(self) -> bool:
        """One beat; whether this worker leads now (its role is kept when Redis cannot be reached)."""
        try:
            holds = self.lease.beat()
        except Exception as exc:   # Redis down: the lease expires there on its own
            logger.warning("celery-dlq leader: could not beat (%s: %s)", type(exc).__name__, exc)
            return self.holder.is_set()
        if holds != self.holder.is_set():
            if holds:
                self.holder.set()
                logger.info("celery-dlq leader: this worker moves due messages now (lease %.1fs)", self.lease.lease)
            else:
                self.holder.clear()
                logger.warning("celery-dlq leader: another worker holds the leader's lease now")
            self._role(holds)
        return holds

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.each(self.beat())
            self._stop_event.wait(self.lease.interval)
        try:
            self.lease.release()
        except Exception:
            logger.warning("celery-dlq leader: could not give up the leader's lease; another worker takes over "
                           "when it expires", exc_info=True)
        finally:
            self.holder.clear()
            self._role(False)

    def _role(self, holds: bool) -> None:
        try:
            self.on_role(holds)
        except Exception:
            logger.exception("celery-dlq leader: error on a change of role")

    def stop(self, timeout: float = 10.0) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout)
