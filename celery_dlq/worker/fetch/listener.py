"""The fetch listener: one thread, in the worker holding the mover lease, that wakes one idle worker per message.

The fetch pops and records in one script, and a script cannot block, so an
idle channel blocks on a wake marker per queue (``BZPOPMIN``; a ZSET with at
most one member). This thread hears writes to the watched queues' lists
through Redis' client tracking (``CLIENT TRACKING ON REDIRECT <id>``:
invalidation messages, no server configuration, Redis >= 6) and writes the
marker of each queue whose lists hold a message. Tracking is per key, not
broadcast: Redis sends one invalidation at a list's next write after the
thread read it, and none after until the thread reads it again, which it
does whenever it looks at the list (``lua/mark_queues.lua``). So however
busy a queue, the thread hears about as many writes as it makes looks.
Redis serves a marker's one member to one blocked client, so a message
wakes one idle worker however many wait, as kombu's ``BRPOP`` does; that
worker's pop is heard too and marks the queue again if another message is
left, waking the next.

Where breakers hold in Redis (the broker is the store), the script first
keeps a list's oldest elements that an open breaker holds, as the fetch
does: a push of a held task wakes no worker.

What a message costs the listener (:class:`Coalescer`): a write heard to a
list is looked at at once (one ``EXISTS``, and a ``ZADD`` where the list
holds a message: a push; a list already empty again was popped, and wakes
nobody), except the first write heard within :data:`WINDOW` after a marking,
which is presumed the pop of the worker that marking woke and only looked
at when the window ends. Until that look the list is not heard (per-key
tracking), so a push that came first waits for it: the window bounds both
that wait and the listener's looks (at most one per list per window,
however busy the queue).

The queues to hear are those fetches register (``Keys.fetch_queues``,
written by a fetch that finds a queue of its own not heard, which also
publishes on that key's name, so the thread hears of a new queue at once).
The thread publishes the queues it hears in ``Keys.fetch_listening`` (a SET
living :data:`LISTENING_TTL_MS`); a fetch blocks on its markers only when
all of its queues are there, and otherwise waits without them (the
channel's fallback). When the lease passes to another worker (its holder
died or stopped), the new listener marks every queue that holds a message
as it starts, which wakes the workers blocked on the markers.

Every :data:`CHECK` seconds the thread checks that tracking is still on
(``CLIENT TRACKINGINFO``), reads the registered queues and renews the SET;
when the queues changed or tracking was lost it tracks again and marks
every queue that holds a message (what was pushed meanwhile). Its
connections never reconnect silently (a reconnected connection would have
lost its tracking): an error ends them, and the thread starts over.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis

from celery_dlq.storage.keys import Keys, QueueLists
from celery_dlq.storage.listening import Invalidations, Tracking, forget_listening

logger = logging.getLogger(__name__)

#: Seconds between two checks of the tracking, the registered queues and the listening SET.
CHECK = 30.0
#: How long the listening SET outlives the listener's last check (ms): then fetches stop relying on it.
LISTENING_TTL_MS = 90_000
#: A queue no fetch found empty for this long is no longer heard (ms).
STALE_MS = 3_600_000
#: Most lists looked at in one round trip.
BATCH = 256
#: The first write heard to a list this soon after its marking is looked at when the window ends (seconds):
#: the most a push waits under load, and at most one look per list per window.
WINDOW = 0.005
#: After tracking was refused (an ACL, a proxy, an old server): try again after this long (seconds).
REFUSED_WAIT = 60.0


def tracking_on(info: Any, redirect: int) -> bool:
    """Whether a ``CLIENT TRACKINGINFO`` reply (RESP2: a flat list of pairs) says per-key tracking to
    ``redirect`` is on and its redirect alive."""
    fields = dict(zip(info[::2], info[1::2])) if isinstance(info, list) else dict(info or {})
    flags = {bytes(flag) if isinstance(flag, (bytes, bytearray)) else str(flag).encode()
             for flag in fields.get(b"flags", fields.get("flags")) or []}
    target = fields.get(b"redirect", fields.get("redirect"))
    return b"on" in flags and b"bcast" not in flags and b"broken_redirect" not in flags and target == redirect


class Coalescer:
    """Which lists heard written to are marked at once, which looked at when their window ends.

    A marking wakes one worker, whose pop is heard next: after each marking
    of a list, the next write heard within :attr:`window` is presumed that
    pop and only looked at when the window ends; any other write is marked
    at once (a push, whose message must not wait). A presumption that was
    wrong costs at worst one idle worker a fetch that finds nothing.
    """

    def __init__(self, window: float) -> None:
        self.window = window
        self._until: dict[str, float] = {}   # list -> when the window of its last marking ends
        self._pop: set[str] = set()          # lists whose marking's pop has not been heard yet
        self._later: dict[str, float] = {}   # list -> when to look at it

    def heard(self, lists: Iterable[str], now: float) -> set[str]:
        """The lists to mark now: the others wait for :meth:`due`."""
        at_once = set()
        for key in lists:
            if key in self._pop and now < self._until[key]:
                self._pop.discard(key)
                self._later.setdefault(key, self._until[key])
            else:
                at_once.add(key)
                self._until[key] = now + self.window
                self._pop.add(key)
        return at_once

    def unmark(self, lists: Iterable[str]) -> None:
        """``lists`` were heard but not marked (empty again, or a breaker kept the push): no worker was woken,
        no pop to wait for."""
        for key in lists:
            self._pop.discard(key)
            self._until.pop(key, None)

    def due(self, now: float) -> set[str]:
        """The lists whose look has come: to look at now (EXISTS, and mark those holding a message)."""
        due = {key for key, at in self._later.items() if at <= now}
        for key in due:
            del self._later[key]
        return due

    def next_at(self, default: float) -> float:
        """When the next look is due (``default`` when none is pending)."""
        return min(self._later.values(), default=default)


class FetchListener(threading.Thread):
    """Hears writes to the watched queues' lists and writes their wake markers (see the module docstring)."""

    def __init__(self, connect: Callable[[], Any], keys: Keys, lists: QueueLists,
                 clock: Callable[[], float] = time.time, holds: bool = False) -> None:
        super().__init__(name="celery-dlq-fetch-listener", daemon=True)
        self.connect, self.keys, self.lists, self.clock = connect, keys, lists, clock
        #: Whether breakers hold in Redis (the broker is the store): a held push is kept, waking no worker.
        self.holds = holds
        self._stop_event = threading.Event()
        #: full list name -> its queue's marker, for every queue heard
        self.watched: dict[str, str] = {}
        self.signalled = 0

    def stop(self, timeout: float = 5.0) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout)

    def run(self) -> None:
        backoff = 0.5
        while not self._stop_event.is_set():
            client = invalidations = None
            try:
                client = self.connect()
                invalidations = Invalidations(client, self.keys)
                self._listen(client, invalidations)
                backoff = 0.5
            except redis.ResponseError as exc:   # CLIENT TRACKING refused: fetches keep their fallback wait
                logger.warning("celery-dlq: the fetch listener cannot track the queues (%s); idle fetches wait "
                               "without it (a message on a queue's second list waits up to dlq_fetch_wait); "
                               "trying again in %.0fs", exc, REFUSED_WAIT)
                self._forget()   # an earlier listener's set: fetches must not wait on markers nobody writes
                self._stop_event.wait(REFUSED_WAIT)
            except Exception as exc:   # the connection was lost (a Redis restart): heard again once back
                logger.debug("celery-dlq: the fetch listener lost its connection (%s: %s); again in %.1fs",
                             type(exc).__name__, exc, backoff)
                self._stop_event.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                self._close(invalidations, client)

    # -- one connection's life ------------------------------------------------------

    def _listen(self, client: Any, invalidations: Invalidations) -> None:
        redirect = invalidations.redirect
        tracker = Tracking(client, self.keys)
        try:
            queues: frozenset[str] = frozenset()
            tracked = False
            next_check = 0.0
            coalescer = Coalescer(WINDOW)
            while not self._stop_event.is_set():
                now = time.monotonic()
                if now >= next_check:
                    queues, tracked = self._check(tracker, redirect, queues, tracked)
                    next_check = now + CHECK
                wait = min(0.5, next_check - now, coalescer.next_at(now + 0.5) - now)
                message = invalidations.next(max(0.0, wait))
                written: set[str] = set()
                while message is not None and len(written) < BATCH:
                    if self._registered(message):   # a fetch registered a new queue: hear it now
                        next_check = 0.0
                    written |= self._written(message)
                    message = invalidations.next(0.0)
                now = time.monotonic()
                coalescer.unmark(self._mark(tracker, coalescer.heard(written, now)))
                self._signal(tracker, coalescer.due(now))
        finally:
            tracker.close()

    def _check(self, tracker: Tracking, redirect: int, queues: frozenset[str],
               tracked: bool) -> tuple[frozenset[str], bool]:
        now_ms = int(self.clock() * 1000)
        info = tracker.tracking_info()
        current, published = tracker.registered(now_ms - STALE_MS, LISTENING_TTL_MS)
        if not current:
            return current, False
        if not (current == queues and tracked and tracking_on(info, redirect)):
            self._track(tracker, redirect, current)
            self._signal(tracker, set(self.watched))   # what was pushed before the tracking took
        elif published:
            return queues, True
        # tracked anew, or the set is gone (it expired, or a listener stopping as this one started took it)
        tracker.listening(sorted(current), LISTENING_TTL_MS, now_ms - STALE_MS)
        logger.debug("celery-dlq: the fetch listener hears %d queue(s)", len(current))
        return current, True

    def _track(self, tracker: Tracking, redirect: int, queues: frozenset[str]) -> None:
        self.watched = {key: self.keys.fetch_marker(queue) for queue in queues for key in self.lists.keys(queue)}
        tracker.track(redirect)

    def _registered(self, message: Any) -> bool:
        channel = message.get("channel") if message else None
        return message.get("type") == "message" and channel in (self.keys.fetch_queues,
                                                                self.keys.fetch_queues.encode())

    def _written(self, message: Any) -> set[str]:
        """The watched lists an invalidation message names (all of them for a flush, which names none)."""
        if not message or message.get("type") != "message" or self._registered(message):
            return set()
        data = message.get("data")
        if data is None:
            return set(self.watched)
        names = data if isinstance(data, list) else [data]
        written = set()
        for name in names:
            key = name.decode("utf-8", "surrogateescape") if isinstance(name, bytes) else str(name)
            if key in self.watched:
                written.add(key)
        return written

    def _mark(self, tracker: Tracking, lists: set[str]) -> set[str]:
        """Write the marker of each queue one of ``lists`` (a write was heard to each) holds a message of, and
        arm them; returns those left unmarked (empty again, or a breaker kept what was pushed)."""
        return self._run(tracker, lists, heard=True)

    def _signal(self, tracker: Tracking, lists: set[str]) -> None:
        """Write the marker of each queue one of ``lists`` holds a message of, and arm them."""
        self._run(tracker, lists, heard=False)

    def _run(self, tracker: Tracking, lists: set[str], heard: bool) -> set[str]:
        """``mark_queues.lua`` on the tracking connection (its reads arm the lists), :data:`BATCH` lists a call;
        the lists heard written to that it did not mark."""
        unmarked: set[str] = set()
        ordered = sorted(lists)
        for start in range(0, len(ordered), BATCH):
            part = ordered[start:start + BATCH]
            holds = (int(self.clock() * 1000), list(map(self.lists.queue_of, part))) if self.holds else None
            marked, kept = tracker.mark_queues(part, [self.watched[key] for key in part], heard, holds)
            self.signalled += marked
            unmarked.update(part[i - 1] for i in kept)
        return unmarked

    # -- the end ------------------------------------------------------------------

    def _forget(self) -> None:
        """Take the SET down (tracking refused), so fetches wait without markers at once (best effort). A
        stopping listener leaves it: the next holder's listener, starting meanwhile, may have written it."""
        client = None
        try:
            client = self.connect()
            forget_listening(client, self.keys)
        except Exception:
            logger.debug("celery-dlq: could not take the fetch listener's set down", exc_info=True)
        finally:
            self._close(None, client)

    @staticmethod
    def _close(invalidations: Invalidations | None, client: Any) -> None:
        for thing in (invalidations, client):
            if thing is not None:
                try:
                    thing.close()
                except Exception:
                    logger.debug("celery-dlq: error closing a fetch listener connection", exc_info=True)
