"""The direct parked format: kombu's own element, parked and moved back inside Redis (move_due.lua)."""
from __future__ import annotations

import json
from collections import Counter

import pytest
from celery import Celery
from kombu.transport.virtual import Message

import celery_dlq
from celery_dlq import headers as H
from celery_dlq.element import SOURCE_TAG_PROPERTY, envelope_error
from celery_dlq.message import Envelope
from celery_dlq.ops.parked import ParkedRetry
from celery_dlq.storage import totals
from celery_dlq.storage.archive import EventLog
from celery_dlq.storage.fetch import FetchLayout, run_fetch
from celery_dlq.storage.keys import Keys, QueueLists, Stat
from celery_dlq.storage.scripts import Scripts
from celery_dlq.storage.store import DirectPayload, ParkedStore, add_moves, to_ms
from celery_dlq.storage.totals import Metric
from celery_dlq.worker.fetch.moves import LIMIT, FetchMoves, MoveTally
from tests.unit.test_fetch import FakeChannel, celery_message

T0 = 1_700_000_000.0
FAILURE = {"type": "ValueError", "message": "boom", "traceback": "tb"}


def element(tag: str, task_id: str = "id-1") -> bytes:
    return json.dumps(celery_message(task_id=task_id, tag=tag)).encode()


def test_a_direct_payload_round_trips_and_refuses_a_nul_in_its_names():
    payload = DirectPayload("orders", "g:orders\x06\x169", "shop.charge", b'{"a": "\x00 kept"}')
    assert DirectPayload.loads(payload.dumps()) == payload
    assert DirectPayload.loads(Envelope(b"", None, None, {}, {}, "", "q", "q").dumps()) is None
    with pytest.raises(ValueError):
        DirectPayload("or\0ders", "d", "t", b"{}").dumps()


@pytest.fixture
def store(any_redis, unique):
    store = ParkedStore(any_redis, Keys(f"d{unique}"), clock=lambda: T0)
    yield store
    any_redis.delete(*store.keys.store_keys(), store.keys.stats, store.keys.events)


def park_five(store, orders: str, high: str) -> None:
    """a and b due for ``orders`` and its priority list ``high``; c due for another list; d due in the publish
    format; e for ``orders``, due in a minute."""
    store.park("a:2", DirectPayload(orders, orders, "shop.charge", element("ta", "a")).dumps(), orders, due=T0 - 3)
    store.park("b:3", DirectPayload(orders, high, "shop.charge", element("tb", "b")).dumps(), orders, due=T0 - 2)
    store.park("c:2", DirectPayload("other", "other", "shop.x", element("tc", "c")).dumps(), "other", due=T0 - 1)
    store.park("d:2", b'{"v": 1, "body": ""}', orders, due=T0 - 1)               # the publish format
    store.park("e:2", DirectPayload(orders, orders, "shop.charge", element("te", "e")).dumps(), orders, due=T0 + 60)


def test_move_due_moves_direct_entries_inside_redis_and_leaves_the_publish_format(store, unique):
    c, k = store.client, store.keys
    orders, high = f"orders{unique}", f"orders{unique}\x06\x169"
    park_five(store, orders, high)
    assert not c.hexists(k.queues, "a:2") and c.hget(k.queues, "d:2") == orders.encode()
    try:
        moved, left = store.move_due([orders, high], limit=10, events_max_length=100, counter=Stat.REDELIVERED,
                                     now=T0)
        assert (moved, left) == (2, 2)          # c names a list not given; d is for the publish path
        assert c.lrange(orders, 0, -1) == [element("ta", "a")] and c.lrange(high, 0, -1) == [element("tb", "b")]
        assert store.get("a:2") is None and store.get("b:3") is None and store.get("c:2").due == T0 - 1
        assert store.counts_by_queue() == {orders: 2, "other": 1}                   # d and e; c
        assert c.hget(k.stats, Stat.REDELIVERED) == b"2"
        events = [event for _, event in EventLog(c, k, 100).events()]
        assert [(e.type, e.task_id, e.delivery, e.queue, e.task_name) for e in events] == [
            ("redelivered", "a", 2, orders, "shop.charge"), ("redelivered", "b", 3, orders, "shop.charge")]
        assert events[0].ts_us == int(T0 * 1_000_000)
        assert store.move_due([orders, high], limit=10, now=T0) == (0, 2)          # nothing twice
    finally:
        c.delete(orders, high, "other")


def test_move_due_first_restores_expired_leases_and_takes_the_tag_suffixed_entry_ids(store, unique):
    c, q = store.client, f"q{unique}"
    store.park(f"x:1:2:{'a' * 8}-bc", DirectPayload(q, q, "t", element("t1", "x:1")).dumps(), q, due=T0 - 10)
    [claimed] = store.claim_due(lease=5, now=T0 - 9)        # a publish-path mover took it, then died
    assert claimed.lease_until < T0
    try:
        assert store.move_due([q], limit=10, events_max_length=10, now=T0) == (1, 0)
        assert c.llen(q) == 1 and store.count() == 0
        [(_, event)] = list(EventLog(c, store.keys, 10).events())
        assert (event.task_id, event.delivery) == ("x:1", 2)
    finally:
        c.delete(q)


# -- parking from a consumed kombu message -------------------------------------------

@pytest.fixture
def consumed(redis_server, unique):
    """A real Celery message consumed from the test redis-server by kombu (``message._raw`` is its element)."""
    app = Celery("direct", broker=redis_server.url, set_as_current=False)
    app.conf.update(task_default_queue=f"q{unique}", dlq_key_prefix=f"dp{unique}",
                    broker_transport_options={"global_keyprefix": f"g{unique}:"})
    app.send_task("shop.charge", args=(7,), queue=f"q{unique}", priority=9)
    with app.connection_for_read() as connection:
        queue = connection.SimpleQueue(f"q{unique}", no_ack=False)
        message = queue.get(timeout=5)
        message.ack()
        yield app, message
        queue.close()


def test_a_failure_on_a_redis_broker_parks_the_element_kombu_will_pop(consumed, unique):
    app, message = consumed
    runtime = celery_dlq.install(app)
    assert runtime.config.direct
    envelope = Envelope.from_message(message, f"q{unique}")
    runtime.parking.redeliver_later(envelope, delivery=1, failure=FAILURE, delay=0, message=message)
    runtime.parking.redeliver_later(envelope, delivery=1, failure=FAILURE, delay=0, message=message)   # a repeat
    [entry] = list(runtime.redis().store.entries())
    direct = DirectPayload.loads(entry.payload)
    dest = QueueLists.of(app.conf.broker_transport_options).key(f"q{unique}", 9)
    assert (direct.queue, direct.dest, direct.task) == (f"q{unique}", dest, "shop.charge")
    assert dest.startswith(f"g{unique}:")
    doc = json.loads(direct.element)
    assert envelope_error(doc) is None and doc["body"] == message._raw["body"]     # kombu's encoding kept
    assert doc["headers"][H.DELIVERY_COUNT] == 2 and doc["headers"]["retries"] == 1
    assert doc["headers"][H.LAST_EXCEPTION] == "ValueError: boom"
    assert doc["properties"]["delivery_tag"] != message.delivery_tag
    assert doc["properties"][SOURCE_TAG_PROPERTY] == message.delivery_tag
    assert "redelivered" not in doc["properties"]["delivery_info"] and "redelivered" not in doc["headers"]
    rebuilt = Message(doc, channel=FakeChannel())
    assert rebuilt.body == message.body and rebuilt.headers["id"] == message.headers["id"]
    retry = ParkedRetry.from_entry(entry)
    assert (retry.task_id, retry.task_name, retry.delivery_count) == (message.headers["id"], "shop.charge", 2)
    moved, left = runtime.redis().store.move_due(runtime.config.lists.keys(f"q{unique}"), limit=10, now=entry.due + 1)
    assert (moved, left) == (1, 0) and runtime.redis().client.lrange(dest, 0, -1) == [direct.element]
    runtime.redis().client.delete(dest)


def test_a_direct_entry_claimed_by_the_publish_path_goes_onto_its_list_as_it_is(consumed, unique):
    """What a lease-protocol mover does with a direct entry (an old worker's claim, a list not known yet)."""
    from celery_dlq.worker.park.mover import MoverThread

    app, message = consumed
    runtime = celery_dlq.install(app)
    runtime.parking.redeliver_later(Envelope.from_message(message, f"q{unique}"), delivery=1, failure=FAILURE, delay=0,
                            message=message)
    claimed = runtime.redis().store.claim_due(lease=30, now=T0 * 2)
    assert len(claimed) == 1
    mover = MoverThread(app, runtime.config, runtime.redis())
    assert mover._publish(runtime.redis().sharded.home, claimed) == 1
    dest = runtime.config.lists.key(f"q{unique}", 9)
    [element] = runtime.redis().client.lrange(dest, 0, -1)
    assert element == DirectPayload.loads(claimed[0].payload).element and runtime.redis().store.count() == 0
    runtime.redis().client.delete(dest)


def fetch_moving(store, lists: list[str], now: float = T0, events_max_length: int = 100):
    """fetch.lua as the worker's transport runs it where the broker is the store (``worker/fetch/moves.py``)."""
    moves = FetchMoves(tuple(store.keys.move_keys()), events_max_length)
    layout = FetchLayout(store.keys, "c1", tuple(lists), tuple(name.split("\x06\x16")[0] for name in lists),
                         moves=moves.keys)
    return run_fetch(Scripts(store.client), layout, now_ms=to_ms(now), beat=False, register=False,
                     moves=moves.args(now))


def test_a_fetch_first_moves_the_due_entries_of_its_own_lists_with_the_movers_bookkeeping(store, unique):
    c, k = store.client, store.keys
    orders, high = f"orders{unique}", f"orders{unique}\x06\x169"
    park_five(store, orders, high)
    try:
        reply = fetch_moving(store, [high, orders])
        assert reply[:4] == [1, element("tb", "b"), b"ok", b"tb"]        # moved, then popped in priority order
        assert add_moves(Counter(), reply, 5) == {(orders, "shop.charge"): 2}
        assert c.lrange(orders, 0, -1) == [element("ta", "a")] and c.llen(high) == 0
        assert c.hexists(k.inflight("c1"), "tb")
        assert store.get("a:2") is None and store.get("b:3") is None
        assert store.counts_by_queue() == {orders: 2, "other": 1}                   # d and e; c
        assert c.hget(k.stats, Stat.REDELIVERED) == b"2"
        events = [event for _, event in EventLog(c, k, 100).events()]
        assert [(e.type, e.task_id, e.delivery, e.ts_us) for e in events] == [
            ("redelivered", "a", 2, int(T0 * 1_000_000)), ("redelivered", "b", 3, int(T0 * 1_000_000))]
        reply = fetch_moving(store, [high, orders])
        assert reply == [2, element("ta", "a"), b"ok", b"ta", 0]                     # nothing moved twice
        assert fetch_moving(store, [high, orders]) is None        # c: another list; d: publish; e: not due
        assert fetch_moving(store, [high, orders], now=T0 + 61)[:4] == [2, element("te", "e"), b"ok", b"te"]
    finally:
        c.delete(orders, high, "other", k.inflight("c1"))


def test_a_fetch_moves_at_most_its_limit_and_the_next_fetch_the_rest(store, unique):
    c, q = store.client, f"q{unique}"
    for i in range(LIMIT + 5):
        store.park(f"t{i}:2", DirectPayload(q, q, "shop.x", element(f"tag{i}", f"t{i}")).dumps(), q, due=T0 - 1)
    try:
        first = fetch_moving(store, [q], events_max_length=0)
        assert add_moves(Counter(), first, 5) == {(q, "shop.x"): LIMIT}
        assert store.count() == 5 and c.llen(q) == LIMIT - 1 and not c.exists(store.keys.events)
        second = fetch_moving(store, [q], events_max_length=0)
        assert add_moves(Counter(), second, 5) == {(q, "shop.x"): 5}
        assert store.count() == 0 and c.llen(q) == LIMIT + 3
        assert c.hget(store.keys.stats, Stat.REDELIVERED) == str(LIMIT + 5).encode()
    finally:
        c.delete(q, store.keys.inflight("c1"))


def test_the_fetches_moves_are_written_to_redelivered_total_once_and_kept_when_redis_fails(store, unique):
    tally, q = MoveTally(), f"q{unique}"
    tally.add([1, b"element", b"ok", b"tag", 0, q.encode(), b"shop.x", 2, q.encode(), b"shop.y", 1], 5)
    tally.add([1, b"element", b"ok", b"tag", 1, q.encode(), b"shop.x", 3], 5)

    class Down:
        def count_redelivered(self, counts):
            raise ConnectionError("redis is down")

    with pytest.raises(ConnectionError):
        tally.flush(Down())
    tally.flush(store)
    tally.flush(store)     # nothing left: nothing written twice
    got = {labels: n for (name, labels), n in totals.read(store.client, store.keys).items()
           if name == Metric.REDELIVERED}
    assert got == {(("queue", q), ("task", "shop.x")): 5, (("queue", q), ("task", "shop.y")): 1}
    store.client.delete(store.keys.metrics, store.keys.trends)
