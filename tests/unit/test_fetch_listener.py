"""The fetch's wake markers and the listener's pieces: one message marks its queue once, an empty fetch
clears its markers and says whether a listener hears it; the tracking check is pure."""
from __future__ import annotations

import json

import pytest

from celery_dlq.storage.keys import Keys, QueueLists
from celery_dlq.storage.listening import Tracking
from celery_dlq.worker.fetch.listener import Coalescer, FetchListener, tracking_on
from tests.unit.test_fetch import celery_message, fetch


def test_a_signal_marks_only_queues_holding_a_message_and_a_marker_holds_one_member(any_redis, unique):
    keys, q, r = Keys(f"s{unique}"), f"q{unique}", f"r{unique}"
    listener = FetchListener(lambda: any_redis, keys, QueueLists())
    listener.watched = {q: keys.fetch_marker(q), f"{q}\x06\x163": keys.fetch_marker(q), r: keys.fetch_marker(r)}
    any_redis.lpush(f"{q}\x06\x163", "x")   # a priority sub-list of q
    try:
        listener._signal(Tracking(any_redis, keys, own_connection=False), set(listener.watched))
        listener._signal(Tracking(any_redis, keys, own_connection=False), {q, f"{q}\x06\x163"})
        assert any_redis.zrange(keys.fetch_marker(q), 0, -1) == [b"m"]   # written twice: still one member
        assert not any_redis.exists(keys.fetch_marker(r)) and listener.signalled == 2
    finally:
        any_redis.delete(f"{q}\x06\x163", keys.fetch_marker(q))


def test_only_invalidations_of_watched_lists_count_and_a_flush_counts_them_all():
    keys = Keys("w")
    listener = FetchListener(lambda: None, keys, QueueLists())
    listener.watched = {"q": keys.fetch_marker("q"), "q\x06\x163": keys.fetch_marker("q")}
    message = {"type": "message", "channel": b"__redis__:invalidate", "data": [b"q", b"celery-task-meta-1"]}
    assert listener._written(message) == {"q"}
    assert listener._written({**message, "data": None}) == {"q", "q\x06\x163"}
    assert listener._written({"type": "subscribe", "channel": b"__redis__:invalidate", "data": 1}) == set()
    registered = {"type": "message", "channel": keys.fetch_queues.encode(), "data": b"new"}
    assert listener._registered(registered) and listener._written(registered) == set()


def test_an_empty_fetch_clears_its_markers_registers_its_queues_and_waits_on_them_only_when_heard(any_redis, unique):
    keys, q, r = Keys(f"e{unique}"), f"q{unique}", f"r{unique}"
    lists = [q, r, f"{q}\x06\x163", f"{r}\x06\x163"]
    any_redis.zadd(keys.fetch_marker(q), {"m": 0})                     # stale: written for a message taken since
    try:
        pubsub = any_redis.pubsub()
        pubsub.subscribe(keys.fetch_queues)
        assert pubsub.get_message(timeout=1)["type"] == "subscribe"
        assert fetch(any_redis, keys, lists, now=1000.0, queues=(q, r)) is None   # no listener hears them
        assert not any_redis.exists(keys.fetch_marker(q))
        assert any_redis.zrange(keys.fetch_queues, 0, -1, withscores=True) == [(q.encode(), 1e6), (r.encode(), 1e6)]
        assert pubsub.get_message(timeout=1)["data"] == b"new"           # the listener hears of them at once
        any_redis.sadd(keys.fetch_listening, q)
        assert fetch(any_redis, keys, lists, now=2000.0, queues=(q, r)) is None   # one of its queues is not heard
        assert pubsub.get_message(timeout=0.2) is None                    # known already: no news
        any_redis.sadd(keys.fetch_listening, r)
        assert fetch(any_redis, keys, lists, now=3000.0, queues=(q, r)) == 0      # both heard: block on the markers
        assert any_redis.zscore(keys.fetch_queues, q) == 2e6               # registered again only when asked:
        assert fetch(any_redis, keys, lists, now=4000.0, queues=(q, r), register=True) == 0
        assert any_redis.zscore(keys.fetch_queues, q) == 4e6
        assert fetch(any_redis, keys, lists) is None                      # no markers (dlq_fetch_listener off)
        pubsub.close()
    finally:
        any_redis.delete(keys.fetch_queues, keys.fetch_listening)


def test_a_fetch_that_takes_a_message_leaves_the_markers_alone(any_redis, unique):
    keys, q = Keys(f"t{unique}"), f"q{unique}"
    any_redis.lpush(q, json.dumps(celery_message(tag=f"t-{unique}")))
    any_redis.lpush(q, json.dumps(celery_message(tag=f"u-{unique}")))
    any_redis.zadd(keys.fetch_marker(q), {"m": 0})
    try:
        assert fetch(any_redis, keys, [q], queues=(q,))[2] == b"ok"
        assert any_redis.zcard(keys.fetch_marker(q)) == 1                 # another message is left
    finally:
        any_redis.delete(q, keys.fetch_marker(q), keys.inflight("c1"))


def test_tracking_is_on_only_per_key_to_our_redirect():
    info = [b"flags", [b"on", b"noloop"], b"redirect", 7, b"prefixes", []]
    assert tracking_on(info, 7)
    assert not tracking_on(info, 8)
    assert not tracking_on([b"flags", [b"off"], b"redirect", -1, b"prefixes", []], 7)
    assert not tracking_on([b"flags", [b"on", b"broken_redirect"], b"redirect", 7], 7)
    assert not tracking_on([b"flags", [b"on", b"bcast"], b"redirect", 7], 7)   # an older listener's mode


def test_every_push_is_marked_at_once_and_the_pop_a_marking_wakes_is_looked_at_when_its_window_ends():
    c = Coalescer(0.05)
    assert c.heard({"q"}, 1.000) == {"q"}                   # a push: marked at once
    assert c.heard({"q"}, 1.002) == set()                   # the woken worker's pop: looked at later
    assert c.next_at(9.0) == pytest.approx(1.050)
    assert c.heard({"q", "r"}, 1.005) == {"q", "r"}         # another push to q, and one to r: at once
    assert c.heard({"q"}, 1.007) == set()                   # its pop
    assert c.due(1.049) == set() and c.due(1.050) == {"q"}  # one look for both pops
    assert c.next_at(9.0) == 9.0
    assert c.heard({"q"}, 1.200) == {"q"}                   # after the window: whatever it is, at once
    assert c.heard({"q"}, 1.300) == {"q"}                   # a slow worker's pop after the window is looked
    assert c.due(2.0) == set()                              # at at once too (and not marked: next test)


def test_a_write_heard_to_a_list_empty_again_marks_nothing_so_no_worker_wakes_for_nothing(any_redis, unique):
    keys, q, r = Keys(f"s{unique}"), f"q{unique}", f"r{unique}"
    listener = FetchListener(lambda: any_redis, keys, QueueLists())
    listener.watched = {q: keys.fetch_marker(q), r: keys.fetch_marker(r)}
    any_redis.lpush(r, "x")
    try:
        # q's write was a pop (or a push another fetch took): left unmarked, so no pop is waited for
        assert listener._mark(Tracking(any_redis, keys, own_connection=False), {q, r}) == {q}
        assert not any_redis.exists(keys.fetch_marker(q)) and any_redis.zrange(keys.fetch_marker(r), 0, -1) == [b"m"]
        assert listener.signalled == 1
    finally:
        any_redis.delete(r, keys.fetch_marker(r))


def test_an_idle_wait_is_jittered_below_kombus_health_check_and_short_while_a_channel_settles():
    from celery_dlq.worker.fetch.transport import MARKER_WAIT, SETTLE, marker_wait
    assert marker_wait(None, SETTLE + 1, 1.0, rng=lambda: 1.0) == MARKER_WAIT      # no health check (kombu < 5.7)
    assert marker_wait(None, SETTLE + 1, 1.0, rng=lambda: 0.0) == MARKER_WAIT / 2
    assert marker_wait(26.0, SETTLE + 1, 1.0, rng=lambda: 1.0) == MARKER_WAIT      # kombu's 26 s: room enough
    assert marker_wait(4.0, SETTLE + 1, 1.0, rng=lambda: 1.0) == 3.0               # health_check_interval = 3
    assert marker_wait(26.0, 5.0, 1.0, rng=lambda: 1.0) == 1.0                     # a channel 5 s old


def test_a_push_an_open_breaker_holds_is_kept_and_wakes_no_worker(any_redis, unique):
    keys, q = Keys(f"s{unique}"), f"q{unique}"
    listener = FetchListener(lambda: any_redis, keys, QueueLists(), clock=lambda: 1000.0, holds=True)
    listener.watched = {q: keys.fetch_marker(q)}
    held = json.dumps({"headers": {"task": "proj.pay", "id": "a"}, "properties": {}})
    other = json.dumps({"headers": {"task": "proj.ok", "id": "b"}, "properties": {}})
    any_redis.hset(keys.breaker_holds, f"{q}\x1fproj.pay", 2_000_000)
    any_redis.lpush(q, held)
    tracker = Tracking(any_redis, keys, own_connection=False)
    assert listener._mark(tracker, {q}) == {q}           # a push heard: the held one is kept, nothing marked
    assert not any_redis.exists(keys.fetch_marker(q)) and any_redis.llen(q) == 0
    assert any_redis.zrange(keys.breaker_held_raw, 0, -1) == [f"{q}\x1fproj.pay\x1f{held}".encode()]
    any_redis.lpush(q, held.replace('"a"', '"c"'), other)  # oldest first: a held one, then another task's
    assert listener._mark(tracker, {q}) == set()
    assert any_redis.zrange(keys.fetch_marker(q), 0, -1) == [b"m"] and any_redis.lrange(q, 0, -1) == [other.encode()]
    assert any_redis.zcard(keys.breaker_held_raw) == 2


def test_a_push_kept_by_a_breaker_is_not_taken_for_a_wake_so_the_next_push_is_marked_at_once():
    coalescer = Coalescer(0.005)
    assert coalescer.heard({"q"}, 1.0) == {"q"}      # a held push: marked at once, but the script kept it
    coalescer.unmark({"q"})
    assert coalescer.heard({"q"}, 1.001) == {"q"}    # the next push is not presumed a woken worker's pop
    assert coalescer.heard({"q"}, 1.002) == set()    # that one did wake a worker: its pop waits for the window
