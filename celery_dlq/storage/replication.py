"""``WAIT`` for replicas after the store's writes (``dlq_store_min_replicas``).

Redis replicates asynchronously: a write the master acknowledged can be lost
when the master dies before its replicas have it and one of them is promoted
(Redis Sentinel, Cluster). The store's writes are single scripts, so what a
failover loses is a suffix of them: a park or a move undone, never half of
one. An undone write delivers a message again (a duplicate), it never loses
one. ``WAIT n timeout`` after each park and each moved batch makes that
window smaller at the cost of a replication round trip
(docs/high-availability.md gives the figures). It is not a guarantee: WAIT
returns after ``timeout`` with fewer replicas, and then the write stands as
it is (logged).
"""
from __future__ import annotations

import logging
import time
from typing import Any

logger = logging.getLogger(__name__)

#: At most one warning per this many seconds when replicas lag.
WARN_EVERY = 60.0


class Replication:
    """Waits for ``min_replicas`` to acknowledge the writes so far, up to ``timeout`` seconds."""

    def __init__(self, client: Any, min_replicas: int, timeout: float) -> None:
        if min_replicas < 1:
            raise ValueError(f"min_replicas must be >= 1, got {min_replicas!r}")
        self.client, self.min_replicas = client, min_replicas
        self.timeout_ms = max(1, int(timeout * 1000))
        self.short = 0            # writes that fewer replicas acknowledged in time
        self._warned = 0.0

    def confirm(self, what: str) -> int:
        """``WAIT``; returns how many replicas acknowledged. Never raises for a lagging replica."""
        try:
            acked = int(self.client.wait(self.min_replicas, self.timeout_ms))
        except Exception as exc:   # the write itself succeeded: a failed WAIT only loses the confirmation
            logger.warning("celery-dlq: WAIT after a %s failed (%s: %s)", what, type(exc).__name__, exc)
            return 0
        if acked < self.min_replicas:
            self.short += 1
            now = time.monotonic()
            if now - self._warned > WARN_EVERY:
                self._warned = now
                logger.warning("celery-dlq: a %s reached %d of %d replicas within %d ms "
                               "(dlq_store_min_replicas); %d write(s) so far", what, acked,
                               self.min_replicas, self.timeout_ms, self.short)
        return acked
