"""The circuit breaker's state machine (pure) and its Redis side (fakeredis), with a fake clock."""
from __future__ import annotations

import math
from dataclasses import replace
from uuid import uuid4

import pytest

from celery_dlq.policy import RedeliveryPolicy
from celery_dlq.storage import breaker_state as B
from celery_dlq.storage.breaker_state import BreakerState, Thresholds
from celery_dlq.storage.breakers import Breakers, summaries_for
from celery_dlq.storage.keys import Keys

T = Thresholds(window=60.0, min_failures=3, ratio=0.5, cooldown=10.0, multiplier=2.0, max_cooldown=30.0)
FAIL = {"type": "ConnectionError", "message": "gateway down"}


def fresh(now: float = 0.0) -> BreakerState:
    return BreakerState("orders", "pay", "g1", window_start=now)


def failing(n: int, now: float = 1.0, s: BreakerState | None = None, successes: int = 0) -> BreakerState:
    s = s or fresh()
    for _ in range(n):
        s = B.record_failure(s, now, T, successes=successes)
    return s


def test_a_group_opens_at_its_threshold_count_and_not_before():
    assert failing(2).state == B.CLOSED
    opened = failing(3, now=5.0)
    assert (opened.state, opened.opened_at, opened.cooldown, opened.opens) == (B.OPEN, 5.0, 10.0, 1)
    assert opened.probe_due == 15.0


def test_successes_in_the_window_keep_it_closed_below_the_ratio():
    s = B.record_failure(fresh(), 1.0, T, successes=10)
    s = failing(5, s=s)
    assert s.state == B.CLOSED and (s.failures, s.successes) == (6, 10)   # 6 of 16 < 50 %
    assert failing(4, s=s).state == B.OPEN                                    # 10 of 20


def test_the_window_forgets_old_failures():
    s = failing(2, now=1.0)
    s = B.record_failure(s, 61.0, T)
    assert (s.state, s.failures, s.window_start) == (B.CLOSED, 1, 61.0)


def test_one_probe_after_the_cooldown_then_success_closes():
    opened = failing(3, now=0.0)
    assert B.claim_probe(opened, 9.9, "t1") is None
    probing = B.claim_probe(opened, 10.0, "t1")
    assert probing is not None and (probing.state, probing.probe_id) == (B.HALF_OPEN, "t1")
    assert B.claim_probe(probing, 11.0, "t2") is None                  # one probe at a time
    assert B.record_success(probing, 12.0, "t2") == probing            # not the probe: nothing
    closed = B.record_success(probing, 12.0, "t1")
    assert (closed.state, closed.failures, closed.cooldown, closed.opens) == (B.CLOSED, 0, 0.0, 0)


def test_a_failed_probe_reopens_with_a_growing_capped_cooldown():
    s = failing(3, now=0.0)
    cooldowns = []
    now = 0.0
    for i in range(4):
        now = s.probe_due
        s = B.claim_probe(s, now, f"p{i}")
        s = B.record_failure(s, now + 1, T, task_id=f"p{i}")
        assert s.state == B.OPEN
        cooldowns.append(s.cooldown)
    assert cooldowns == [20.0, 30.0, 30.0, 30.0]


def test_a_lost_probe_lets_another_probe_after_the_timeout():
    probing = B.claim_probe(failing(3, now=0.0), 10.0, "t1")
    assert probing is not None
    assert B.claim_probe(probing, 10.0 + B.PROBE_TIMEOUT - 1, "t2") is None
    again = B.claim_probe(probing, 10.0 + B.PROBE_TIMEOUT, "t2")
    assert again is not None and again.probe_id == "t2"


def test_a_pause_holds_without_probing_until_resumed():
    paused = B.pause(fresh(), 5.0, "alice")
    assert (paused.state, paused.paused_by) == (B.OPEN, "alice") and paused.holds
    assert B.claim_probe(paused, 1e9, "t1") is None
    assert B.record_failure(paused, 6.0, T).state == B.OPEN
    assert B.close(paused, 7.0).state == B.CLOSED


def test_the_first_held_delivery_comes_back_to_probe_the_rest_wait():
    opened = failing(3, now=0.0)
    assert B.hold_until(opened, 2.0, 0, T) == 10.0
    assert B.hold_until(opened, 2.0, 1, T) == 2.0 + T.max_cooldown


def test_release_offsets_start_slow_and_rise_to_the_cap():
    offsets = B.release_offsets(400, rate=10.0, max_rate=100.0)
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    first_second = sum(1 for o in offsets if o < 1.0)
    second_second = sum(1 for o in offsets if 1.0 <= o < 2.0)
    assert 10 <= first_second <= 16 and second_second > first_second
    tail = offsets[-101:]
    assert tail[-1] - tail[0] == pytest.approx(1.0)        # the cap: 100 per second
    assert B.release_offsets(0, 1.0, 1.0) == []


def test_released_by_is_the_count_release_offsets_reached():
    offsets = B.release_offsets(2000, rate=10.0, max_rate=500.0)
    for t in (0.5, 1.0, 3.0, 5.6, 6.0):
        assert B.released_by(t, 10.0, 500.0) == pytest.approx(sum(1 for o in offsets if o <= t), abs=1.01)
    assert B.released_by(0.0, 10.0, 500.0) == 0.0


def test_the_fetch_holds_from_the_first_held_delivery_until_the_probe_and_while_paused():
    opened = failing(3, now=0.0)
    assert B.fetch_holds_until(opened) is None                      # the first held one goes to a worker
    assert B.fetch_holds_until(replace(opened, held=1)) == 10.0      # then the fetch holds, until the probe
    half = B.claim_probe(replace(opened, held=1), 10.0, "p")
    assert B.fetch_holds_until(half) == 10.0 + B.PROBE_TIMEOUT     # while the probe runs (or is lost)
    assert B.fetch_holds_until(B.record_success(half, 11.0, "p")) is None
    assert B.fetch_holds_until(B.pause(fresh(), 1.0, "bob")) == math.inf


def test_the_state_survives_its_hash():
    s = B.claim_probe(failing(3, now=0.5), 10.5, "t1")
    assert s is not None
    assert BreakerState.from_hash({k.encode(): v.encode() for k, v in s.as_hash().items()}) == s
    assert BreakerState.from_hash({}) is None
    assert BreakerState.from_hash({**s.as_hash(), "opened_at": "soon"}) is None


def test_policy_fields_validate():
    p = RedeliveryPolicy(breaker={"enabled": True, "min_failures": 5, "failure_ratio": 0.2, "window": 30,
                                  "cooldown": 3, "cooldown_multiplier": 1.5, "max_cooldown": 9})
    assert Thresholds.of(p) == Thresholds(window=30.0, min_failures=5, ratio=0.2, cooldown=3.0, multiplier=1.5,
                                          max_cooldown=9.0)
    assert p.breaker.opens_on_failures
    assert not RedeliveryPolicy(breaker="manual").breaker.opens_on_failures
    for bad, name in (({"breaker": "yes"}, "breaker"), ({"breaker": {"failure_ratio": 0.0}}, "breaker.failure_ratio"),
                      ({"breaker": {"min_failures": 0}}, "breaker.min_failures"),
                      ({"breaker": {"cooldown": 0}}, "breaker.cooldown"), ({"max_snoozes": 0}, "max_snoozes")):
        with pytest.raises(ValueError, match=name):
            RedeliveryPolicy(**bad)


def test_snooze_bounds():
    p = RedeliveryPolicy(max_snoozes=2, max_snooze_time=100.0)
    assert p.snooze_left(1, 50.0, 50.0)
    assert not p.snooze_left(2, 0.0, 1.0) and not p.snooze_left(0, 60.0, 41.0)
    assert RedeliveryPolicy(max_snoozes=-1).snooze_left(10**6, 0.0, 1.0)


# -- in Redis -------------------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def breakers(any_redis):
    clock = Clock()
    return Breakers(any_redis, Keys(f"t{uuid4().hex}"), clock), clock   # its own keys on a real server


def test_failures_open_one_breaker_and_the_index_says_so(breakers):
    store, clock = breakers
    changes = [store.record_failure("orders", "pay", "g1", FAIL, T, task_id=f"t{i}") for i in range(3)]
    assert [c.changed for c in changes] == [False, False, True]   # created closed, then opened
    assert store.get("orders", "g1").state == B.OPEN
    (summary,) = store.index()
    assert (summary.task, summary.state, summary.probe_due) == ("pay", B.OPEN, 1010.0)
    assert summaries_for(store.index(), "orders", "pay") == [summary]
    assert summaries_for(store.index(), "other", "pay") == []
    assert summaries_for(store.index(), "orders", "refund") == []


def test_one_probe_wins_and_its_success_closes_and_releases(breakers, any_redis):
    store, clock = breakers
    for _i in range(3):
        store.record_failure("orders", "pay", "g1", FAIL, T)
    assert store.hold("orders", "g1", "a:1", T) == 1010.0           # the first held comes back to probe
    assert store.hold("orders", "g1", "b:1", T) == 1000.0 + T.max_cooldown
    assert store.held_count("orders", "g1") == 2
    assert store.claim_probe("orders", "g1", "a").after.state == B.OPEN
    clock.now = 1010.0
    assert store.claim_probe("orders", "g1", "a").after.probe_id == "a"
    assert store.claim_probe("orders", "g1", "b").after.probe_id == "a"
    assert store.record_success("orders", "g1", "a").after.state == B.CLOSED
    assert store.index()[0].state == B.CLOSED


def test_pause_and_resume_of_a_whole_task(breakers):
    store, _ = breakers
    change = store.pause(B.ANY_QUEUE, "pay", B.whole_task("pay"), "bob")
    assert change.changed and change.after.paused_by == "bob"
    assert [s.group for s in summaries_for(store.index(), "anywhere", "pay")] == [B.whole_task("pay")]
    assert store.resume(B.ANY_QUEUE, B.whole_task("pay")).after.state == B.CLOSED
    assert not store.resume(B.ANY_QUEUE, B.whole_task("pay")).changed   # closed already
    assert summaries_for(store.index(), "anywhere", "pay") == []
    assert store.forget(B.ANY_QUEUE, B.whole_task("pay")) and store.index() == []


def test_the_fetch_is_told_to_hold_after_the_first_hold_and_stops_at_the_close(breakers, any_redis):
    store, clock = breakers
    keys = store.keys
    for _ in range(3):
        store.record_failure("orders", "pay", "g1", FAIL, T)
    assert not store.holding_in_fetch("orders", "pay")              # open, nothing held yet
    store.hold("orders", "g1", "a:1", T)
    assert any_redis.hget(keys.breaker_holds, "orders\x1fpay") == b"1010000" and store.holding_in_fetch("orders", "pay")
    clock.now = 1010.0
    store.claim_probe("orders", "g1", "a")
    assert any_redis.hget(keys.breaker_holds, "orders\x1fpay") == str(int((1010.0 + B.PROBE_TIMEOUT) * 1000)).encode()
    store.record_success("orders", "g1", "a")
    assert not store.holding_in_fetch("orders", "pay")
    store.pause(B.ANY_QUEUE, "pay", B.whole_task("pay"), "bob")
    assert store.holding_in_fetch("elsewhere", "pay") and any_redis.hget(keys.breaker_holds, "*\x1fpay") == b"9e15"
    assert store.forget(B.ANY_QUEUE, B.whole_task("pay")) and not store.holding_in_fetch("elsewhere", "pay")


def test_what_the_fetch_held_is_counted_and_pushed_back_once(breakers, any_redis):
    store, _ = breakers
    raw = store.keys.breaker_held_raw
    any_redis.zadd(raw, {f"orders\x1fpay\x1f{{\"n\": {i}}}": 0 for i in range(5)})
    any_redis.zadd(raw, {"orders\x1fpayout\x1f{}": 0, "other\x1fpay\x1f{}": 0})
    assert store.held_in_fetch() == {("orders", "pay"): 5, ("orders", "payout"): 1, ("other", "pay"): 1}
    assert store.held_in_fetch("orders", "pay") == {("orders", "pay"): 5}
    assert store.held_in_fetch(None, "pay") == {("orders", "pay"): 5, ("other", "pay"): 1}
    target = f"{store.keys.base}:orders\x06\x169"
    assert store.release_held("orders", "pay", target, 3) == 3
    assert store.release_held("orders", "pay", target) == 2 and store.release_held("orders", "pay", target) == 0
    assert sorted(any_redis.lrange(target, 0, -1)) == [f'{{"n": {i}}}'.encode() for i in range(5)]
    assert store.held_in_fetch() == {("orders", "payout"): 1, ("other", "pay"): 1}   # the others untouched
