"""One mover at a time: the lease, the standby, the others' scaled tries, the holder's wait (real Redis)."""
from __future__ import annotations

import threading
import time

import pytest
import redis

from celery_dlq.redis.keys import Keys
from celery_dlq.redis.lease import MoverLease, Role
from celery_dlq.redis.store import DelayedStore
from celery_dlq.worker.mover_turns import EARLY, MoverTurns


@pytest.fixture
def keys(redis_server, unique):
    keys = Keys(f"turns{unique}")
    yield keys
    client = redis.Redis.from_url(redis_server.url)
    for key in client.scan_iter(match=f"{{turns{unique}}}*"):
        client.delete(key)


def lease(redis_server, keys, ident, ttl=10.0):
    return MoverLease(redis.Redis.from_url(redis_server.url), keys, ident, ttl)


def test_one_holder_one_standby_the_others_counted(redis_server, keys):
    a, b, c, d = (lease(redis_server, keys, name) for name in "abcd")
    assert a.try_turn(60).role is Role.HOLDER
    assert b.try_turn(60).role is Role.STANDBY
    assert c.try_turn(60).role is Role.OTHER
    turn = d.try_turn(60)
    assert turn.role is Role.OTHER and turn.others == 2        # c and d count; the holder and standby do not
    assert a.try_turn(60).role is Role.HOLDER                  # renewed
    assert b.try_turn(60).role is Role.STANDBY                 # kept
    assert 9.0 < a.remaining() <= 10.0
    a.client.delete(keys.mover_lease)                          # the holder's lease expired
    assert a.remaining() == 0.0
    assert b.try_turn(60).role is Role.HOLDER                  # the standby takes the lease over (anyone would)
    assert c.try_turn(60).role is Role.STANDBY                 # and its place is free again
    assert a.try_turn(60).role is Role.OTHER                   # the old holder is now one of the others
    b.release()
    assert b.client.get(keys.mover_lease) is None
    assert c.try_turn(60).role is Role.HOLDER                  # a stopping holder hands over at once


def test_others_stop_counting_when_their_time_is_up(redis_server, keys):
    a, b, c, d = (lease(redis_server, keys, name) for name in "abcd")
    a.try_turn(60), b.try_turn(60), c.try_turn(0.001)
    time.sleep(0.01)
    assert d.try_turn(60).others == 1                          # c's count ran out


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
        self.lease, self.stop, self.blocks, self.waits = ttl, stop, blocks, []

    def wait_for_due(self, timeout: float) -> bool:
        self.waits.append(timeout)
        if len(self.waits) >= self.blocks:
            self.stop.set()
        return False


def test_the_holder_blocks_until_shortly_before_the_earliest_due_time():
    stop = threading.Event()
    fake = FakeLease(stop)
    turns = MoverTurns(fake, stop, interval=0.2)
    turns.renew_at = time.monotonic() + 5.0
    turns.wait_for_due(lambda: time.time() + 3.0, can_block=True)
    assert fake.waits[0] == pytest.approx(3.0 - EARLY, abs=0.05)   # then the last EARLY seconds locally


def test_the_holder_blocks_until_its_lease_is_to_be_renewed_when_nothing_is_due():
    stop = threading.Event()
    fake = FakeLease(stop)
    turns = MoverTurns(fake, stop, interval=0.2)
    turns.renew_at = time.monotonic() + 5.0
    turns.wait_for_due(lambda: None, can_block=True)
    assert fake.waits[0] == pytest.approx(5.0 - EARLY, abs=0.05)


def test_the_holder_returns_at_once_when_an_entry_is_due():
    stop = threading.Event()
    fake = FakeLease(stop)
    turns = MoverTurns(fake, stop, interval=0.2)
    turns.renew_at = time.monotonic() + 5.0
    turns.wait_for_due(lambda: time.time() - 1.0, can_block=True)
    assert fake.waits == [] and turns.due()


def test_with_several_shards_the_holder_looks_every_interval():
    stop = threading.Event()
    fake = FakeLease(stop)
    turns = MoverTurns(fake, stop, interval=0.05)
    turns.renew_at = time.monotonic() + 5.0
    started = time.monotonic()
    turns.wait_for_due(lambda: time.time() + 3.0, can_block=False)
    assert fake.waits == [] and time.monotonic() - started < 1.0 and not turns.fresh
