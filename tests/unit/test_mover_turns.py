"""One mover at a time: the leader's beats that take a free lease, the role changes, the holder's wait."""
from __future__ import annotations

import sys
import threading
import time

import pytest
import redis

from celery_dlq.storage.keys import Keys
from celery_dlq.worker.leader.lease import Leader, LeaderLease
from celery_dlq.worker.park.turns import EARLY, MAX_BLOCK, MoverTurns


@pytest.fixture
def keys(redis_server, unique):
    keys = Keys(f"turns{unique}")
    yield keys
    client = redis.Redis.from_url(redis_server.url)
    for key in client.scan_iter(match=f"{{turns{unique}}}*"):
        client.delete(key)


def lease(redis_server, keys, ident, ttl=10.0, interval=2.0):
    return LeaderLease(redis.Redis.from_url(redis_server.url), keys.mover_lease, ident, ttl, interval)


class FakeLease:
    """Answers beats from a list; records releases."""

    def __init__(self, answers, interval=0.01) -> None:
        self.answers, self.lease, self.interval, self.released = list(answers), 10.0, interval, 0

    def beat(self) -> bool:
        return self.answers.pop(0)

    def release(self) -> None:
        self.released += 1


def test_the_leader_reports_each_change_of_role_once_and_releases_when_it_stops():
    roles = []
    beat = Leader(FakeLease([False, True, True, False, True]), on_role=roles.append)
    assert [beat.beat() for _ in range(5)] == [False, True, True, False, True]
    assert roles == [True, False, True] and beat.holder.is_set()
    beat.lease.answers = [True] * 1000
    beat.start()
    beat.stop()
    assert roles == [True, False, True, False] and beat.lease.released == 1 and not beat.holder.is_set()


def test_a_mover_without_the_lease_waits_for_it_without_redis():
    stop, holder = threading.Event(), threading.Event()
    turns = MoverTurns(None, stop, 0.2, holder)
    threading.Timer(0.05, holder.set).start()
    started = time.monotonic()
    assert turns.take_turn() and time.monotonic() - started < 0.9


def held() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


class BlockingLease:
    """Records the holder's blocking waits; a fixed number of them, then the thread is stopped."""

    def __init__(self, stop: threading.Event, blocks: int = 1, ttl: float = 10.0) -> None:
        self.lease, self.interval, self.stop, self.blocks, self.waits = ttl, 2.0, stop, blocks, []

    def wait_for_due(self, timeout: float) -> bool:
        self.waits.append(timeout)
        if len(self.waits) >= self.blocks:
            self.stop.set()
        return False


def test_the_holder_blocks_until_shortly_before_the_earliest_due_time():
    stop = threading.Event()
    fake = BlockingLease(stop)
    turns = MoverTurns(fake, stop, interval=0.2, holder=held())
    turns.wait_for_due(lambda: time.time() + 3.0, can_block=True)
    assert fake.waits[0] == pytest.approx(3.0 - EARLY, abs=0.05)   # then the last EARLY seconds locally


def test_the_holder_blocks_at_most_max_block_when_nothing_is_due():
    stop = threading.Event()
    fake = BlockingLease(stop)
    turns = MoverTurns(fake, stop, interval=0.2, holder=held())
    turns.wait_for_due(lambda: None, can_block=True)
    assert fake.waits[0] == pytest.approx(MAX_BLOCK, abs=0.05)


def test_the_holder_returns_at_once_when_an_entry_is_due():
    stop = threading.Event()
    fake = BlockingLease(stop)
    turns = MoverTurns(fake, stop, interval=0.2, holder=held())
    turns.wait_for_due(lambda: time.time() - 1.0, can_block=True)
    assert fake.waits == [] and turns.due()


def test_with_several_shards_the_holder_looks_every_interval():
    stop = threading.Event()
    fake = BlockingLease(stop)
    turns = MoverTurns(fake, stop, interval=0.05, holder=held())
    started = time.monotonic()
    turns.wait_for_due(lambda: time.time() + 3.0, can_block=False)
    assert fake.waits == [] and time.monotonic() - started < 1.0 and not turns.fresh


class MarkerLease:
    """The lease's wait as Redis does it: BZPOPMIN finds a marker written before the wait began, or blocks."""

    lease, interval = 10.0, 2.0

    def __init__(self) -> None:
        self.marker = threading.Event()

    def wait_for_due(self, timeout: float) -> bool:
        woken = self.marker.wait(timeout)
        self.marker.clear()
        return woken

    def wake(self) -> None:
        self.marker.set()


def stop_between_lines(set_at: int, look_at: int) -> bool:
    """Run the holder's wait (nothing due: it would block MAX_BLOCK) in a thread paused at its line events
    number ``set_at`` and ``look_at``: the stopping thread sets ``stop`` at the first and calls
    ``stop_waiting()`` at the second (or as soon as the wait blocks). True if the wait ended promptly."""
    stop, fake = threading.Event(), MarkerLease()
    turns = MoverTurns(fake, stop, interval=0.2, holder=held())
    paused, resume = threading.Semaphore(0), threading.Semaphore(0)
    pause_at, seen = {set_at, look_at}, [0]
    code = MoverTurns.wait_for_due.__code__

    def trace_lines(frame, event, arg):
        if event == "line":
            seen[0] += 1
            if seen[0] in pause_at:
                paused.release()
                resume.acquire()
        return trace_lines

    def waiter() -> None:
        sys.settrace(lambda frame, event, arg: trace_lines if frame.f_code is code else None)
        try:
            turns.wait_for_due(lambda: None, can_block=True)
        finally:
            sys.settrace(None)

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    steps = [(stop.set, turns.stop_waiting)] if set_at == look_at else [(stop.set,), (turns.stop_waiting,)]
    for step in steps:
        at_a_line = paused.acquire(timeout=0.05)   # else it blocks, or returned: the step comes then
        for action in step:
            action()
        if at_a_line:
            resume.release()
    pause_at.clear()
    resume.release()
    resume.release()
    thread.join(2.0)
    return not thread.is_alive()


def test_a_stop_at_any_moment_ends_the_holders_blocking_wait_at_once():
    """Every interleaving of the stopping thread's two steps with the holder's lines: none waits MAX_BLOCK."""
    stop, fake = threading.Event(), MarkerLease()
    lines = []
    code = MoverTurns.wait_for_due.__code__
    threading.Timer(0.3, lambda: (stop.set(), fake.wake())).start()

    def count(frame, event, arg):
        if event == "line":
            lines.append(frame.f_lineno)
        return count

    sys.settrace(lambda frame, event, arg: count if frame.f_code is code else None)
    try:
        MoverTurns(fake, stop, interval=0.2, holder=held()).wait_for_due(lambda: None, can_block=True)
    finally:
        sys.settrace(None)
    assert len(lines) > 5
    late = [(i, j) for i in range(1, len(lines) + 2) for j in range(i, len(lines) + 2)
            if not stop_between_lines(i, j)]
    assert late == []
