"""In-flight records: the fetch records, a consumer acknowledges its own, the sweeper gives back the silent ones'."""
from __future__ import annotations

import json
import os
import socket

import pytest

from celery_dlq.storage.inflight import InFlight, parse_value
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.store import ParkedStore
from celery_dlq.worker.leader import inflight as process
from celery_dlq.worker.leader.inflight import Beats, previous_runs
from tests.unit.test_fetch import celery_message, fetch


@pytest.fixture
def setup(any_redis, unique):
    keys, q = Keys(f"i{unique}"), f"q{unique}"
    yield any_redis, keys, q, InFlight(any_redis, keys)
    any_redis.delete(q, f"{q}\x06\x169", keys.consumers, keys.inflight("c1"), keys.inflight("c2"))


def push(client, q: str, tag: str) -> bytes:
    raw = json.dumps(celery_message(tag=tag)).encode()
    client.lpush(q, raw)
    return raw


def test_a_given_back_message_is_the_same_bytes_and_its_next_fetch_counts_a_redelivery(setup):
    client, keys, q, inflight = setup
    raw = push(client, q, "t1")
    assert fetch(client, keys, [q], beat=True)[2] == b"ok"
    assert inflight.consumers() == [("c1", 1_000_000)] and inflight.tags("c1") == ["t1"]
    assert inflight.give_back("c1", cutoff_ms=2_000_000, forget=True) == 1
    assert client.llen(q) == 1 and inflight.tags("c1") == [] and inflight.consumers() == []
    assert json.loads(client.lindex(q, 0)) == {"x-dlq-redelivered": 1, **json.loads(raw)}   # any reader: valid JSON
    index, element, status, tag, _ = fetch(client, keys, [q], consumer="c2")
    assert (element, status, tag) == (raw, b"again", b"t1")          # the marker stripped: the bytes as published
    assert parse_value(client.hget(keys.inflight("c2"), "t1")) == (q, raw)


def test_a_consumer_that_beat_after_the_cutoff_keeps_its_messages(setup):
    client, keys, q, inflight = setup
    push(client, q, "t1")
    fetch(client, keys, [q], beat=True, now=5000.0)                    # beat at 5,000,000 ms
    assert inflight.give_back("c1", cutoff_ms=5_000_000, forget=True) == -1
    assert inflight.tags("c1") == ["t1"] and client.llen(q) == 0


def test_a_late_ack_settles_nothing_of_the_consumer_that_took_over(setup):
    """The frozen worker's ack is HDEL on its own hash: the other delivery stays recorded."""
    client, keys, q, inflight = setup
    push(client, q, "t1")
    fetch(client, keys, [q], beat=True)
    inflight.give_back("c1", cutoff_ms=2_000_000, forget=True)
    fetch(client, keys, [q], consumer="c2", beat=True)
    assert client.hdel(keys.inflight("c1"), "t1") == 0                 # c1 comes back and acknowledges
    assert inflight.tags("c2") == ["t1"]
    assert inflight.give_back("c1", ["t1"]) == 0 and client.llen(q) == 0   # nor can c1 give it back at close


def test_a_consumer_gives_back_its_own_tags_to_their_own_lists_left_or_right(setup):
    client, keys, q, inflight = setup
    high = f"{q}\x06\x169"
    push(client, high, "h")
    push(client, q, "a")
    fetch(client, keys, [q, high])
    fetch(client, keys, [q, high])
    client.lpush(q, b"waiting")
    assert inflight.give_back("c1", ["a"], left=True) == 1             # a requeue: behind what waits
    assert client.lrange(q, 0, -1)[1] == b"waiting"
    assert inflight.give_back("c1", ["h", "missing"]) == 1             # to its priority list, delivered next
    assert client.llen(high) == 1 and inflight.tags("c1") == []


def test_a_park_settles_its_message_in_flight_and_a_given_back_one_parks_nothing(setup):
    """park.lua takes the tag out of the consumer's own hash in the same step; a message given back meanwhile
    (its worker was silent past the lease) is another worker's now: parking it would fork its deliveries."""
    client, keys, q, inflight = setup
    store = ParkedStore(client, keys)
    push(client, q, "t1")
    push(client, q, "t2")
    fetch(client, keys, [q], beat=True)
    fetch(client, keys, [q])
    ack = ([keys.inflight("c1")], "t1")
    assert store.park("a:2", b"payload-a", q, due=1.0, ack=ack) and inflight.tags("c1") == ["t2"]
    inflight.give_back("c1", cutoff_ms=2_000_000, forget=True)
    assert not store.park("b:2", b"payload-b", q, due=1.0, ack=([keys.inflight("c1")], "t2"))
    assert store.count() == 1 and client.llen(q) == 1
    client.delete(*keys.store_keys(), keys.stats, keys.events, keys.metrics, keys.trends, keys.due_wake,
                 keys.due_wake_until)


def test_previous_runs_are_this_hosts_consumers_whose_process_is_gone():
    host, me = socket.gethostname(), process.consumer_id()
    dead = 2 ** 22 + 12345   # above the usual pid_max: no such process
    consumers = [(me, 1), (f"{host}:{dead}:ab", 1), (f"{host}:{os.getpid()}:old", 1), (f"{host}:1:ab", 1),
                 (f"other-host:{dead}:ab", 1), ("not an id", 1)]
    assert previous_runs(consumers, me) == [f"{host}:{dead}:ab", f"{host}:{os.getpid()}:old"]


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_the_sweeper_looks_when_the_oldest_beat_can_have_gone_stale_and_gives_back_then(setup, monkeypatch):
    client, keys, q, inflight = setup
    monkeypatch.setattr(process, "held", lambda: set())        # this test process holds nothing itself
    push(client, q, "t1")
    fetch(client, keys, [q], beat=True, now=1000.0)           # c1 beat at t = 1000 s, then died
    clock = Clock(1005.0)
    beats = Beats(inflight, lease=10.0, clock=clock)
    calls = []
    real = inflight.oldest
    monkeypatch.setattr(inflight, "oldest", lambda: calls.append(1) or real())
    assert beats.tick(holder=True) == 0 and len(calls) == 1    # a new sweeper looks at once: not stale yet
    clock.now = 1009.9
    assert beats.tick(holder=True) == 0 and len(calls) == 1    # nothing can be stale before 1010: no command
    clock.now = 1010.5
    assert beats.tick(holder=True) == 1 and client.llen(q) == 1
    assert inflight.consumers() == [] and len(calls) == 3
    clock.now = 1015.0
    assert beats.tick(holder=True) == 0 and len(calls) == 3    # empty: the next look is a lease later
    assert beats.tick(holder=False) == 0 and len(calls) == 3   # not the holder: never looks


def test_a_process_beats_only_while_it_holds_messages(setup, monkeypatch):
    client, keys, q, inflight = setup
    beats = Beats(inflight, lease=10.0, clock=Clock(2000.0))
    monkeypatch.setattr(process, "held", lambda: set())
    beats.tick(holder=False)
    assert inflight.consumers() == []                          # idle: no command at all
    monkeypatch.setattr(process, "held", lambda: {"t1"})
    beats.tick(holder=False)
    assert inflight.consumers() == [(process.consumer_id(), 2_000_000)]
    assert not process.beat_is_due(10.0)                        # a fetch now needs not write the beat
