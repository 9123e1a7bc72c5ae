"""The mover lease: which one worker moves due entries and runs the fetch listener, taken by heartbeats.

Every worker beats every ``dlq_heartbeat_interval`` seconds
(:class:`celery_dlq.worker.heartbeat.Heartbeat`). A worker without the
lease tries to take it (``SET NX PX``: one command); the holder renews it
every :data:`RENEW_EVERY` beats (a plain ``PEXPIRE``, and every
:data:`VERIFY_EVERY` beats ``lua/heartbeat.lua``, which renews only its
own lease). The lease lives
``dlq_mover_lease`` minus one interval, so whichever workers die (the
holder, any others, all but one), a survivor's next beat takes it within
``dlq_mover_lease`` of the holder's last beat. The key lives in the home
set (``{<prefix>}``), so the lease covers every shard. Public times are
seconds; Redis holds milliseconds.
"""
from __future__ import annotations

from typing import Any

from celery_dlq.storage.keys import Keys
from celery_dlq.storage.scripts import Scripts
from celery_dlq.storage.store import to_ms

#: The holder checks with a script that the lease is still its own every this many beats; the beats
#: between renew with a plain PEXPIRE (one command). A holder that stalled past its lease, whose lease another
#: worker took meanwhile, is a second mover for at most this many beats: safe (a claim is a lease of its own).
VERIFY_EVERY = 8
#: Where the lease outlives three intervals (``dlq_mover_lease`` at least four; the default is four), the
#: holder renews every second beat: the lease still has one interval to spare at each renewal, and a worker
#: at rest spends half the commands. Where it does not, every beat.
RENEW_EVERY = 2


class MoverLease:
    """The lease of one store (its home key set) for the worker ``ident``, taken and renewed by its beats."""

    def __init__(self, client: Any, keys: Keys, ident: str, lease: float, interval: float,
                 blocking: Any = None) -> None:
        """``blocking``: the client of :meth:`wait_for_due` (one whose socket timeout outlasts the wait)."""
        self.client, self.keys, self.ident, self.lease, self.interval = client, keys, ident, lease, interval
        self.blocking = blocking if blocking is not None else client
        self.held = False
        self._beats = 0
        self._renew_every = RENEW_EVERY if lease - interval >= (RENEW_EVERY + 1) * interval - 1e-9 else 1
        self._scripts = Scripts(client)

    @property
    def ttl_ms(self) -> int:
        """How long the lease outlives its holder's last beat (ms): ``dlq_mover_lease`` minus one interval."""
        return to_ms(self.lease - self.interval)

    def beat(self) -> bool:
        """One beat: take the lease if it is free, or renew it; whether this worker holds it now."""
        key = self.keys.mover_lease
        if not self.held:
            self.held, self._beats = bool(self.client.set(key, self.ident, nx=True, px=self.ttl_ms)), 0
            return self.held
        self._beats += 1
        if self._beats % self._renew_every:
            return self.held
        if self._beats % VERIFY_EVERY:
            self.held = bool(self.client.pexpire(key, self.ttl_ms))
        else:
            self.held = int(self._scripts.run("heartbeat", [key], [self.ident, self.ttl_ms, "renew"])) == 1
        return self.held

    def release(self) -> None:
        """Give the lease up (a stopping worker): another worker takes it at its next beat."""
        if self.held:
            self.held = False
            self._scripts.run("heartbeat", [self.keys.mover_lease], [self.ident, self.ttl_ms, "release"])

    def wait_for_due(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds on the home set's wake marker (``park.lua`` writes it); True if woken."""
        return self.blocking.bzpopmin(self.keys.due_wake, timeout=max(0.01, timeout)) is not None

    def wake(self) -> None:
        """Write the wake marker (a stopping holder ends its own wait this way)."""
        self.client.zadd(self.keys.due_wake, {"due": 0})
