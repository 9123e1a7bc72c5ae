"""Circuit breakers in Redis: each a hash (``Keys.breaker``), indexed in one hash (``Keys.breakers``).

Every change reads the breaker, applies a pure transition of
:mod:`celery_dlq.storage.breaker_state` and writes it back with its index
entry in one ``MULTI`` under ``WATCH``: two workers that both see a group
cross its threshold open it once, and one delivery wins a probe. A worker
reads the index alone (:meth:`Breakers.index`) to know which tasks are held;
deliveries held while a breaker is open are listed in ``Keys.breaker_held``
and released by :meth:`Breakers.release` when it closes. Where the broker
is the store, the fetch holds most of them itself (``fetch.lua``, told by
``Keys.breaker_holds``) and :meth:`Breakers.release_held` pushes them back.
"""
from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from redis.exceptions import WatchError

from celery_dlq.storage import breaker_state as B
from celery_dlq.storage.breaker_state import BreakerState, Thresholds
from celery_dlq.storage.events import breaker_event
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.scripts import Scripts
from celery_dlq.storage.shards import ShardedStore

logger = logging.getLogger(__name__)

SEP = "\x1f"
#: How many held entries are read and released per round trip.
RELEASE_BATCH = 1000
_WATCH_TRIES = 50
#: ``Keys.breaker_holds``'s value for "until resumed" (ms): Lua's ``tonumber`` reads no ``inf``.
_FOREVER_MS = "9e15"


@dataclass(frozen=True)
class Summary:
    """A breaker's index entry: what a worker needs to decide a delivery without reading the breaker."""

    queue: str
    group: str
    task: str
    state: str
    probe_due: float
    paused: bool

    def matches(self, queue: str, task: str) -> bool:
        return self.task == task and self.queue in (queue, B.ANY_QUEUE)

    @classmethod
    def of(cls, s: BreakerState) -> Summary:
        return cls(s.queue, s.group, s.task, s.state, s.next_probe, bool(s.paused_by))


@dataclass(frozen=True)
class Change:
    """A transition applied: the state before (None: new) and after; ``changed`` when ``state`` moved."""

    before: BreakerState | None
    after: BreakerState | None

    @property
    def changed(self) -> bool:
        """Whether the state (or who paused it) moved; a breaker made closed by its first failure did not."""
        if self.after is None:
            return False
        if self.before is None:
            return self.after.state != B.CLOSED
        return self.before.state != self.after.state or self.before.paused_by != self.after.paused_by


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class Breakers:
    """One app's breakers (``client`` may decode responses or not)."""

    def __init__(self, client: Any, keys: Keys, clock: Callable[[], float] = time.time,
                 archive: Any = None) -> None:
        self.client, self.keys, self.clock, self.archive = client, keys, clock, archive
        self.scripts = Scripts(client)

    # -- reading ---------------------------------------------------------------

    def get(self, queue: str, group: str) -> BreakerState | None:
        return BreakerState.from_hash(self.client.hgetall(self.keys.breaker(queue, group)))

    def state(self, queue: str, group: str) -> str:
        """One breaker's state ('' when none is kept): one ``HGET``."""
        value = self.client.hget(self.keys.breaker(queue, group), "state")
        return "" if value is None else _text(value)

    def index(self) -> list[Summary]:
        """Every breaker's summary: one ``HGETALL`` (what a worker refreshes)."""
        out = []
        for field, value in self.client.hgetall(self.keys.breakers).items():
            try:
                data = json.loads(_text(value))
                out.append(Summary(data["queue"], data["group"], data["task"], data["state"],
                                   float(data["probe_due"]), bool(data["paused"])))
            except (ValueError, KeyError, TypeError):
                logger.warning("celery-dlq: unreadable breaker index entry %r; skipped", _text(field))
        return out

    def all(self) -> list[BreakerState]:
        """Every breaker, read in one pipeline after the index."""
        summaries = self.index()
        pipe = self.client.pipeline(transaction=False)
        for s in summaries:
            pipe.hgetall(self.keys.breaker(s.queue, s.group))
        states = [BreakerState.from_hash(data) for data in pipe.execute()] if summaries else []
        return sorted((s for s in states if s is not None), key=lambda s: (s.queue, s.task, s.group))

    def held_count(self, queue: str, group: str) -> int:
        return int(self.client.zcard(self.keys.breaker_held(queue, group)))

    # -- changing ----------------------------------------------------------------

    def apply(self, queue: str, group: str, change: Callable[[BreakerState], BreakerState | None],
              new: BreakerState | None = None) -> Change:
        """Apply ``change`` to the breaker (``new`` when there is none yet; None: leave it) atomically."""
        key = self.keys.breaker(queue, group)
        for _ in range(_WATCH_TRIES):
            with self.client.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(key)
                    before = BreakerState.from_hash(pipe.hgetall(key))
                    base = before if before is not None else new
                    after = change(base) if base is not None else None
                    if after is None or after == before:
                        pipe.unwatch()
                        return Change(before, before)
                    pipe.multi()
                    pipe.hset(key, mapping=after.as_hash())
                    pipe.hset(self.keys.breakers, queue + SEP + group, json.dumps(Summary.of(after).__dict__))
                    self._fetch_holds(pipe, after)
                    pipe.execute()
                except WatchError:
                    continue
            result = Change(before, after)
            if result.changed:
                self._archive(after)
            return result
        raise RuntimeError(f"celery-dlq: breaker {queue}/{group} changed {_WATCH_TRIES} times under us")

    def record_failure(self, queue: str, task: str, group: str, failure: dict, t: Thresholds, *,
                       task_id: str = "", successes: int = 0) -> Change:
        now = self.clock()
        new = BreakerState(queue, task, group, window_start=now, exception_type=failure.get("type", ""),
                           message=str(failure.get("message", ""))[:300], changed_at=now)
        return self.apply(queue, group, lambda s: B.record_failure(s, now, t, task_id=task_id,
                                                                   successes=successes), new)

    def record_success(self, queue: str, group: str, task_id: str) -> Change:
        now = self.clock()
        return self.apply(queue, group, lambda s: B.record_success(s, now, task_id))

    def claim_probe(self, queue: str, group: str, task_id: str) -> Change:
        """Make ``task_id`` the probe if the cool-down is over; ``after`` is the breaker as it is now."""
        now = self.clock()
        return self.apply(queue, group, lambda s: B.claim_probe(s, now, task_id))

    def hold(self, queue: str, group: str, entry_id: str, t: Thresholds) -> float:
        """Count a delivery held by the breaker and list its parked entry; returns when it comes back."""
        now = self.clock()
        key = self.keys.breaker(queue, group)
        pipe = self.client.pipeline(transaction=False)   # one round trip; the count orders the holds
        pipe.hincrby(key, "held", 1)
        pipe.hgetall(key)
        pipe.zadd(self.keys.breaker_held(queue, group), {entry_id: now})
        held, data, _ = pipe.execute()
        state = BreakerState.from_hash(data)
        if state is None:
            return now
        if int(held) == 1:   # from now on the fetch holds the task's deliveries itself
            self._fetch_holds(self.client, replace(state, held=1))
        return B.hold_until(state, now, int(held) - 1, t)

    def _fetch_holds(self, client: Any, s: BreakerState) -> None:
        """Tell ``fetch.lua`` whether, and until when, it holds ``s``'s task on its queue (``client``: a pipeline)."""
        until = B.fetch_holds_until(s)
        field = s.queue + SEP + s.task
        if until is None:
            client.hdel(self.keys.breaker_holds, field)
        else:
            client.hset(self.keys.breaker_holds, field, _FOREVER_MS if until == math.inf else str(int(until * 1000)))

    def pause(self, queue: str, task: str, group: str, who: str) -> Change:
        now = self.clock()
        new = BreakerState(queue, task, group, window_start=now, changed_at=now)
        return self.apply(queue, group, lambda s: B.pause(s, now, who), new)

    def resume(self, queue: str, group: str) -> Change:
        now = self.clock()
        return self.apply(queue, group, lambda s: B.close(s, now) if s.state != B.CLOSED else None)

    def held_in_fetch(self, queue: str | None = None, task: str | None = None) -> dict[tuple[str, str], int]:
        """How many deliveries the fetch holds, per (queue, task) (of ``queue`` and ``task`` only, if given;
        ``*`` as the queue: every queue)."""
        out: dict[tuple[str, str], int] = {}
        queue = None if queue == B.ANY_QUEUE else queue
        key = self.keys.breaker_held_raw
        start = b"-" if queue is None else b"[" + _prefix(queue, task)
        while True:
            first = self.client.zrangebylex(key, start, b"+", start=0, num=1)
            if not first:
                return out
            q, t, _ = _text(first[0]).split(SEP, 2)
            if queue is not None and (q != queue or (task is not None and t != task)):
                return out
            prefix = _prefix(q, t)
            if task is None or t == task:
                out[(q, t)] = int(self.client.zlexcount(key, b"[" + prefix, b"(" + prefix + b"\xff"))
            start = b"[" + prefix + b"\xff"

    def holding_in_fetch(self, queue: str, task: str) -> bool:
        """Whether the fetch is told to hold ``task`` on ``queue`` (or on every queue) now."""
        return any(v is not None for v in self.client.hmget(self.keys.breaker_holds, queue + SEP + task,
                                                             B.ANY_QUEUE + SEP + task))

    def release_held(self, queue: str, task: str, target: str, limit: int = RELEASE_BATCH) -> int:
        """Push up to ``limit`` deliveries the fetch held for ``task`` on ``queue`` onto list ``target``."""
        return int(self.scripts.run("release_held", [self.keys.breaker_held_raw, target],
                                    [_prefix(queue, task), min(limit, RELEASE_BATCH)]))

    def forget(self, queue: str, group: str) -> bool:
        """Delete a breaker (closed or not) and its index entry; its held entries come back at their own time."""
        state = self.get(queue, group)
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(self.keys.breaker(queue, group), self.keys.breaker_held(queue, group))
        if state is not None:   # what the fetch held is released by the next sweep (worker/features/breaker.py)
            pipe.hdel(self.keys.breaker_holds, queue + SEP + state.task)
        pipe.hdel(self.keys.breakers, queue + SEP + group)
        return bool(pipe.execute()[0])

    # -- releasing -----------------------------------------------------------------

    def release(self, sharded: ShardedStore, queue: str, group: str, rate: float, max_rate: float) -> int:
        """Bring the deliveries held by a closed breaker back at a rising pace (:func:`release_offsets`).

        Entries are taken off the held set a batch at a time, oldest first;
        each is made due at its offset from now. Returns how many were parked.
        """
        held = self.keys.breaker_held(queue, group)
        now, done, released = self.clock(), 0, 0
        while True:
            pipe = self.client.pipeline(transaction=True)
            pipe.zrange(held, 0, RELEASE_BATCH - 1)
            pipe.zremrangebyrank(held, 0, RELEASE_BATCH - 1)
            entries = [_text(e) for e in pipe.execute()[0]]
            if not entries:
                return released
            offsets = B.release_offsets(done + len(entries), rate, max_rate)[done:]
            released += sharded.reschedule({e: now + off for e, off in zip(entries, offsets)})
            done += len(entries)

    def _archive(self, s: BreakerState | None) -> None:
        if s is None or self.archive is None:
            return
        self.archive.append([breaker_event(s.state, s.queue, s.task, group=s.group, ts=s.changed_at,
                                           task_id=s.probe_id, exception_type=s.exception_type,
                                           message=s.message, paused_by=s.paused_by)])


def _prefix(queue: str, task: str | None) -> bytes:
    """``<queue>\\x1f<task>\\x1f`` (or ``<queue>\\x1f`` without a task): a held delivery's prefix, as bytes."""
    return (queue + SEP + (task + SEP if task is not None else "")).encode()


def thresholds_of(policy: Any) -> Thresholds:
    return Thresholds.of(policy)


def summaries_for(summaries: Iterable[Summary], queue: str, task: str) -> list[Summary]:
    """The breakers holding ``task`` on ``queue`` (open, half-open or paused)."""
    return [s for s in summaries if s.state != B.CLOSED and s.matches(queue, task)]


__all__ = ["Breakers", "BreakerState", "Change", "Summary", "Thresholds", "summaries_for", "thresholds_of"]
