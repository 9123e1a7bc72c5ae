"""The event archive: payload hash, the capped stream, and the engine's hooks (never breaking it)."""
from __future__ import annotations

import base64
import hashlib
import json
import logging
import pickle
import re

import fakeredis
import pytest
import redis
from celery import Celery

from celery_dlq import RedeliveryPolicy, install
from celery_dlq import headers as H
from celery_dlq.errors import ConfigurationError
from celery_dlq.message import Envelope, decode_raw, payload_hash
from celery_dlq.settings import DLQSettings
from celery_dlq.storage import archive, events
from celery_dlq.storage.archive import Event, EventLog, EventType
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.scripts import PRELUDE, SCRIPT_NAMES, script_body
from celery_dlq.worker.park.mover import MoverThread

UNPICKLED: list[str] = []


class Evil:
    """Unpickling this calls ``UNPICKLED.append``: proof that something was unpickled."""

    def __reduce__(self):
        return UNPICKLED.append, ("unpickled!",)


def body(args, kwargs, embed=None) -> bytes:
    return json.dumps([args, kwargs, embed or {"callbacks": None, "errbacks": None, "chain": None}]).encode()


# -- the payload hash ---------------------------------------------------------

def test_json_payload_hash_is_canonical_over_task_args_and_kwargs():
    a = payload_hash("shop.charge", body([1, "x"], {"b": 2, "a": 1}), "application/json", "utf-8")
    b = payload_hash("shop.charge", b'[[1,"x"],{"a":1,"b":2},{"chain":[{"task":"next"}]}]', "application/json", "utf-8")
    assert a == b and len(a) == 32
    assert a != payload_hash("shop.refund", body([1, "x"], {"b": 2, "a": 1}), "application/json", "utf-8")
    assert a != payload_hash("shop.charge", body([2, "x"], {"b": 2, "a": 1}), "application/json", "utf-8")
    canonical = b'[[1,"x"],{"a":1,"b":2}]'
    assert a == hashlib.sha256(b"json\0shop.charge\0" + canonical).hexdigest()[:32]


def test_pickle_payload_is_hashed_raw_and_never_unpickled():
    raw = pickle.dumps(((Evil(),), {}, {}))
    digest = payload_hash("shop.charge", raw, "application/x-python-serialize", "binary")
    assert UNPICKLED == []
    assert digest == hashlib.sha256(b"raw\0shop.charge\0" + raw).hexdigest()[:32]
    # The same bytes under a JSON content type cannot collide with the raw kind.
    assert payload_hash("t", b"[1, 2]", "application/json") != payload_hash("t", b"[1, 2]", "application/octet-stream")
    # Not JSON after all, or too big to parse: raw.
    assert payload_hash("t", b"\x80not json", "application/json") == \
        hashlib.sha256(b"raw\0t\0\x80not json").hexdigest()[:32]


def test_event_round_trips_through_stream_fields():
    event = Event("parked", 1_700_000_000_123_456, task_id="id", task_name="t", queue="q", delivery=2,
                  exception_type="ValueError", first_failure_us=1_700_000_000_000_000, due_us=5, payload_size=9,
                  payload_hash="h")
    fields = event.to_fields()
    assert fields["v"] == "1" and "dlq" not in fields and "record" not in fields
    assert Event.from_fields({k.encode(): v.encode() for k, v in fields.items()}) == event
    assert Event.from_fields({b"type": b"parked", b"ts_us": b"bad", b"unknown": b"x"}).ts_us == 0


# -- the stream -----------------------------------------------------------------

def test_stream_is_capped_approximately(real_redis, unique):
    keys = Keys(f"ev{unique}")
    log = EventLog(real_redis, keys, max_length=100)
    try:
        for start in range(0, 1000, 50):
            assert log.append([Event("parked", start + i) for i in range(50)]) == 50
        assert 100 <= real_redis.xlen(keys.events) < 300
        ids = [entry_id for entry_id, _ in log.events(batch=7)]
        assert len(ids) == real_redis.xlen(keys.events) and ids == sorted(ids, key=archive.parse_id)
    finally:
        real_redis.delete(keys.events)


def test_zero_max_length_turns_the_archive_off():
    client = fakeredis.FakeRedis()
    assert EventLog(client, Keys("x"), max_length=0).append([Event("parked", 1)]) == 0
    assert client.exists(Keys("x").events) == 0


def test_a_failing_redis_is_logged_not_raised(caplog):
    class Broken:
        def xadd(self, *a, **kw):
            raise redis.ConnectionError("down")

        def pipeline(self, **kw):
            return self

    with caplog.at_level(logging.ERROR, logger="celery_dlq.storage.archive"):
        assert EventLog(Broken(), Keys("x"), 10).append([Event("parked", 1)]) == 0
        assert EventLog(Broken(), Keys("x"), 10).append([Event("parked", 1), Event("parked", 2)]) == 0
    assert "could not archive" in caplog.text


def test_setting_is_validated_with_its_name():
    conf = {"broker_url": "redis://localhost/0"}
    assert DLQSettings.from_conf(conf).events_max_length == 100_000
    assert DLQSettings.from_conf({**conf, "dlq_events_max_length": 0}).events_max_length == 0
    for bad in (-1, 1.5, True, "10"):
        with pytest.raises(ConfigurationError, match="dlq_events_max_length"):
            DLQSettings.from_conf({**conf, "dlq_events_max_length": bad})


# -- the engine's hooks -----------------------------------------------------------

@pytest.fixture
def app(redis_server, unique):
    app = Celery("ev", broker=redis_server.url, set_as_current=False)
    app.conf.dlq_key_prefix = f"ev{unique}"
    app.conf.task_default_queue = f"q{unique}"
    yield app
    client = redis.Redis.from_url(redis_server.url)
    client.delete(*client.keys(f"*ev{unique}*") or ["none"], f"q{unique}", f"DLQ.q{unique}")
    client.close()


def envelope(app, unique, args=(7,)) -> Envelope:
    return Envelope(body=body(list(args), {}), content_type="application/json", content_encoding="utf-8",
                    headers={"task": "proj.charge", "id": f"id-{unique}"}, properties={}, exchange="",
                    routing_key=f"q{unique}", queue=f"q{unique}")


FAILURE = {"type": "ValueError", "message": "boom", "traceback": "Traceback ..."}


def stream(dlq) -> list[Event]:
    return [event for _, event in EventLog(dlq.redis().client, dlq.redis().keys, 1).events()]


def test_park_redelivery_and_dead_letter_are_archived(app, unique):
    dlq = install(app)
    env = envelope(app, unique)
    due = dlq.parking.redeliver_later(env, delivery=1, failure=FAILURE, delay=0)
    moved = MoverThread(app, dlq.config, dlq.redis()).move_due()
    assert moved == 1
    letter_queue = dlq.redis().dead_letter(env.with_headers({**env.headers, H.DELIVERY_COUNT: 2,
                                                     H.FIRST_FAILURE_AT: 1_700_000_000.5}),
                                   delivery=2, policy=RedeliveryPolicy(), reason="max_delivery_attempts",
                                   failure=FAILURE, worker="w1@host")
    parked, redelivered, dead = stream(dlq)
    digest = payload_hash("proj.charge", env.body, "application/json", "utf-8")
    assert (parked.type, parked.delivery, parked.exception_type, parked.exception_message) == \
        ("parked", 1, "ValueError", "boom")
    assert parked.due_us == round(due * 1e6) and parked.first_failure_us == parked.ts_us
    assert (redelivered.type, redelivered.delivery, redelivered.queue) == ("redelivered", 2, f"q{unique}")
    assert (dead.type, dead.dlq, dead.delivery, dead.reason, dead.worker) == \
        ("dead_lettered", letter_queue, 2, "max_delivery_attempts", "w1@host")
    assert dead.first_failure_us == 1_700_000_000_500_000
    assert {e.task_id for e in (parked, redelivered, dead)} == {f"id-{unique}"}
    assert {e.payload_hash for e in (parked, redelivered, dead)} == {digest}
    assert {e.payload_size for e in (parked, redelivered, dead)} == {len(env.body)}
    assert parked.record == redelivered.record == ""
    record = Envelope.loads(dead.record)  # the full dead letter: outlives a purge of the DLQ
    assert record.body == env.body and record.headers[H.REASON] == "max_delivery_attempts"
    assert record.headers[H.TRACEBACK] == "Traceback ..." and record.queue == f"q{unique}"


def test_dropped_message_is_archived_with_its_record(app, unique):
    dlq = install(app)
    env = envelope(app, unique)
    assert dlq.redis().dead_letter(env, delivery=3, policy=RedeliveryPolicy(dead_letter=False), reason="max_delivery_attempts",
                           failure=FAILURE, worker="w") is None
    (dropped,) = stream(dlq)
    assert (dropped.type, dropped.delivery, dropped.reason, dropped.exception_type) == \
        ("dropped", 3, "max_delivery_attempts", "ValueError")
    assert Envelope.loads(dropped.record).body == env.body


def test_archive_failure_never_breaks_park(app, unique, caplog):
    dlq = install(app)
    dlq.redis().client.set(dlq.redis().keys.events, b"not a stream")  # XADD inside the park script fails: WRONGTYPE
    with caplog.at_level(logging.WARNING, logger="celery_dlq.storage.store"):
        dlq.parking.redeliver_later(envelope(app, unique), delivery=1, failure=FAILURE, delay=60)
    assert dlq.redis().store.count() == 1
    assert dlq.redis().client.hget(dlq.redis().keys.stats, "parked") == b"1"
    assert "could not archive its event" in caplog.text


def test_park_archives_its_event_in_the_same_script(app, unique):
    dlq = install(app)
    dlq.parking.redeliver_later(envelope(app, unique), delivery=1, failure=FAILURE, delay=60)
    [(_, fields)] = dlq.redis().client.xrange(dlq.redis().keys.events)
    event = Event.from_fields(fields)
    assert (event.type, event.delivery, event.exception_type) == ("parked", 1, FAILURE["type"])
    assert event.due_us is not None and event.due_us > event.ts_us


def test_archive_off_writes_nothing(app, unique):
    app.conf.dlq_events_max_length = 0
    dlq = install(app)
    dlq.parking.redeliver_later(envelope(app, unique), delivery=1, failure=FAILURE, delay=60)
    assert dlq.redis().store.count() == 1 and dlq.redis().client.exists(dlq.redis().keys.events) == 0


# -- the operator tools' API --------------------------------------------------------

def kombu_json(env: Envelope) -> bytes:
    """A DLQ list element as kombu's Redis transport stores it."""
    return json.dumps({"body": base64.b64encode(env.body).decode(), "content-encoding": env.content_encoding,
                       "content-type": env.content_type, "headers": env.headers,
                       "properties": {"body_encoding": "base64", "delivery_tag": "t", "priority": 0,
                                      "delivery_info": {"exchange": "", "routing_key": "DLQ.q"}}}).encode()


def test_replayed_trimmed_and_purged_take_envelopes_or_raw_messages(app, unique):
    dlq = install(app)
    headers = {"task": "proj.charge", "id": "t1", H.ORIGINAL_QUEUE: "orders", H.DELIVERY_COUNT: 3,
               H.REASON: "max_delivery_attempts", H.EXCEPTION_TYPE: "KeyError", H.EXCEPTION_MESSAGE: "k",
               H.DEAD_LETTERED_AT: 1_700_000_000.0}
    env = Envelope(body=body([1], {}), content_type="application/json", content_encoding="utf-8", headers=headers,
                   properties={}, exchange="", routing_key="orders", queue="orders")
    raw = kombu_json(env)
    assert decode_raw(raw).as_envelope().body == env.body and decode_raw(raw).as_envelope().queue == "orders"
    assert dlq.redis().archive.replayed([raw, env], dlq="DLQ.orders", now=1_700_000_100.0) == 2
    assert dlq.redis().archive.trimmed([raw], dlq="DLQ.orders", why="max_length") == 1
    assert dlq.redis().archive.purged([raw], dlq="DLQ.orders") == 1
    replayed, replayed2, trimmed, purged = stream(dlq)
    assert replayed == replayed2
    assert (replayed.type, replayed.ts_us, replayed.dlq, replayed.queue, replayed.delivery) == \
        (EventType.REPLAYED, 1_700_000_100_000_000, "DLQ.orders", "orders", 3)
    assert replayed.payload_hash == payload_hash("proj.charge", env.body, "application/json", "utf-8")
    assert (trimmed.type, trimmed.reason) == ("trimmed", "max_length")
    assert purged.type == "purged" and purged.exception_type == "KeyError"
    # A bad element is logged, not raised.
    assert dlq.redis().archive.purged([b"not json"], dlq="DLQ.orders") == 0


def test_a_parked_copy_carries_its_payload_hash_for_the_movers_event(app, unique):
    from dataclasses import replace

    dlq = install(app)
    dlq.parking.redeliver_later(envelope(app, unique), delivery=1, failure=FAILURE, delay=60)
    [(_, fields)] = dlq.redis().client.xrange(dlq.redis().keys.events)
    parked_hash = Event.from_fields(fields).payload_hash
    [entry] = list(dlq.redis().store.entries())
    copy = Envelope.loads(entry.payload)
    assert copy.extra[events.PAYLOAD_HASH] == parked_hash
    assert events.event_of(EventType.REDELIVERED, copy).payload_hash == parked_hash
    marked = replace(copy, extra={events.PAYLOAD_HASH: "f" * 32})   # taken as stored, not computed again
    assert events.event_of(EventType.REDELIVERED, marked).payload_hash == "f" * 32


@pytest.mark.parametrize("headers, extra", [
    ({}, {}),
    ({"task": "proj.charge", "id": "t1", H.ORIGINAL_QUEUE: "orders", H.DELIVERY_COUNT: 3, H.REASON: "worker_lost",
      H.EXCEPTION_TYPE: "KeyError", H.EXCEPTION_MESSAGE: "é" * 2000, H.FIRST_FAILURE_AT: 1_700_000_000.25,
      H.WORKER: "w1", H.PAYLOAD_HASH: "a" * 32}, {}),
    ({"task": "t", H.DELIVERY_COUNT: "bad", H.FIRST_FAILURE_AT: "nope", H.PAYLOAD_HASH: "short"},
     {"correlation_id": "c1"}),
    ({"task": "t", H.EXCEPTION_MESSAGE: 7, H.ORIGINAL_QUEUE: "q\0x"}, {"body_encoding": "base64"}),
])
def test_a_read_letters_entry_is_the_one_event_of_gives(headers, extra):
    """The replay's direct builder and the generic Event path write the same stream entry."""
    from celery_dlq.ops.letters import DeadLetter

    doc = {"body": base64.b64encode(body([1], {"k": "v"})).decode(), "content-type": "application/json",
           "content-encoding": "utf-8", "headers": headers,
           "properties": {"body_encoding": "base64", "priority": 0, **extra}}
    raw = json.dumps(doc).encode()
    letter = DeadLetter.parse("DLQ.q", "DLQ.q", raw, frozenset())
    for reason in (None, "ttl"):
        generic = events.event_of(EventType.TRIMMED, events._as_envelope(raw), ts=1_700_000_001.5, dlq="DLQ.q",
                                  reason=reason)
        entry = events.letter_entry(EventType.TRIMMED, letter.decoded, "1700000001500000", "DLQ.q", reason)
        assert entry == generic.entry() and events.fields_of(entry) == generic.to_fields()


def test_a_batch_of_entries_is_appended_field_for_field(any_redis, unique):
    """append_events.lua writes each entry as given: names, text (any Unicode, NUL), order."""
    keys = Keys(f"ev{unique}")
    log = EventLog(any_redis, keys, max_length=1000)
    entries = [Event("replayed", 1, task_id=f"t{i}", exception_message="é\0\u2028x", delivery=i).entry()
               for i in range(3)]
    try:
        assert log.append_entries(entries, "replayed") == 3
        rows = any_redis.xrange(keys.events)
        assert [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in rows] == \
            [events.fields_of(entry) for entry in entries]
        assert [list(fields) for _, fields in rows] == [[name.encode() for name in events.fields_of(entry)]
                                                        for entry in entries]   # in order, as one XADD writes
        assert log.append_entries([], "replayed") == 0
    finally:
        any_redis.delete(keys.events)


# -- what a replay's batch relies on -------------------------------------------------

def test_delivery_tags_are_uuid4_text_each_new():
    import uuid

    from celery_dlq.message import delivery_tags

    tags = delivery_tags(2000)
    assert len(set(tags)) == 2000 and delivery_tags(0) == []
    for tag in tags:
        parsed = uuid.UUID(tag)
        assert str(parsed) == tag and parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_decode_raw_reads_what_kombus_loads_reads():
    import datetime
    import decimal
    import uuid

    from kombu.utils import json as kombu_json

    typed = kombu_json.dumps({"at": datetime.datetime(2026, 1, 2, 3, 4, 5), "n": decimal.Decimal("1.5"),
                              "id": uuid.UUID(int=7), "b": b"\x00x", "plain": {"__type__": "x", "other": 1}})
    for raw in (typed.encode(), typed, bytearray(typed.encode()), memoryview(typed.encode()), b"\xff", b"[1]",
                b'{"a": 1} trailing', "\ufeff{}", b"", None):
        try:
            expected = kombu_json.loads(raw)
        except Exception:
            expected = None
        assert decode_raw(raw).doc == (expected if isinstance(expected, dict) else {})


def test_the_events_a_lua_script_spells_out_use_the_schemas_names():
    """The moves' ``redelivered`` events are written by lib.lua (for move_due.lua and fetch.lua) with literal
    field names; the schema is named in redis/events.py, so every literal name and type must be its own."""
    spelled = {}
    for name in (PRELUDE, *SCRIPT_NAMES):
        for call in re.findall(r"'XADD',(.*?)\)\n", script_body(name), re.S):
            args = [arg.strip() for arg in call.split(",")]
            pairs = args[args.index("'*'") + 1:]
            if pairs and all(field.startswith("'") for field in pairs[0::2]):
                spelled[name] = dict(zip((f.strip("'") for f in pairs[0::2]), pairs[1::2]))
    assert set(spelled) == {PRELUDE}, spelled          # the one place in Lua; a new one is checked here too
    for fields in spelled.values():
        assert set(fields) <= set(events.ENTRY_NAMES)
        assert fields["v"].strip("'") == str(events.SCHEMA_VERSION)
        assert fields["type"].strip("'") in EventType.ALL
