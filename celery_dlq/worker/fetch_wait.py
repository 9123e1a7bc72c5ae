"""How an idle fetch waits (:mod:`celery_dlq.worker.transport`): its states, its timeouts, its log line."""
from __future__ import annotations

import random
from typing import Any

from celery_dlq.internals.kombu_redis import longest_wait

#: The longest idle wait on the wake markers (seconds): only a safety net, the listener ends it. Kept below
#: kombu's health check of a blocked fetch (``brpop_timeout + health_check_interval``, 26 s by default).
#: Each wait is U(0.5, 1) of it, so workers that went idle together do not time out together.
MARKER_WAIT = 20.0
#: A fetch that found a listener hearing all of its queues is believed for this long (seconds): a fetch that
#: empties its lists then waits on the markers without asking again, and a wait that timed out waits again
#: without a fetch while less than HEARD_FOR - MARKER_WAIT has passed (an idle channel fetches every second
#: timeout, which keeps it believed).
HEARD_FOR = 65.0
#: For this long after a channel starts (a worker's start, a reconnect after a failover) its marker waits last
#: at most ``dlq_fetch_wait``: a failover's new master holds the old master's listening set, and the listener
#: needs a few seconds to track the new one.
SETTLE = 30.0
#: Each channel registers its queues again this often (seconds), so the listener keeps hearing them.
REGISTER_EVERY = 300.0
#: How long a channel's own wake token outlives its write (ms): written when the channel closes.
TOKEN_TTL_MS = 60_000
#: What a channel does next: fetch, block on its markers, or wait on one list (no listener hears it).
FETCH, MARKERS, FALLBACK = "fetch", "markers", "fallback"


def marker_wait(window: float | None, age: float, fetch_wait: float, rng: Any = random.random) -> float:
    """One idle wait on the markers (seconds): U(0.5, 1) of the longest, which stays inside kombu's health
    check of a blocked fetch (``window``: ``internals.kombu_redis.health_window``, None where it has none) and
    is ``fetch_wait`` while the channel is younger than :data:`SETTLE` (``age``, seconds)."""
    longest = MARKER_WAIT if window is None else min(MARKER_WAIT, longest_wait(window))
    if age < SETTLE:
        longest = min(longest, fetch_wait)
    return round(longest * (0.5 + rng() / 2), 3)


def wait_text(how: str, listener: bool, fetch_wait: float) -> str:
    """The INFO line a channel logs when how it waits idle changes."""
    if how == MARKERS:
        return ("celery-dlq: an idle fetch waits for the fetch listener, which wakes one worker per message "
                "on any list it watches")
    why = "dlq_fetch_listener is off" if not listener else "not yet, or none runs"
    return (f"celery-dlq: no fetch listener hears every queue of this worker ({why}): an idle fetch blocks on its "
            f"first list and looks at every list each {fetch_wait:g}s")
