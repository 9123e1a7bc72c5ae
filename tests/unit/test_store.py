"""ParkedStore and its Lua scripts, on fakeredis and on a real redis-server.

Time is never slept through: every call gets ``now=`` or a fake clock.
"""
from __future__ import annotations

import random
import uuid
from collections import Counter

import fakeredis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_dlq.errors import ConfigurationError
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.store import Claimed, ParkedStore

T0 = 1_700_000_000.0  # a fixed "now", in unix seconds


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_store(client, clock=None) -> ParkedStore:
    keys = Keys(prefix=f"test-{uuid.uuid4().hex[:8]}")
    return ParkedStore(client, keys, clock=clock or FakeClock())


def drop_keys(store: ParkedStore) -> None:
    store.client.delete(*store.keys.store_keys(), store.keys.stats)


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def store(any_redis, clock):
    s = make_store(any_redis, clock)
    yield s
    drop_keys(s)


def raw_state(store: ParkedStore) -> dict:
    """Everything the store holds, read straight from Redis."""
    c, k = store.client, store.keys
    return {
        "delayed": {m.decode(): int(s) for m, s in c.zrange(k.delayed, 0, -1, withscores=True)},
        "leases": {m.decode(): int(s) for m, s in c.zrange(k.leases, 0, -1, withscores=True)},
        "payloads": {f.decode(): v for f, v in c.hgetall(k.payloads).items()},
        "queues": {f.decode(): v.decode() for f, v in c.hgetall(k.queues).items()},
        "parked": {f.decode(): int(v) for f, v in c.hgetall(k.parked).items()},
    }


def assert_consistent(store: ParkedStore) -> dict:
    """Every entry is in exactly one of delayed/leases, and the counts match."""
    state = raw_state(store)
    delayed, leases = set(state["delayed"]), set(state["leases"])
    assert not delayed & leases
    assert delayed | leases == set(state["payloads"]) == set(state["queues"])
    assert state["parked"] == dict(Counter(state["queues"].values()))
    assert store.count() == len(delayed | leases)
    assert store.counts_by_queue() == state["parked"]
    return state


# -- park / claim / ack ---------------------------------------------------------

def test_park_claim_ack_round_trip(store):
    assert store.park("e1", b"\x00payload\xff", "default", due=T0 - 1)
    [claimed] = store.claim_due(now=T0, lease=30)
    assert claimed == Claimed("e1", b"\x00payload\xff", "default", int(T0 * 1000) + 30_000)
    assert claimed.lease_until == T0 + 30
    assert store.get("e1").leased
    assert store.ack(claimed) is True
    assert store.get("e1") is None
    assert store.count() == 0
    assert raw_state(store) == {"delayed": {}, "leases": {}, "payloads": {},
                                "queues": {}, "parked": {}}
    assert store.ack(claimed) is False


def test_park_many_parks_each_entry_once_in_one_pipeline(store):
    entries = [(f"e{i}", f"p{i}".encode(), "default", T0 - 1 + i) for i in range(3)]
    assert store.park_many(entries) == 3
    assert store.park_many(entries[:1]) == 0          # already parked: nothing changes, nothing counted
    assert store.count() == 3
    assert [c.entry_id for c in store.claim_due(now=T0 + 5, lease=30)] == ["e0", "e1", "e2"]
    assert_consistent(store)


def test_claim_respects_due_time_limit_and_order(store):
    for i, offset in enumerate([5, -3, 0, -10, 1, -1]):
        store.park(f"e{i}", b"p", "q", due=T0 + offset)
    # Due at or before now: e3 (-10), e1 (-3), e5 (-1), e2 (0); not e4, e0.
    first = store.claim_due(limit=3, now=T0)
    assert [c.entry_id for c in first] == ["e3", "e1", "e5"]
    assert [c.entry_id for c in store.claim_due(limit=3, now=T0)] == ["e2"]
    assert store.claim_due(now=T0) == []
    assert [c.entry_id for c in store.claim_due(now=T0 + 5)] == ["e4", "e0"]
    assert_consistent(store)


def test_claim_uses_the_clock_when_no_now_is_given(store, clock):
    store.park("e1", b"p", "q", due=T0 + 10)
    assert store.claim_due() == []
    clock.now = T0 + 10
    assert [c.entry_id for c in store.claim_due()] == ["e1"]


def test_claim_rejects_bad_arguments(store):
    with pytest.raises(ValueError):
        store.claim_due(limit=0)
    with pytest.raises(ValueError):
        store.claim_due(lease=0)


def test_park_is_idempotent_while_parked_or_leased(store):
    assert store.park("e1", b"first", "q1", due=T0) is True
    assert store.park("e1", b"second", "q2", due=T0 + 100) is False
    assert store.get("e1").payload == b"first"
    assert store.counts_by_queue() == {"q1": 1}
    [claimed] = store.claim_due(now=T0)
    assert store.park("e1", b"third", "q1", due=T0) is False
    assert store.counts_by_queue() == {"q1": 1}
    store.ack(claimed)
    assert store.park("e1", b"again", "q1", due=T0) is True  # a later retry of the same id
    assert_consistent(store)


# -- leases ----------------------------------------------------------------------

def test_expired_lease_becomes_due_again_and_is_reclaimed(store):
    store.park("e1", b"p", "q", due=T0)
    [first] = store.claim_due(now=T0, lease=30)
    assert store.claim_due(now=T0 + 29.999) == []
    [second] = store.claim_due(now=T0 + 30, lease=30)  # expiry <= now counts as expired
    assert second.entry_id == "e1"
    assert second.lease_until_ms == first.lease_until_ms + 30_000
    assert_consistent(store)


def test_expired_leases_are_restored_even_when_nothing_is_claimed_after(store):
    store.park("e1", b"p", "q", due=T0)
    store.claim_due(now=T0, lease=10)
    store.park("e2", b"p", "q", due=T0 + 5)
    # At T0+10, e2 (due T0+5) is older than the restored e1 (due now).
    assert [c.entry_id for c in store.claim_due(limit=1, now=T0 + 10)] == ["e2"]
    entry = store.get("e1")
    assert not entry.leased and entry.due == T0 + 10


def test_stale_ack_does_not_delete_another_movers_lease(store):
    store.park("e1", b"p", "q", due=T0)
    [stale] = store.claim_due(now=T0, lease=30)
    [fresh] = store.claim_due(now=T0 + 31, lease=30)
    assert store.ack(stale) is False
    state = assert_consistent(store)
    assert state["leases"] == {"e1": fresh.lease_until_ms}
    assert store.ack(fresh) is True
    assert store.count() == 0


def test_ack_many_deletes_a_batch_in_one_call_fences_each_entry_and_counts(store):
    for i in range(4):
        store.park(f"e{i}", b"p", "q" if i % 2 else "r", due=T0)
    batch = store.claim_due(limit=3, now=T0, lease=30)          # e0..e2, one lease
    [late] = store.claim_due(limit=1, now=T0 + 1, lease=30)     # e3, a later lease
    # e1's lease expires and another mover re-claims it: this batch no longer owns it.
    [_, stolen, _] = batch
    store.client.zadd(store.keys.leases, {"e1": stolen.lease_until_ms + 5})
    assert store.ack_many([*batch, late], "redelivered", 4) == 3
    state = assert_consistent(store)
    assert state["leases"] == {"e1": stolen.lease_until_ms + 5}
    assert int(store.client.hget(store.keys.stats, "redelivered")) == 4
    assert store.ack_many([], "redelivered", 0) == 0
    assert int(store.client.hget(store.keys.stats, "redelivered")) == 4


def test_release_parks_the_entry_again(store, clock):
    store.park("e1", b"p", "q", due=T0)
    [claimed] = store.claim_due(now=T0)
    assert store.release(claimed, due=T0 + 60) is True
    entry = store.get("e1")
    assert (entry.due, entry.leased) == (T0 + 60, False)
    assert store.release(claimed) is False  # the lease is gone now
    assert store.claim_due(now=T0 + 59) == []
    [again] = store.claim_due(now=T0 + 60)
    clock.now = T0 + 61
    assert store.release(again) is True  # default: due now
    assert store.get("e1").due == T0 + 61
    assert_consistent(store)


def test_release_after_lease_was_taken_over_returns_false(store):
    store.park("e1", b"p", "q", due=T0)
    [stale] = store.claim_due(now=T0, lease=1)
    [fresh] = store.claim_due(now=T0 + 1, lease=30)
    assert store.release(stale) is False
    assert store.get("e1").lease_until == fresh.lease_until


def test_claim_deletes_an_entry_whose_payload_is_gone(store):
    store.park("e1", b"p", "q", due=T0)
    store.park("e2", b"p", "q", due=T0)
    store.client.hdel(store.keys.payloads, "e1")  # damage from outside
    assert [c.entry_id for c in store.claim_due(now=T0)] == ["e2"]
    assert store.counts_by_queue() == {"q": 1}
    assert_consistent(store)


# -- operator actions ----------------------------------------------------------

def test_remove_parked_leased_and_unknown(store):
    store.park("parked", b"p", "q", due=T0 + 100)
    store.park("leased", b"p", "q", due=T0)
    [claimed] = store.claim_due(now=T0)
    assert store.remove("parked") is True
    assert store.remove("leased") is True
    assert store.remove("leased") is False
    assert store.remove("never") is False
    assert store.ack(claimed) is False
    assert assert_consistent(store)["parked"] == {}


def test_redeliver_now_one(store):
    store.park("later", b"p", "q", due=T0 + 3600)
    store.park("past", b"p", "q", due=T0 - 10)
    assert store.redeliver_now("later", now=T0) == 1
    assert store.get("later").due == T0
    assert store.redeliver_now("past", now=T0) == 1
    assert store.get("past").due == T0 - 10  # keeps its place in line
    assert store.redeliver_now("unknown", now=T0) == 0
    assert [c.entry_id for c in store.claim_due(now=T0)] == ["past", "later"]
    assert store.redeliver_now("later", now=T0) == 0  # leased: already moving


def test_redeliver_now_all(store, clock, monkeypatch):
    monkeypatch.setattr("celery_dlq.storage.store.REDELIVER_BATCH", 4)
    for i in range(10):
        store.park(f"e{i}", b"p", "q", due=T0 + 100 + i)
    store.park("due", b"p", "q", due=T0 - 1)
    assert store.redeliver_now() == 10  # in three batches of at most 4
    assert len(store.claim_due(now=T0)) == 11
    assert store.redeliver_now() == 0


def test_get_shapes(store):
    assert store.get("nope") is None
    store.park("e1", b"p1", "q1", due=T0 + 5)
    entry = store.get("e1")
    assert (entry.entry_id, entry.payload, entry.queue) == ("e1", b"p1", "q1")
    assert (entry.due, entry.lease_until, entry.leased) == (T0 + 5, None, False)
    store.claim_due(now=T0 + 5, lease=10)
    entry = store.get("e1")
    assert (entry.due, entry.lease_until, entry.leased) == (None, T0 + 15, True)


def test_counts_by_queue_across_operations(store):
    assert store.counts_by_queue() == {}
    for i in range(3):
        store.park(f"a{i}", b"p", "qa", due=T0)
    store.park("b0", b"p", "qb", due=T0 + 100)
    assert store.counts_by_queue() == {"qa": 3, "qb": 1}
    claimed = store.claim_due(now=T0)
    assert store.counts_by_queue() == {"qa": 3, "qb": 1}  # leased still counts
    store.ack(claimed[0])
    assert store.counts_by_queue() == {"qa": 2, "qb": 1}
    store.remove("b0")
    assert store.counts_by_queue() == {"qa": 2}
    for c in claimed[1:]:
        store.ack(c)
    assert store.counts_by_queue() == {}
    assert_consistent(store)


def test_next_due(store):
    assert store.next_due() is None
    store.park("e1", b"p", "q", due=T0 + 50)
    store.park("e2", b"p", "q", due=T0 + 20.5)
    assert store.next_due() == T0 + 20.5
    store.claim_due(now=T0 + 21, lease=10)  # e2 leased until T0 + 31
    assert store.next_due() == T0 + 31
    store.claim_due(now=T0 + 50, lease=100)
    assert store.next_due() == T0 + 150


def test_next_due_counts_another_movers_claims_as_ending_within_the_recheck(store):
    """A claim an earlier release's mover holds may come back early without a wake marker: the holder looks again."""
    store.park("e1", b"p", "q", due=T0 + 50)
    store.park("e2", b"p", "q", due=T0 + 20)
    store.claim_due(now=T0 + 21, lease=30)      # e2 leased until T0 + 51
    now = store.clock()
    assert store.next_due(claims_recheck=0.2) == now + 0.2
    assert store.next_due() == T0 + 50
    store.claim_due(now=T0 + 60, lease=30)      # e1 claimed too; nothing waits
    assert store.next_due(claims_recheck=0.2) == now + 0.2


# -- iteration -----------------------------------------------------------------

def test_entries_iterates_over_more_than_a_batch_in_order(store):
    expected = {}
    for i in range(23):
        entry_id, due = f"e{i:02d}", T0 + (i // 4)  # groups of four share a due time
        store.park(entry_id, b"p%d" % i, "qb" if i % 3 == 0 else "qa", due=due)
        expected[entry_id] = due
    store.claim_due(limit=2, now=T0, lease=4.5)  # e00, e01 leased until T0 + 4.5
    expected.update(e00=T0 + 4.5, e01=T0 + 4.5)
    in_order = [entry_id for _, entry_id in sorted((t, i) for i, t in expected.items())]

    got = list(store.entries(batch=3))
    assert [e.entry_id for e in got] == in_order
    assert [e.next_time for e in got] == sorted(expected.values())
    assert [e.entry_id for e in got if e.leased] == ["e00", "e01"]
    assert got[5].payload == b"p%d" % int(got[5].entry_id[1:])

    only_b = [e.entry_id for e in store.entries(queue="qb", batch=2)]
    assert only_b == [i for i in in_order if int(i[1:]) % 3 == 0]


def test_entries_batch_of_identical_due_times(store):
    for i in range(12):
        store.park(f"e{i:02d}", b"p", "q", due=T0)
    assert [e.entry_id for e in store.entries(batch=5)] == [f"e{i:02d}" for i in range(12)]
    with pytest.raises(ValueError):
        list(store.entries(batch=0))


def test_entries_on_empty_store(store):
    assert list(store.entries()) == []


# -- construction ----------------------------------------------------------------

def test_client_that_decodes_responses_is_rejected():
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=True)
    with pytest.raises(ConfigurationError, match="decode_responses"):
        ParkedStore(client, Keys())


# -- concurrency (real server) -------------------------------------------------


# -- random interleavings against a model --------------------------------------

#: Operation name -> integer ranges of its arguments (entry ids e0..e7, queues
#: q0..q2, offsets and leases in seconds; redeliver -1 means "all").
OP_ARGS = {
    "park": [(0, 7), (0, 2), (-3, 5)],     # entry, queue, due offset
    "claim": [(1, 4), (1, 4)],             # limit, lease
    "ack": [(0, 20)],                      # which held claim
    "release": [(0, 20), (0, 3)],          # which held claim, due offset
    "advance": [(0, 3)],                   # seconds
    "remove": [(0, 7)],                    # entry
    "redeliver": [(-1, 7)],                # entry, or -1 for all
}
OPS = st.one_of(*(st.tuples(st.just(name), *(st.integers(lo, hi) for lo, hi in ranges))
                  for name, ranges in OP_ARGS.items()))


class Model:
    """What the store should hold: id -> (state, score ms, queue)."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[str, int, str]] = {}

    def claim(self, now_ms: int, lease_until_ms: int, limit: int) -> list[str]:
        def oldest(state, bound):
            return sorted((score, i) for i, (s, score, _) in self.entries.items()
                          if s == state and score <= bound)[:limit]

        for _, i in oldest("leased", now_ms):
            self.entries[i] = ("delayed", now_ms, self.entries[i][2])
        ids = [i for _, i in oldest("delayed", now_ms)]
        for i in ids:
            self.entries[i] = ("leased", lease_until_ms, self.entries[i][2])
        return ids

    def holds_lease(self, claimed: Claimed) -> bool:
        state = self.entries.get(claimed.entry_id)
        return state is not None and state[:2] == ("leased", claimed.lease_until_ms)


def apply(op, store: ParkedStore, model: Model, held: list[Claimed], now: list[int]):
    name, *args = op
    if name == "park":
        entry_id, queue, due_ms = f"e{args[0]}", f"q{args[1]}", now[0] + args[2] * 1000
        expected = entry_id not in model.entries
        assert store.park(entry_id, b"p-" + entry_id.encode(), queue, due_ms / 1000) is expected
        if expected:
            model.entries[entry_id] = ("delayed", due_ms, queue)
    elif name == "claim":
        got = store.claim_due(limit=args[0], lease=args[1], now=now[0] / 1000)
        expected = model.claim(now[0], now[0] + args[1] * 1000, args[0])
        assert [c.entry_id for c in got] == expected
        assert all(c.payload == b"p-" + c.entry_id.encode() for c in got)
        held.extend(got)
    elif name in ("ack", "release") and held:
        claimed = held.pop(args[0] % len(held))
        expected = model.holds_lease(claimed)
        if name == "ack":
            assert store.ack(claimed) is expected
            if expected:
                del model.entries[claimed.entry_id]
        else:
            due_ms = now[0] + args[1] * 1000
            assert store.release(claimed, due=due_ms / 1000) is expected
            if expected:
                queue = model.entries[claimed.entry_id][2]
                model.entries[claimed.entry_id] = ("delayed", due_ms, queue)
    elif name == "advance":
        now[0] += args[0] * 1000
    elif name == "remove":
        entry_id = f"e{args[0]}"
        assert store.remove(entry_id) is (model.entries.pop(entry_id, None) is not None)
    elif name == "redeliver":
        apply_redeliver(args[0], store, model, now[0])


def apply_redeliver(index: int, store: ParkedStore, model: Model, now_ms: int) -> None:
    index = None if index < 0 else index
    later = {i for i, (s, score, _) in model.entries.items()
             if s == "delayed" and (index is None or i == f"e{index}")}
    if index is None:
        later = {i for i in later if model.entries[i][1] > now_ms}
        assert store.redeliver_now(now=now_ms / 1000) == len(later)
    else:
        assert store.redeliver_now(f"e{index}", now=now_ms / 1000) == len(later)
    for i in later:
        _, score, queue = model.entries[i]
        model.entries[i] = ("delayed", min(score, now_ms), queue)


def check_against_model(store: ParkedStore, model: Model) -> None:
    state = assert_consistent(store)
    assert state["delayed"] == {i: sc for i, (s, sc, _) in model.entries.items()
                                if s == "delayed"}
    assert state["leases"] == {i: sc for i, (s, sc, _) in model.entries.items()
                               if s == "leased"}
    assert state["queues"] == {i: q for i, (_, _, q) in model.entries.items()}


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(OPS, min_size=5, max_size=60))
def test_random_interleavings_keep_the_invariants(any_redis, ops):
    store = make_store(any_redis)
    model, held, now = Model(), [], [int(T0 * 1000)]
    try:
        for op in ops:
            apply(op, store, model, held, now)
            check_against_model(store, model)
    finally:
        drop_keys(store)


def random_op(rng: random.Random) -> tuple:
    """One operation from OP_ARGS, weighted towards contention."""
    name = rng.choices(list(OP_ARGS), weights=[6, 5, 5, 2, 4, 1, 1])[0]
    return (name, *(rng.randint(lo, hi) for lo, hi in OP_ARGS[name]))


@pytest.mark.parametrize("seed", range(5))
def test_long_seeded_interleavings_match_the_model(any_redis, seed):
    """Long runs reach states short hypothesis examples rarely do (stale acks)."""
    rng = random.Random(seed)
    store = make_store(any_redis)
    model, held, now = Model(), [], [int(T0 * 1000)]
    try:
        for _ in range(400):
            apply(random_op(rng), store, model, held, now)
            check_against_model(store, model)
    finally:
        drop_keys(store)


def test_park_appends_its_event_to_the_capped_archive_once(store):
    event = {"v": "1", "type": "parked", "task_id": "t1", "delivery": "1"}
    assert store.park("t1:2", b"p", "q", due=T0, event=event, events_max_length=1000)
    assert not store.park("t1:2", b"p", "q", due=T0, event=event, events_max_length=1000)  # duplicate
    [(_, fields)] = store.client.xrange(store.keys.events)
    assert {k.decode(): v.decode() for k, v in fields.items()} == event
    assert store.park("t2:2", b"p", "q", due=T0, event=event, events_max_length=0)  # archive off
    assert store.client.xlen(store.keys.events) == 1
    store.client.delete(store.keys.events)
