"""The leader's wake marker: the mover blocks on it between passes; a park due sooner writes it.

``park.lua`` (and an operator's "redeliver now") writes :attr:`Keys.due_wake`
when an entry comes due before the mover's wait ends; the mover blocks on it
with ``BZPOPMIN`` (``worker/park/turns.py``) and a stopping mover writes it
to end its own wait. The key lives in the home set (``{<prefix>}``).
"""
from __future__ import annotations

from typing import Any

from celery_dlq.storage.keys import Keys


class DueWake:
    """The home set's wake marker; ``blocking``: the client of :meth:`wait_for_due` (one whose socket timeout
    outlasts the wait)."""

    def __init__(self, client: Any, keys: Keys, blocking: Any = None) -> None:
        self.client, self.keys = client, keys
        self.blocking = blocking if blocking is not None else client

    def wait_for_due(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds on the marker; True if woken."""
        return self.blocking.bzpopmin(self.keys.due_wake, timeout=max(0.01, timeout)) is not None

    def wake(self) -> None:
        """Write the marker (a stopping mover ends its own wait this way)."""
        self.client.zadd(self.keys.due_wake, {"due": 0})
