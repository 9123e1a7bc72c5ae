"""The parked store: retries parked in Redis until they are due.

A failed task's message is *parked* here with a due time instead of being
retried with a broker countdown. A mover *claims* due entries with a lease,
publishes each back to its queue, then *acks* it. Claiming never pops: the
entry moves from ``delayed`` to ``leases`` in one script and is deleted only
by the ack, so a mover that dies between claim and publish loses nothing;
its lease expires and the entry becomes due again (kombu's ``unacked`` +
``restore_visible`` model). Delivery is therefore at-least-once: a mover that
published but could not ack (lease expired meanwhile) may cause a duplicate.

The lease expiry (integer ms) doubles as a fencing token. A lease can only be
re-claimed once it expired, and the new lease ends strictly later, so ack and
release compare it and never touch a lease another mover holds.

Public times are unix seconds (floats); Redis holds integer milliseconds. Each
operation over several keys is one Lua script (see ``celery_dlq/storage/lua``).
"""
from __future__ import annotations

import heapq
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from celery_dlq.errors import ConfigurationError
from celery_dlq.message import as_text as _text
from celery_dlq.storage import totals, trends
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.replication import Replication
from celery_dlq.storage.scripts import Scripts
from celery_dlq.storage.totals import Metric

logger = logging.getLogger(__name__)

#: Entries rescheduled per script call by :meth:`ParkedStore.redeliver_now`.
REDELIVER_BATCH = 500


#: The first byte of a direct-format payload (``lua/lib.lua``); a publish-format one is JSON (``{``).
DIRECT = b"\x01"


@dataclass(frozen=True)
class DirectPayload:
    """A parked message in the direct format: the exact element kombu will pop from ``dest``."""

    queue: str
    dest: str
    task: str
    element: bytes

    def dumps(self) -> bytes:
        for name in ("queue", "dest", "task"):
            if "\0" in getattr(self, name):
                raise ValueError(f"a parked {name} cannot hold a NUL byte: {getattr(self, name)!r}")
        return b"".join((DIRECT, self.queue.encode(), b"\0", self.dest.encode(), b"\0", self.task.encode(),
                         b"\0", self.element))

    @classmethod
    def loads(cls, payload: bytes) -> DirectPayload | None:
        """The direct payload, or None for a publish-format one."""
        if not payload.startswith(DIRECT):
            return None
        queue, dest, task, element = payload[1:].split(b"\0", 3)
        return cls(queue.decode(), dest.decode(), task.decode(), element)


def add_moves(counts: Counter[tuple[str, str]], reply: Sequence[Any], start: int) -> Counter[tuple[str, str]]:
    """Add a move script's counts (``queue, task, n, ...`` from ``reply[start]`` on) to ``counts``; returns it."""
    for i in range(start, len(reply) - 2, 3):
        counts[(_text(reply[i]), _text(reply[i + 1]))] += int(reply[i + 2])
    return counts


def to_ms(seconds: float) -> int:
    """Unix seconds (float) to the integer milliseconds Redis scores hold."""
    return int(round(seconds * 1000))


@dataclass(frozen=True)
class Claimed:
    """An entry a mover holds a lease on; pass it back to ack or release."""

    entry_id: str
    payload: bytes
    queue: str
    lease_until_ms: int

    @property
    def lease_until(self) -> float:
        """When the lease expires (unix seconds)."""
        return self.lease_until_ms / 1000


@dataclass(frozen=True)
class Entry:
    """One entry as an operator sees it.

    Exactly one of ``due`` and ``lease_until`` is set: a parked entry has a
    due time; a leased one is being moved and becomes due again at
    ``lease_until`` unless the mover acks it first.
    """

    entry_id: str
    payload: bytes
    queue: str
    due: float | None
    lease_until: float | None

    @property
    def leased(self) -> bool:
        return self.lease_until is not None

    @property
    def next_time(self) -> float:
        """Due time, or lease expiry for a leased entry: the listing order."""
        return self.due if self.due is not None else self.lease_until  # type: ignore[return-value]


def _entry(entry_id: Any, payload: bytes, queue: Any, score_ms: int, leased: bool) -> Entry:
    seconds = score_ms / 1000
    return Entry(_text(entry_id), payload, _text(queue),
                 None if leased else seconds, seconds if leased else None)


class ParkedStore:
    """Parked retries in Redis: park, claim due with a lease, ack or release.

    ``client`` must return bytes (``decode_responses=False``, kombu's own
    setting), since payloads are opaque bytes. ``clock`` gives unix seconds;
    tests pass a fake one, or ``now=`` to the methods that take it.
    """

    def __init__(self, client: Any, keys: Keys,
                 clock: Callable[[], float] = time.time, replication: Replication | None = None) -> None:
        get_kwargs = getattr(client, "get_connection_kwargs", None)
        if get_kwargs is not None and get_kwargs().get("decode_responses"):
            raise ConfigurationError(
                "ParkedStore needs a Redis client with decode_responses=False: "
                "payloads are bytes")
        self.client = client
        self.keys = keys
        self.clock = clock
        #: ``WAIT`` for replicas after parks and moves (``dlq_store_min_replicas``); None: never.
        self.replication = replication
        self._scripts = Scripts(client)

    def _now_ms(self, now: float | None) -> int:
        return to_ms(self.clock() if now is None else now)

    # -- the mover's side ------------------------------------------------------

    def park(self, entry_id: str, payload: bytes, queue: str, due: float,
             event: Mapping[str, str] | None = None, events_max_length: int = 0,
             ack: tuple[Sequence[str], str] | None = None, task: str | None = None,
             expires: float | None = None, metric: str = Metric.PARKED) -> bool:
        """Store ``payload`` to go back to ``queue`` at ``due`` (unix seconds).

        Idempotent: when ``entry_id`` is already parked or leased nothing
        changes and the result is False, so a message redelivered after its
        worker died mid-park is not parked (or counted) twice. The ``parked``
        counter of the stats hash is raised, and ``event`` (stream fields) is
        appended to the archive (capped at ``events_max_length``; 0: none), in
        the same script: one round trip. An archive error is logged, never
        raised: the message is parked. ``ack`` is ``(keys, delivery tag)``:
        kombu's ``unacked`` hash, its index and the consumer's ``fetched``
        set, from which the consumed message is removed in the same script.
        ``metric{queue, task}`` (``parked_total``) of the exporter's counters is raised too.
        ``expires`` (unix seconds) is when the message expires (Celery's
        ``expires``): once it has passed, the mover dead-letters the entry
        instead of moving it (``lua/move_due.lua``).
        """
        keys, args = self._park_call(entry_id, payload, queue, due, event, events_max_length, ack, task, expires,
                                     metric)
        result = int(self._scripts.run("park", keys, args))
        if result == 2:
            logger.warning("celery-dlq: parked %s but could not archive its event in %s", entry_id,
                           self.keys.events)
        if result == 3:
            logger.warning("celery-dlq: did not park %s: its message is no longer unacknowledged (restored to "
                           "its queue, or its fetch was lost in a failover); that copy carries on", entry_id)
            return False
        if result and self.replication is not None:
            self.replication.confirm("park")
        return result > 0

    def park_many(self, entries: Sequence[tuple[str, bytes, str, float]]) -> int:
        """Park ``(entry_id, payload, queue, due)`` entries in one pipeline (no event, no ack): what a
        benchmark or an import parks before the clock starts. How many were parked."""
        pipe = self.client.pipeline(transaction=False)
        script = self._scripts.get("park")
        for entry_id, payload, queue, due in entries:
            keys, args = self._park_call(entry_id, payload, queue, due)
            script(keys=list(keys), args=args, client=pipe)
        return sum(1 for result in pipe.execute() if int(result) == 1)

    def _park_call(self, entry_id: str, payload: bytes, queue: str, due: float,
                   event: Mapping[str, str] | None = None, events_max_length: int = 0,
                   ack: tuple[Sequence[str], str] | None = None, task: str | None = None,
                   expires: float | None = None, metric: str = Metric.PARKED) -> tuple[tuple[str, ...], list[Any]]:
        """``park.lua``'s KEYS and ARGV (its header says what each is)."""
        ack_keys, tag = ack if ack is not None else ((), "")
        counted = totals.field(metric, queue=queue, task=task or "")  # snoozed_total, breaker_held_total apart
        args: list[Any] = [entry_id, payload, queue, to_ms(due), int(events_max_length) if event else 0, tag,
                           counted, "" if expires is None else to_ms(expires), int(self.clock() // 60)]
        for name, value in (event or {}).items():
            args += [name, value]
        return (*self.keys.store_keys(), self.keys.stats, self.keys.events, self.keys.metrics, self.keys.expiries,
                self.keys.trends, self.keys.due_wake, self.keys.due_wake_until, *ack_keys), args

    def move_due(self, lists: Sequence[str], limit: int = 100, events_max_length: int = 0,
                 counter: str = "", now: float | None = None,
                 tally: Counter[tuple[str, str]] | None = None) -> tuple[int, int]:
        """Move up to ``limit`` due direct-format entries onto their lists inside Redis (``lua/move_due.lua``).

        ``lists`` are the destination lists that may be written (kombu's
        lists of the parked queues, with ``global_keyprefix``). Each move,
        its bookkeeping, its ``redelivered`` event and ``counter`` in the
        stats hash happen in one script: no lease, no Python decode, no
        kombu publish. Returns ``(moved, left)``: ``left`` due entries are in
        the publish format, name another list or expired (the message's
        ``expires`` passed while parked), and need :meth:`claim_due`.

        ``redelivered_total`` is raised per (queue, task) at once, or, with
        ``tally``, added up there for :meth:`count_redelivered` to write once
        for many batches (a mover's pass: one round trip instead of one per batch).
        """
        k = self.keys
        now_s = self.clock() if now is None else now
        reply = self._scripts.run(
            "move_due", [*k.move_keys(), *lists],
            [to_ms(now_s), int(limit), int(events_max_length), int(now_s * 1_000_000), counter])
        moved, left = int(reply[0]), int(reply[1])
        if moved and self.replication is not None:
            self.replication.confirm("move")
        if moved:   # redelivered_total per (queue, task): the script returns the counts, fields are built here
            counts = add_moves(Counter() if tally is None else tally, reply, 2)
            if tally is None:
                self.count_redelivered(counts)
        return moved, left

    def count_redelivered(self, tally: Counter[tuple[str, str]]) -> None:
        """Raise ``redelivered_total`` and the trends by ``tally`` ((queue, task) -> n) in one round trip; empty it."""
        if tally:
            pipe = self.client.pipeline(transaction=False)
            per_queue: Counter[str] = Counter()
            for (queue, task), n in tally.items():
                totals.incr(pipe, self.keys, Metric.REDELIVERED, n, queue=queue, task=task)
                per_queue[queue] += n
            for queue, n in per_queue.items():
                self.trend(pipe, trends.series("redelivered", queue), n)
            pipe.execute()
            tally.clear()

    def trend(self, pipe: Any, names: list[str], n: int = 1) -> None:
        """Queue on ``pipe`` the counting of ``n`` events now in the trends' series ``names`` (``redis/trends.py``)."""
        trends.count(pipe, self._scripts, self.keys, names, n, self.clock(), client=self.client)

    def claim_due(self, limit: int = 100, lease: float = 30.0,
                  now: float | None = None) -> list[Claimed]:
        """Lease up to ``limit`` due entries for ``lease`` seconds, oldest due first.

        Expired leases (their mover died or stalled) first become due again.
        Ack each entry once its message is published, or release it.
        """
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit!r}")
        lease_ms = to_ms(lease)
        if lease_ms < 1:
            raise ValueError(f"lease must be at least 1 ms, got {lease!r}")
        now_ms = self._now_ms(now)
        lease_until_ms = now_ms + lease_ms
        flat = self._scripts.run("claim_due", [*self.keys.store_keys(), self.keys.expiries],
                                 [now_ms, lease_until_ms, int(limit)])
        return [Claimed(_text(flat[i]), flat[i + 1], _text(flat[i + 2]), lease_until_ms)
                for i in range(0, len(flat), 3)]

    def ack(self, claimed: Claimed) -> bool:
        """Delete a claimed entry if the lease is still ours; return whether it was.

        False means the lease expired and the entry is due again or another
        mover holds it: its message may be delivered twice, never lost.
        """
        return self.ack_many([claimed]) == 1

    def ack_many(self, claimed: Sequence[Claimed], counter: str = "", published: int = 0) -> int:
        """Delete claimed entries whose lease is still ours, in one round trip.

        Returns how many were deleted. ``counter`` in the stats hash is raised
        by ``published`` in the same script, so a mover's batch costs one
        call however large it is.
        """
        if not claimed and not published:
            return 0
        k = self.keys
        args: list[Any] = [counter, int(published)]
        for entry in claimed:
            args += [entry.entry_id, entry.lease_until_ms]
        return int(self._scripts.run("ack", [k.leases, k.payloads, k.queues, k.parked, k.stats, k.expiries], args))

    def release(self, claimed: Claimed, due: float | None = None) -> bool:
        """Park a claimed entry again at ``due`` (default now), if the lease is ours.

        For a mover that could not publish: the entry is retried without
        waiting for its lease to expire.
        """
        return bool(self._scripts.run(
            "release", [self.keys.leases, self.keys.delayed],
            [claimed.entry_id, claimed.lease_until_ms, self._now_ms(due)]))

    # -- the operator's side ---------------------------------------------------

    def remove(self, entry_id: str) -> bool:
        """Delete a parked or leased entry; return whether it existed.

        A leased entry's message may already be on its way back to its queue;
        removing it only makes that mover's ack return False.
        """
        return bool(self._scripts.run("remove", [*self.keys.store_keys(), self.keys.expiries], [entry_id]))

    def redeliver_now(self, entry_id: str | None = None, now: float | None = None) -> int:
        """Make parked entries due now, so the next claim moves them.

        With ``entry_id``: 1 if that entry is parked (now due), 0 if it is
        unknown or leased (already being moved). Without: every parked entry
        not yet due is rescheduled, in batches; returns how many were.
        """
        now_ms = self._now_ms(now)
        if entry_id is not None:
            return int(self._scripts.run(
                "redeliver_one", [self.keys.delayed, self.keys.due_wake], [entry_id, now_ms]))
        total = 0
        while True:
            moved = int(self._scripts.run(
                "redeliver_all", [self.keys.delayed, self.keys.due_wake], [now_ms, REDELIVER_BATCH]))
            total += moved
            if moved < REDELIVER_BATCH:
                return total

    def get(self, entry_id: str) -> Entry | None:
        """The parked or leased entry ``entry_id``, or None if it is unknown."""
        k = self.keys
        row = self._scripts.run(
            "inspect", [k.delayed, k.leases, k.payloads, k.queues], [entry_id])
        if not row:
            return None
        payload, queue, state, score = row
        return _entry(entry_id, payload, queue, int(float(score)), _text(state) == "leased")

    def entries(self, queue: str | None = None, batch: int = 500) -> Iterator[Entry]:
        """Parked and leased entries (of ``queue``, or all), earliest first.

        Ordered by :attr:`Entry.next_time`. Reads ``batch`` entries per
        round trip and holds at most one batch per set in memory. It is not a
        snapshot: entries parked, claimed or acked meanwhile may or may not
        show, and an entry that moves between sets may show twice.
        """
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch!r}")
        parked = self._scan(self.keys.delayed, False, queue, batch)
        leased = self._scan(self.keys.leases, True, queue, batch)
        return heapq.merge(parked, leased, key=lambda entry: entry.next_time)

    def _scan(self, key: str, leased: bool, queue: str | None,
              batch: int) -> Iterator[Entry]:
        """Page through one sorted set by score, resuming after the last row.

        Paging by score (with an offset among equal scores) rather than by
        index keeps entries claimed ahead of the cursor from shifting pages.
        """
        k = self.keys
        last_ms, seen_at_last = None, 0
        while True:
            low = "-inf" if last_ms is None else str(last_ms)
            rows = self._scripts.run("page", [key, k.payloads, k.queues],
                                     [low, seen_at_last, batch])
            for row in rows:
                score_ms = int(float(row[1]))
                if score_ms == last_ms:
                    seen_at_last += 1
                else:
                    last_ms, seen_at_last = score_ms, 1
                if len(row) == 4 and (queue is None or _text(row[3]) == queue):
                    yield _entry(row[0], row[2], row[3], score_ms, leased)
            if len(rows) < batch:
                return

    def count(self) -> int:
        """Entries parked or leased, counted at one instant."""
        k = self.keys
        return int(self._scripts.run("count", [k.delayed, k.leases], []))

    def counts_by_queue(self) -> dict[str, int]:
        """Entries parked or leased per queue (queues with none are absent)."""
        return {_text(queue): int(n)
                for queue, n in self.client.hgetall(self.keys.parked).items()}

    def next_due(self, claims_recheck: float | None = None, announce: float | None = None) -> float | None:
        """When the next claim would find something (unix seconds), or None: the earliest due time or lease
        expiry. ``claims_recheck``: a lease (another mover's claims; an earlier release's gives them back
        early, without the marker) counts as ending within that many seconds. ``announce``: the moving
        worker's look, also written (kept that many seconds) for ``park.lua`` to wake it for a sooner entry.
        """
        k, until = self.keys, "" if claims_recheck is None else to_ms(self.clock() + claims_recheck)
        keys, args = [k.delayed, k.leases], [until]
        if announce is not None:
            keys, args = [*keys, k.due_wake_until], [until, to_ms(announce)]
        score = self._scripts.run("next_due", keys, args)
        return None if score is None else int(float(score)) / 1000
