"""The fetch path below Celery: what can become a task message, the fetch scripts, the transport switch."""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time

import pytest
import redis
from celery import Celery
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kombu.transport.virtual import Message

from celery_dlq import headers as H
from celery_dlq.element import envelope_error, raw_dead_letter
from celery_dlq.storage.fetch import FetchLayout, run_fetch
from celery_dlq.storage.inflight import parse_value
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.scripts import Scripts
from celery_dlq.worker.fetch import transport as T
from celery_dlq.worker.fetch import setup as TS
from celery_dlq.worker.runtime import runtime_of


def celery_message(task_id: str = "id-1", tag: str = "tag-1", **headers) -> dict:
    """A Celery protocol-2 message as kombu's Redis transport stores it."""
    return {
        "body": base64.b64encode(b'[[1], {}, {"callbacks": null}]').decode(), "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {"lang": "py", "task": "proj.add", "id": task_id, "retries": 0, **headers},
        "properties": {"correlation_id": task_id, "body_encoding": "base64", "delivery_mode": 2, "priority": 0,
                       "delivery_tag": tag, "delivery_info": {"exchange": "", "routing_key": "orders"}},
    }


class FakeChannel:
    """What kombu's virtual Message asks of its channel: body decoding."""

    @staticmethod
    def decode_body(body, encoding=None):
        return base64.b64decode(body) if encoding == "base64" else body


# -- what can become a task message ----------------------------------------------

BROKEN = {
    "a list": [1, 2],
    "a string": "text",
    "an object that is not an envelope": {"a": 1},
    "properties not an object": {**celery_message(), "properties": "x"},
    "no delivery tag": {**celery_message(), "properties": {"delivery_info": {"exchange": "", "routing_key": "q"}}},
    "no delivery info": {**celery_message(), "properties": {"delivery_tag": "t"}},
    "body not base64": {**celery_message(), "body": "!!! not base64 !!!"},
    "body a number": {**celery_message(), "body": 12},
    "unknown body encoding": {**celery_message(), "properties": {**celery_message()["properties"],
                                                                 "body_encoding": "rot13"}},
    "headers a string": {**celery_message(), "headers": "task=proj.add"},
    "no id header": {**celery_message(), "headers": {"task": "proj.add"}},
    "task header not a string": {**celery_message(), "headers": {"task": 5, "id": "x"}},
    "priority not an integer": {**celery_message(), "properties": {**celery_message()["properties"],
                                                                   "priority": "high"}},
    "content type not a string": {**celery_message(), "content-type": ["json"]},
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_every_broken_shape_is_named(name):
    assert envelope_error(BROKEN[name])


def test_a_celery_message_and_a_protocol_1_message_are_accepted():
    assert envelope_error(celery_message()) is None
    v1 = {**celery_message(), "headers": {}}
    assert envelope_error(v1) is None          # protocol 1: Celery reads the task from the body itself
    assert envelope_error({**celery_message(), "body": ""}) is None


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                           max_leaves=12)


def mutated(draw_fields) -> st.SearchStrategy:
    """A Celery message with some fields replaced by arbitrary JSON (or removed)."""
    paths = st.sampled_from(["body", "headers", "properties", "content-type", "content-encoding",
                             "properties.delivery_tag", "properties.delivery_info", "properties.body_encoding",
                             "properties.priority", "headers.id", "headers.task"])
    return st.lists(st.tuples(paths, st.one_of(st.just(KeyError), json_values)), min_size=1, max_size=3)


def apply(changes) -> dict:
    doc = json.loads(json.dumps(celery_message()))
    for path, value in changes:
        *parents, leaf = path.split(".")
        node = doc
        for name in parents:
            node = node.get(name) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            continue
        if value is KeyError:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return doc


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.one_of(json_values, mutated(None).map(apply)))
def test_whatever_passes_validation_becomes_a_kombu_message_celery_can_route(doc):
    """The property the transport relies on: accepted means kombu and Celery's consumer will not raise on it."""
    if envelope_error(doc) is not None:
        return
    message = Message(doc, channel=FakeChannel())
    assert isinstance(message.delivery_tag, str) and message.delivery_tag
    assert {"exchange", "routing_key"} <= set(message.delivery_info)
    headers = message.headers
    assert isinstance(headers, dict)
    if "task" in headers:
        assert isinstance(headers["task"], str) and isinstance(headers["id"], str) and headers["id"]
    int(message.properties.get("priority") or 0)


@given(st.binary(max_size=2000))
def test_a_raw_dead_letter_keeps_the_element_byte_for_byte_and_is_itself_a_message(raw):
    letter = json.loads(raw_dead_letter(raw, queue="orders", dlq="DLQ.orders", error="not JSON", worker="w",
                                        now=1.0, tag="t"))
    assert envelope_error(letter) is None
    assert base64.b64decode(letter["body"]) == raw
    assert letter["headers"][H.REASON] == "invalid_message" and letter["headers"][H.RAW] is True
    assert letter["headers"][H.ORIGINAL_QUEUE] == "orders"


@pytest.mark.parametrize("value, problem", [
    (None, False), (1, False), (4, False), (5, False),          # 5 = max_delivery_attempts + 1
    (6, True), (0, True), (-1, True), (10 ** 30, True), ("3", True), (2.5, True), (True, True),
])
def test_a_delivery_count_is_believed_only_in_range(value, problem):
    headers = {} if value is None else {H.DELIVERY_COUNT: value}
    assert bool(H.delivery_count_problem(headers, 4)) is problem
    assert H.delivery_count_problem({H.DELIVERY_COUNT: 10 ** 5}, -1) is None       # unlimited attempts
    assert H.delivery_count_problem({H.DELIVERY_COUNT: 10 ** 30}, -1)


# -- the scripts ---------------------------------------------------------------------

def fetch(client, keys: Keys, lists: list[str], consumer: str = "c1", now: float = 1000.0,
          queues: tuple[str, ...] = (), register: bool = False, beat: bool = False, holds: bool = False):
    """fetch.lua as the transport runs it; ``queues``: the queues whose wake markers it takes (a listener);
    ``beat``: the consumer's beat is due, the fetch writes it when it takes a message; ``holds``: it holds what
    the breakers tell it to (the broker is the store)."""
    layout = FetchLayout(keys, consumer, tuple(lists), tuple(name.split("\x06\x16")[0] for name in lists),
                         markers=tuple(queues), holds=holds)
    return run_fetch(Scripts(client), layout, now_ms=int(now * 1000), beat=beat, register=register)


def test_fetch_pops_in_priority_order_and_records_before_returning(any_redis, unique):
    keys, q = Keys(f"f{unique}"), f"q{unique}"
    low, high = celery_message(tag=f"low-{unique}"), celery_message(tag=f"high-{unique}")
    any_redis.lpush(f"{q}\x06\x163", json.dumps(low))
    any_redis.lpush(q, json.dumps(high))
    try:
        index, element, status, tag, more = fetch(any_redis, keys, [q, f"{q}\x06\x163"], beat=True)
        assert (index, status, tag, more) == (1, b"ok", f"high-{unique}".encode(), 1)   # low is left
        assert json.loads(element) == high
        # the consumer's own record: the list it came from and the element, byte for byte
        assert parse_value(any_redis.hget(keys.inflight("c1"), f"high-{unique}")) == (q, element)
        assert any_redis.zscore(keys.consumers, "c1") == 1_000_000            # the beat, written with the take
        assert not any_redis.exists("unacked", "unacked_index")             # kombu's records are not used
        assert fetch(any_redis, keys, [q, f"{q}\x06\x163"], now=2000.0)[3:5] == [f"low-{unique}".encode(), 0]
        assert any_redis.zscore(keys.consumers, "c1") == 1_000_000            # no beat asked: none written
        assert fetch(any_redis, keys, [q, f"{q}\x06\x163"]) is None
    finally:
        any_redis.delete(keys.inflight("c1"), keys.consumers)


@pytest.mark.parametrize("junk", [b"not json", b"[1,2]", b'"text"', b'{"a": 1}', b'{"properties": null}',
                                  b"\xff\xfe binary", b'{"properties": {"delivery_tag": 5}}'])
def test_fetch_quarantines_what_is_not_an_envelope_in_the_same_step(any_redis, unique, junk):
    keys, q = Keys(f"f{unique}"), f"q{unique}"
    any_redis.lpush(q, junk)
    index, element, status, tag, more = fetch(any_redis, keys, [q])
    assert (element, status, tag, more) == (junk, b"quarantined", b"", 0)
    assert any_redis.lrange(keys.quarantine(q), 0, -1) == [junk]
    assert any_redis.llen(q) == 0 and not any_redis.exists(keys.inflight("c1"))


def test_reject_invalid_moves_a_fetched_message_to_its_dlq_once(any_redis, unique):
    keys, q, tag = Keys(f"f{unique}"), f"q{unique}", f"t-{unique}"
    any_redis.lpush(q, json.dumps(celery_message(tag=tag)))
    fetch(any_redis, keys, [q])
    script_keys = [keys.inflight("c1"), f"DLQ.{q}"]
    try:
        assert any_redis.hexists(keys.inflight("c1"), tag)
        assert Scripts(any_redis).run("reject_invalid", script_keys, [tag, b"letter"]) == 1
        assert any_redis.lrange(f"DLQ.{q}", 0, -1) == [b"letter"]
        assert not any_redis.hexists(keys.inflight("c1"), tag)
        assert Scripts(any_redis).run("reject_invalid", script_keys, [tag, b"letter"]) == 0   # given back meanwhile
        assert any_redis.llen(f"DLQ.{q}") == 1
    finally:
        any_redis.delete(f"DLQ.{q}")


def test_release_quarantine_moves_one_element_once(any_redis, unique):
    where, dlq = f"quarantine{unique}", f"DLQ.{unique}"
    any_redis.lpush(where, b"junk", b"other")
    assert Scripts(any_redis).run("release_quarantine", [where, dlq], [b"junk", b"wrapped"]) == 1
    assert Scripts(any_redis).run("release_quarantine", [where, dlq], [b"junk", b"wrapped"]) == 0
    assert any_redis.lrange(where, 0, -1) == [b"other"] and any_redis.lrange(dlq, 0, -1) == [b"wrapped"]
    any_redis.delete(where, dlq)


# -- switching the worker to the transport ------------------------------------------

def fetch_context(runtime) -> TS.FetchContext:
    """What the FetchTransport bootstep hands the worker's channels."""
    return TS.FetchContext.of(runtime.config, runtime.redis, runtime.fetch_moved)


def make_app(url: str, **conf) -> Celery:
    app = Celery("t", broker=url, set_as_current=False)
    app.conf.update(conf)
    return app


def test_the_worker_uses_the_transport_on_a_redis_broker():
    app = make_app("redis://localhost:6379/3", broker_transport_options={"global_keyprefix": "g:"},
                   dlq_key_prefix="kp", dlq_fetch_wait=0.25)
    runtime = runtime_of(app)
    context = fetch_context(runtime)
    assert TS.use_in_worker(app, context)
    assert app.conf.broker_transport == TS.TRANSPORT
    options = app.conf.broker_transport_options
    assert options.keys() == {"global_keyprefix", TS.OPTION_FETCH} and options["global_keyprefix"] == "g:"
    assert json.loads(json.dumps(options)) == options   # what `celery inspect stats` replies with (issue 45)
    assert TS.context_of(options) is context
    assert (context.key_prefix, context.wait, context.listener, context.inflight_lease) == ("kp", 0.25, True, 10.0)
    assert context.moved is runtime.fetch_moved and context.policy("orders").dead_letter_queue("orders") == "DLQ.orders"
    assert "redis://" not in repr(context)   # a dump of the configuration shows no URL
    with app.connection_for_read() as connection:
        assert connection.transport_cls == TS.TRANSPORT
        assert type(connection.transport) is T.Transport


def test_a_unix_socket_broker_fetches_through_the_transport(tmp_path):
    """``redis+socket://`` keeps working: a real redis-server on a socket, a real fetch, acked."""
    sock = tmp_path / "redis.sock"
    server = subprocess.Popen([shutil.which("redis-server"), "--port", "0", "--unixsocket", str(sock), "--save", "",
                               "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        app = make_app(f"redis+socket://{sock}?virtual_host=2")
        assert TS.use_in_worker(app, fetch_context(runtime_of(app)))
        assert app.conf.broker_transport == TS.SOCKET_TRANSPORT
        with app.connection_for_read() as connection:
            assert type(connection.transport) is T.SocketTransport
            queue = connection.SimpleQueue(f"sock{os.getpid()}")
            queue.put({"x": 1})
            message = queue.get(timeout=5)
            assert message.payload == {"x": 1}
            client = redis.Redis(unix_socket_path=str(sock), db=2)
            inflight = Keys("celery_dlq").inflight(T.process.consumer_id())
            assert client.hlen(inflight) == 1          # recorded by the fetch script, before the ack
            message.ack()
            assert client.hlen(inflight) == 0 and not client.exists("unacked")
            queue.close()
    finally:
        server.terminate()
        server.wait(10)


@pytest.mark.parametrize("conf", [
    {"broker_url": "amqp://guest@localhost//", "dlq_redis_url": "redis://localhost/0"},
    {"broker_url": "redis://localhost/0", "dlq_fetch_transport": False},
    {"broker_url": "redis://localhost/0", "broker_transport": "myproject.transport:Transport"},
])
def test_the_transport_is_left_alone_when_not_wanted_or_not_redis(conf):
    app = make_app(conf.pop("broker_url"), **conf)
    before = app.conf.broker_transport
    runtime = runtime_of(app)
    assert not TS.use_in_worker(app, fetch_context(runtime), runtime.config.settings.fetch_transport)
    assert app.conf.broker_transport == before


def test_a_fetch_keeps_in_redis_what_a_breaker_holds_and_hands_over_the_next(any_redis, unique):
    keys, q = Keys(f"f{unique}"), f"q{unique}"
    held = [celery_message(task_id=f"h{i}", tag=f"h{i}") for i in range(3)]
    for m in held:
        m["headers"]["task"] = "proj.pay"
    healthy = celery_message(task_id="ok", tag="ok")
    for m in [*held[:2], healthy, held[2]]:                 # RPOP order: h0, h1, ok, h2
        any_redis.lpush(q, json.dumps(m))
    any_redis.hset(keys.breaker_holds, f"{q}\x1fproj.pay", 2_000_000)   # held until t = 2,000 s
    index, element, status, tag, more = fetch(any_redis, keys, [q], holds=True)[:5]
    assert (status, tag, more) == (b"ok", b"ok", 1)          # the two held ones skipped, kept whole
    kept = any_redis.zrange(keys.breaker_held_raw, 0, -1)
    assert sorted(json.loads(k.split(b"\x1f", 2)[2])["properties"]["delivery_tag"] for k in kept) == ["h0", "h1"]
    assert all(k.startswith(f"{q}\x1fproj.pay\x1f".encode()) for k in kept)
    assert list(any_redis.hkeys(keys.inflight("c1"))) == [b"ok"]   # only what was handed over is in flight
    # Only a held one left: nothing handed over, the list empty, and a fetch without holds takes it.
    assert fetch(any_redis, keys, [q], holds=True)[:5] == [0, b"", b"none", b"", 0]
    assert any_redis.zcard(keys.breaker_held_raw) == 3 and any_redis.llen(q) == 0


def test_a_hold_that_ran_out_or_another_queue_lets_the_delivery_through(any_redis, unique):
    keys, q = Keys(f"f{unique}"), f"q{unique}"
    m = celery_message(task_id="a", tag="a")
    m["headers"]["task"] = "proj.pay"
    any_redis.hset(keys.breaker_holds, mapping={f"{q}\x1fproj.pay": 999_000, f"other\x1fproj.pay": 9e15})
    any_redis.lpush(q, json.dumps(m))
    assert fetch(any_redis, keys, [q], now=1000.0, holds=True)[2] == b"ok"   # held until 999 s: over
    any_redis.hset(keys.breaker_holds, f"*\x1fproj.pay", "9e15")             # paused on every queue
    any_redis.lpush(q, json.dumps({**m, "properties": {**m["properties"], "delivery_tag": "b"}}))
    assert fetch(any_redis, keys, [q], holds=False)[2] == b"ok"               # a fetch told not to hold
    any_redis.lpush(q, json.dumps({**m, "properties": {**m["properties"], "delivery_tag": "c"}}))
    assert fetch(any_redis, keys, [q], holds=True)[2] == b"none" and any_redis.zcard(keys.breaker_held_raw) == 1


def test_what_the_fetch_kept_counts_in_breaker_held_total(any_redis, unique):
    from celery_dlq.storage import totals

    keys, q = Keys(f"f{unique}"), f"q{unique}"
    m = celery_message(task_id="a", tag="a")
    m["headers"]["task"] = "proj.pay"
    any_redis.hset(keys.breaker_holds, f"{q}\x1fproj.pay", "9e15")
    any_redis.lpush(q, json.dumps(m))
    fetch(any_redis, keys, [q], holds=True)
    totals.incr(any_redis, keys, totals.Metric.HELD, queue=q, task="proj.pay")   # and one a worker parked
    counted = totals.read(any_redis, keys)
    assert counted[(totals.Metric.HELD, (("queue", q), ("task", "proj.pay")))] == 2
