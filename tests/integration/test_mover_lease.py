"""Whose turn it is to move, on a real redis-server: the lease's holder, renewals, takeover, and the park wake."""
from __future__ import annotations

import time

import redis

from celery_dlq.storage.store import ParkedStore
from celery_dlq.storage.wake import DueWake
from tests.unit.test_mover_turns import held, keys, lease  # noqa: F401  (fixtures and helpers)


def test_the_holder_renews_every_beat_where_the_lease_has_no_interval_to_spare(redis_server, keys):
    a = lease(redis_server, keys, "a", ttl=6.0, interval=2.0)     # 4 s to live: two beats would leave none
    assert a.beat()
    a.one.client.pexpire(keys.mover_lease, 1_000)
    assert a.beat() and a.one.client.pttl(keys.mover_lease) > 3_900


def test_the_first_to_beat_holds_the_lease_and_whoever_beats_next_takes_it_when_it_expires(redis_server, keys):
    a, b, c = (lease(redis_server, keys, name) for name in "abc")
    assert a.beat() and not b.beat() and not c.beat()
    for _ in range(16):
        assert a.beat()                                           # renewed in turn (lease.lua, owner-checked)
    assert 7_900 < a.one.client.pttl(keys.mover_lease) <= 8_000      # dlq_mover_lease - one interval
    a.one.client.pexpire(keys.mover_lease, 5_000)
    assert a.beat() and a.one.client.pttl(keys.mover_lease) <= 5_000   # every second beat renews (10 s >= 4 x 2 s)
    assert a.beat() and a.one.client.pttl(keys.mover_lease) > 7_900
    a.one.client.delete(keys.mover_lease)                             # the holder died and its lease expired
    assert c.beat() and not b.beat()                              # any survivor, whoever beats first
    c.release()
    assert c.one.client.get(keys.mover_lease) is None and not c.held
    assert b.beat()                                               # a stopping holder hands over at once


def test_a_holder_that_lost_its_lease_to_another_finds_out_at_its_next_renewal(redis_server, keys):
    a, b = lease(redis_server, keys, "a"), lease(redis_server, keys, "b")
    assert a.beat()
    client = redis.Redis.from_url(redis_server.url)
    client.delete(keys.mover_lease)                               # a stalled past its lease ...
    assert b.beat()                                               # ... and b took it
    assert [a.beat(), a.beat()] == [True, False]                  # a's next renewal (every second beat) says so
    assert not a.held and client.get(keys.mover_lease) == b"b"    # and a never took b's lease
    assert 7_900 < client.pttl(keys.mover_lease) <= 8_000         # nor renewed it
    a.release()
    assert client.get(keys.mover_lease) == b"b"                   # nor gives it up
    assert not a.beat() and b.beat() and b.beat()                 # a is one of the others now; b renews


def test_a_park_wakes_a_blocked_mover_when_due_before_what_it_read_whatever_is_parked_ahead(redis_server, keys):
    """An earlier release parks without the marker: a later park due before the holder's wait ends still wakes it."""
    client = redis.Redis.from_url(redis_server.url)
    store = ParkedStore(client, keys)
    holder = DueWake(client, keys)
    assert store.next_due(announce=120) is None                  # the holder's look: nothing parked
    client.zadd(keys.delayed, {"old:2": int((time.time() + 1) * 1000)})     # an earlier release's park: no marker
    store.park("new:2", b"{}", "q", time.time() + 5)             # not the earliest, but due before the wait ends
    assert client.zcard(keys.due_wake) == 1
    assert holder.wait_for_due(20.0)
    due = store.next_due(announce=120)                            # the holder looks again: old:2 first
    assert abs(due - time.time() - 1) < 0.5 and int(client.get(keys.due_wake_until)) == int(due * 1000)
    store.park("late:2", b"{}", "q", time.time() + 40)           # due after what the holder waits for: no wake
    assert client.zcard(keys.due_wake) == 0
    store.park("soon:2", b"{}", "q", time.time() + 0.5)          # sooner: wakes it
    assert client.zcard(keys.due_wake) == 1
    assert 119_000 < client.pttl(keys.due_wake_until) <= 120_000


def test_a_park_wakes_the_mover_only_when_it_is_the_earliest_due(redis_server, keys):
    client = redis.Redis.from_url(redis_server.url)
    store = ParkedStore(client, keys)
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


