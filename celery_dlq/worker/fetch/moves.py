"""A busy worker's fetch first moves the due parked retries of its own queues (``fetch.lua``).

The mover is one worker at a time (:mod:`celery_dlq.worker.park.turns`);
under load its process waits for a CPU and for the GIL, and a due retry
waits with it. As BullMQ's ``moveToActive`` promotes delayed jobs, a busy
worker's fetch (one after a fetch that took a message), where the broker is
the store, first moves up to :data:`LIMIT` due entries bound for the lists
it fetches from, in the same script as the pop, with the bookkeeping of
``move_due.lua`` (one function in ``lib.lua``). So while workers are busy a
retry is moved by the next fetch; an idle worker's fetches never look (they
cost what they did), and the mover moves as before. Each move is still one atomic step:
the fetch and the mover never move an entry twice.

Off with ``dlq_fetch_moves_due = False``; never with several shards (a
script cannot reach another shard's slot) or when parks and moves wait for
replicas (``dlq_store_min_replicas``: the fetch does not ``WAIT``).
"""
from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from celery_dlq.internals.base import usable
from celery_dlq.internals.kombu_redis import DIRECT_PARK
from celery_dlq.settings import DLQSettings
from celery_dlq.storage.keys import Stat
from celery_dlq.storage.shards import shards_of
from celery_dlq.storage.store import add_moves

#: The most due entries one fetch moves (a fetch happens per message taken: a few suffice).
LIMIT = 20


@dataclass(frozen=True)
class FetchMoves:
    """The store's keys and the archive's cap a fetch needs to move due entries (``fetch.lua``'s extra keys)."""

    keys: tuple[str, ...]
    events_max_length: int

    def args(self, now: float) -> list[Any]:
        """``fetch.lua``'s last four arguments (after its markers' queues) at ``now`` (unix seconds)."""
        return [LIMIT, self.events_max_length, int(now * 1_000_000), Stat.REDELIVERED]


def fetch_moves(settings: DLQSettings, direct: bool) -> FetchMoves | None:
    """What a worker's fetches need to move due entries, or None where they must not (module docstring);
    ``direct``: the broker is the store (``Config.direct``)."""
    if not (settings.fetch_moves_due and direct and settings.store_shards == 1
            and not settings.store_min_replicas and usable(DIRECT_PARK)):
        return None
    return FetchMoves(tuple(shards_of(settings).home.move_keys()), settings.events_max_length)


class MoveTally:
    """The moves this process's fetches made, per (queue, task), until the mover thread writes them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()

    def add(self, reply: Sequence[Any], start: int) -> None:
        """Count a fetch reply's moves (``queue, task, n, ...`` from ``reply[start]``)."""
        with self._lock:
            add_moves(self._counts, reply, start)

    def flush(self, store: Any) -> None:
        """Raise ``redelivered_total`` and the trends by what was counted (one round trip; nothing when empty)."""
        with self._lock:
            counts, self._counts = self._counts, Counter()
        if counts:
            try:
                store.count_redelivered(counts)
            except Exception:
                with self._lock:   # written at the next flush
                    self._counts.update(counts)
                raise
