"""One mover at a time: the heartbeat that takes a free lease, the role changes, the holder's wait."""
from __future__ import annotations

import threading
import time

import pytest
import redis

from celery_dlq.redis.keys import Keys
from celery_dlq.redis.lease import MoverLease
from celery_dlq.redis.store import DelayedStore
from celery_dlq.worker.mover_turns import EARLY, MoverTurns


@pytest.fixture
def keys(redis_server, unique):
    keys = Keys(f"turns{unique}")
    yield keys
    client = redis.Redis.from_url(redis_server.url)
    for key in client.scan_iter(match=f"{{turns{unique}}}*"):
        client.delete(key)


def lease(redis_server, keys, ident, ttl=10.0, interval=2.0, clock=time.time):
    return MoverLease(redis.Redis.from_url(redis_server.url), keys, ident, ttl, interval, clock)


def test_the_first_to_beat_holds_the_lease_and_whoever_beats_next_takes_it_when_it_expires(redis_server, keys):
    a, b, c = (lease(redis_server, keys, name) for name in "abc")
    assert a.beat() and not b.beat() and not c.beat()
    assert a.beat()                                               # renewed
    ttl = a.client.pttl(keys.mover_lease)
    assert 7_900 < ttl <= 8_000                                   # dlq_mover_lease - one interval
    assert sorted(a.client.zrange(keys.workers, 0, -1)) == [b"a", b"b", b"c"]
    a.client.delete(keys.mover_lease)                             # the holder died and its lease expired
    assert c.beat() and not b.beat()                              # any survivor, whoever beats first
    c.release()
    assert c.client.get(keys.mover_lease) is None and b"c" not in c.client.zrange(keys.workers, 0, -1)
    assert b.beat()                                               # a stopping holder hands over at once


def test_a_silent_worker_leaves_the_live_workers(redis_server, keys):
    now = [1_000.0]
    a = lease(redis_server, keys, "a", clock=lambda: now[0])
    b = lease(redis_server, keys, "b", clock=lambda: now[0])
    a.beat(), b.beat()
    now[0] += 61.0                                                # six leases later
    b.beat()
    assert b.client.zrange(keys.workers, 0, -1) == [b"b"]


class FakeBeats:
    """A lease whose beats answer from a list, for the turns' role changes."""

    def __init__(self, answers, interval=0.01) -> None:
        self.answers, self.lease, self.interval, self.released = list(answers), 10.0, interval, False

    def beat(self) -> bool:
        return self.answers.pop(0)

    def release(self) -> None:
        self.released = True


def test_the_turns_report_each_change_of_role_once():
    roles = []
    turns = MoverTurns(FakeBeats([False, True, True, False]), threading.Event(), 0.2, on_role=roles.append)
    results = []
    for _ in range(4):
        turns.beat_at = 0.0
        results.append(turns.take_turn())
    assert results == [False, True, True, False] and roles == [True, False]
    turns.beat_at = 0.0
    turns.lease.answers.append(True)
    turns.take_turn()
    turns.release()
    assert roles == [True, False, True, False] and turns.lease.released


def test_a_park_wakes_the_mover_only_when_it_is_the_earliest_due(redis_server, keys):
    client = redis.Redis.from_url(redis_server.url)
    store = DelayedStore(client, keys)
    store.park("x:2", b"{}", "q", time.time() + 60)
    assert client.zcard(keys.due_wake) == 1                    # the first entry is the earliest
    client.delete(keys.due_wake)
    store.park("y:2", b"{}", "q", time.time() + 120)
    assert client.zcard(keys.due_wake) == 0                    # a later one: the mover's wait stands
    store.park("z:2", b"{}", "q", time.time() + 30)
    assert client.zcard(keys.due_wake) == 1
    client.delete(keys.due_wake)
    store.redeliver_now("y:2")
    assert client.zcard(keys.due_wake) == 1                    # an operator's "now" wakes it too


class FakeLease:
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
    fake = FakeLease(stop)
    turns = MoverTurns(fake, stop, interval=0.2)
    turns.beat_at = time.monotonic() + 5.0
    turns.wait_for_due(lambda: time.time() + 3.0, can_block=True)
    assert fake.waits[0] == pytest.approx(3.0 - EARLY, abs=0.05)   # then the last EARLY seconds locally


def test_the_holder_blocks_until_its_next_beat_when_nothing_is_due():
    stop = threading.Event()
    fake = FakeLease(stop)
    turns = MoverTurns(fake, stop, interval=0.2)
    turns.beat_at = time.monotonic() + 5.0
    turns.wait_for_due(lambda: None, can_block=True)
    assert fake.waits[0] == pytest.approx(5.0 - EARLY, abs=0.05)


def test_the_holder_returns_at_once_when_an_entry_is_due():
    stop = threading.Event()
    fake = FakeLease(stop)
    turns = MoverTurns(fake, stop, interval=0.2)
    turns.beat_at = time.monotonic() + 5.0
    turns.wait_for_due(lambda: time.time() - 1.0, can_block=True)
    assert fake.waits == [] and turns.due()


def test_with_several_shards_the_holder_looks_every_interval():
    stop = threading.Event()
    fake = FakeLease(stop)
    turns = MoverTurns(fake, stop, interval=0.05)
    turns.beat_at = time.monotonic() + 5.0
    started = time.monotonic()
    turns.wait_for_due(lambda: time.time() + 3.0, can_block=False)
    assert fake.waits == [] and time.monotonic() - started < 1.0 and not turns.fresh
