"""Expiry (policy field ``expired``, reason ``expired``, the parked entry's expiry) and retry with new arguments:
the pure parts, and the store scripts on fakeredis and on a real redis-server."""
from __future__ import annotations

import base64
import json
import pickle
from datetime import datetime, timedelta, timezone

import pytest
from celery import Celery
from kombu.exceptions import ContentDisallowed

from celery_dlq import ConfigurationError, RedeliveryPolicy
from celery_dlq import headers as H
from celery_dlq.element import with_body
from celery_dlq.message import Envelope, decode_raw, with_arguments, with_task_arguments
from celery_dlq.settings import DLQSettings
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.store import DirectPayload, ParkedStore
from celery_dlq.worker.run.task import Redeliver

T0 = 1_700_000_000.0


# -- the policy field ---------------------------------------------------------

def test_expired_defaults_to_dead_letter_and_drop_sends_expired_messages_nowhere():
    assert RedeliveryPolicy().expired == "dead_letter"
    assert RedeliveryPolicy().expired_queue("orders") == "DLQ.orders"
    drop = RedeliveryPolicy(expired="drop")
    assert drop.expired_queue("orders") is None
    assert drop.dead_letter_queue("orders") == "DLQ.orders"  # other dead letters are kept


@pytest.mark.parametrize("bad", ["Drop", "dead-letter", True, None, ""])
def test_a_bad_expired_value_fails_at_configuration_time_naming_the_field(bad):
    with pytest.raises(ConfigurationError, match=r"expired must be 'dead_letter' or 'drop'"):
        RedeliveryPolicy(expired=bad)
    conf = Celery(broker="redis://127.0.0.1:1/0", set_as_current=False).conf
    conf.dlq_task_policies = {"shop.*": {"expired": bad}}
    with pytest.raises(ConfigurationError, match=r"dlq_task_policies\['shop\.\*'\]: expired"):
        DLQSettings.from_conf(conf)


def test_expired_merges_field_by_field_like_the_other_fields():
    conf = Celery(broker="redis://127.0.0.1:1/0", set_as_current=False).conf
    conf.dlq_default_policy = {"expired": "drop"}
    settings = DLQSettings.from_conf(conf)
    assert settings.policy_for("shop.charge", "orders", dict).expired == "drop"
    assert settings.policy_for("shop.refund", "orders", lambda: {"expired": "dead_letter"}).expired == "dead_letter"


# -- reading Celery's expires -------------------------------------------------

def test_expires_is_read_as_celery_reads_it():
    aware = datetime(2026, 11, 24, 18, 0, tzinfo=timezone.utc)
    assert H.expires_at({"expires": aware.isoformat()}) == aware.timestamp()
    assert H.expires_at({"expires": "2026-11-24T19:00:00+01:00"}) == aware.timestamp()
    assert H.expires_at({"expires": "2026-11-24T18:00:00"}) == aware.timestamp()  # naive: UTC, as Celery
    assert H.expires_at({"expires": aware}) == aware.timestamp()                  # a request's datetime
    for none in ({}, None, {"expires": None}, {"expires": "not a time"}, {"expires": 12}):
        assert H.expires_at(none) is None


def test_expires_before_compares_the_due_time_with_the_expiry():
    expires = datetime.fromtimestamp(T0, timezone.utc).isoformat()
    assert H.expires_before({"expires": expires}, T0 + 0.001)
    assert not H.expires_before({"expires": expires}, T0)
    assert not H.expires_before({}, T0 + 10 ** 6)


def test_last_failure_reads_the_parked_copys_summary():
    assert H.last_failure({H.LAST_EXCEPTION: "ValueError: bad: value"}) == \
        {"type": "ValueError", "message": "bad: value", "traceback": ""}
    assert H.last_failure({H.LAST_EXCEPTION: "retry requested by the task"})["type"] == ""
    assert H.last_failure({}) == {"type": "", "message": "", "traceback": ""}
    assert H.Reason.EXPIRED == "expired" and H.Reason.EXPIRED in H.Reason.ALL


# -- new arguments ------------------------------------------------------------

def test_new_task_arguments_keep_the_rest_of_the_body():
    embed = {"callbacks": [{"task": "t.next"}], "errbacks": None, "chain": None, "chord": None}
    assert with_task_arguments([[1], {"a": 1}, embed], (2, 3), {"b": 2}) == [[2, 3], {"b": 2}, embed]
    v1 = {"task": "t", "id": "i", "args": [1], "kwargs": {}, "eta": None}
    assert with_task_arguments(v1, [9], {"k": 1}) == {**v1, "args": [9], "kwargs": {"k": 1}}
    with pytest.raises(ValueError):
        with_task_arguments("not a body", [], {})


def test_an_element_with_another_body_is_base64_as_kombu_stores_binary_bodies():
    raw = {"body": "W1tdLCB7fSwge31d", "content-type": "application/json", "content-encoding": "utf-8",
           "headers": {"id": "i"}, "properties": {"body_encoding": "base64", "delivery_tag": "t"}}
    element = with_body(raw, b"\x80binary", "application/x-python-serialize", "binary")
    decoded = decode_raw(json.dumps(element))
    assert decoded.body == b"\x80binary" and decoded.content_type == "application/x-python-serialize"
    assert element["properties"]["delivery_tag"] == "t" and raw["body"] == "W1tdLCB7fSwge31d"


def envelope(body: bytes, content_type: str = "application/json", encoding: str = "utf-8") -> Envelope:
    return Envelope(body, content_type, encoding, {"id": "i", "task": "t", "argsrepr": "(1,)",
                                                   "kwargsrepr": "{}"}, {}, "", "q", "q")


def test_with_arguments_reencodes_with_the_original_serializer_and_updates_the_reprs():
    accept = Celery(set_as_current=False).conf.accept_content
    embed = {"callbacks": None, "errbacks": None, "chain": [{"task": "t.after"}], "chord": None}
    out = with_arguments(envelope(json.dumps([[1], {}, embed]).encode()), [2], {"note": "x"}, accept)
    assert json.loads(out.body) == [[2], {"note": "x"}, embed]
    assert (out.content_type, out.content_encoding) == ("application/json", "utf-8")
    assert out.headers["argsrepr"] == "[2]" and out.headers["kwargsrepr"] == "{'note': 'x'}"
    assert out.headers["id"] == "i"


def test_with_arguments_never_decodes_beyond_accept_content():
    app = Celery(set_as_current=False)
    body = pickle.dumps(([1], {}, {}))
    with pytest.raises(ContentDisallowed):
        with_arguments(envelope(body, "application/x-python-serialize", "binary"), [2], {}, app.conf.accept_content)
    app.conf.accept_content = ["json", "pickle"]
    out = with_arguments(envelope(body, "application/x-python-serialize", "binary"), [2], {}, app.conf.accept_content)
    assert pickle.loads(out.body) == [[2], {}, {}]


def test_redeliver_carries_new_arguments_across_the_pool():
    exc = pickle.loads(pickle.dumps(Redeliver(when=1.5, failure={"type": "X"}, arguments=([1], {"a": 2}))))
    assert (exc.when, exc.failure, exc.arguments) == (1.5, {"type": "X"}, ([1], {"a": 2}))
    assert pickle.loads(pickle.dumps(Redeliver(when=0.0, failure={"type": "X"}))).arguments is None


# -- the store: the entry's expiry beside it ----------------------------------

@pytest.fixture
def store(any_redis, unique):
    store = ParkedStore(any_redis, Keys(f"x{unique}"), clock=lambda: T0)
    yield store
    any_redis.delete(*store.keys.store_keys(), store.keys.stats, store.keys.expiries)


def element(task_id: str) -> bytes:
    body = base64.b64encode(b"[[], {}, {}]").decode()
    return json.dumps({"body": body, "content-type": "application/json", "content-encoding": "utf-8",
                       "headers": {"id": task_id, "task": "shop.charge"},
                       "properties": {"body_encoding": "base64", "delivery_tag": f"tag-{task_id}",
                                      "delivery_info": {"exchange": "", "routing_key": "orders"}}}).encode()


def park(store: ParkedStore, task_id: str, queue: str, *, due: float, expires: float | None) -> None:
    payload = DirectPayload(queue, queue, "shop.charge", element(task_id)).dumps()
    assert store.park(f"{task_id}:2", payload, queue, due=due, expires=expires)


def test_an_entry_expiring_before_it_is_moved_is_left_for_the_claim_and_its_expiry_goes_with_it(store, unique):
    c, k, queue = store.client, store.keys, f"orders{unique}"
    park(store, "fresh", queue, due=T0 - 2, expires=T0 + 60)   # due, not expired: moved
    park(store, "stale", queue, due=T0 - 2, expires=T0 - 1)    # expired while parked: left
    park(store, "old", queue, due=T0 - 2, expires=None)        # parked before expiries existed: moved
    assert c.hget(k.expiries, "stale:2") == str(int((T0 - 1) * 1000)).encode()
    assert not c.hexists(k.expiries, "old:2")
    try:
        assert store.move_due([queue], limit=10, now=T0) == (2, 1)
        assert sorted(json.loads(e)["headers"]["id"] for e in c.lrange(queue, 0, -1)) == ["fresh", "old"]
        assert c.hkeys(k.expiries) == [b"stale:2"]  # the moved entry's expiry went with it
        (claimed,) = store.claim_due(lease=30, now=T0)
        assert claimed.entry_id == "stale:2"
        assert store.ack_many([claimed]) == 1
        assert c.hlen(k.expiries) == 0 and store.count() == 0
    finally:
        c.delete(queue)


def test_removing_an_entry_removes_its_expiry(store):
    park(store, "gone", "orders", due=T0 + 60, expires=T0 + 30)
    assert store.remove("gone:2")
    assert store.client.hlen(store.keys.expiries) == 0


# -- RedeliveryTask.retry: which path --------------------------------------------

@pytest.fixture
def retry_app(monkeypatch):
    """An app with one RedeliveryTask; Celery's own ``Task.retry`` records its calls instead of publishing."""
    from celery.app.task import Task

    from celery_dlq import RedeliveryTask

    app = Celery("retry", broker="redis://127.0.0.1:1/0", set_as_current=False)
    calls = []

    def celery_retry(self, args=None, kwargs=None, exc=None, throw=True, eta=None, countdown=None,
                     max_retries=None, **options):
        calls.append({"args": args, "kwargs": kwargs, "throw": throw, "options": options})
        return "celery's path"

    monkeypatch.setattr(Task, "retry", celery_retry)

    @app.task(bind=True, base=RedeliveryTask, name="t.retrying", shared=False,
              redelivery_policy={"redelivery_delay": 1.0})
    def retrying(self):
        return None

    return app.tasks["t.retrying"], calls


def in_worker(task, expires: str | None = None, **extra):
    """Push the request a worker's pool process would see for delivery 1 of a message of ``task``."""
    task.push_request(id="id-1", args=[1], kwargs={"a": 1}, called_directly=False, is_eager=False,
                      delivery_info={"exchange": "", "routing_key": "q"}, expires=expires, **extra)


def test_retry_with_new_arguments_raises_redeliver_carrying_them(retry_app):
    task, calls = retry_app
    in_worker(task)
    try:
        with pytest.raises(Redeliver) as raised:
            task.retry(args=(2,), countdown=0.5)
        assert (raised.value.when, raised.value.arguments) == (0.5, ([2], {"a": 1}))  # kwargs=None: the message's
        with pytest.raises(Redeliver) as raised:
            task.retry(kwargs={"b": 2})
        assert (raised.value.when, raised.value.arguments) == (1.0, ([1], {"b": 2}))
        with pytest.raises(Redeliver) as raised:
            task.retry()
        assert raised.value.arguments is None
    finally:
        task.pop_request()
    assert calls == []


@pytest.mark.parametrize("how", [{"throw": False}, {"queue": "elsewhere"}, {"priority": 9}])
def test_throw_false_and_other_options_keep_celerys_path(retry_app, how):
    task, calls = retry_app
    in_worker(task)
    try:
        assert task.retry(args=(2,), **how) == "celery's path"
    finally:
        task.pop_request()
    assert calls[0]["args"] == (2,)


def test_eager_calls_keep_celerys_path(retry_app):
    task, calls = retry_app
    task.push_request(id="id-1", args=[1], kwargs={}, called_directly=False, is_eager=True)
    try:
        assert task.retry(args=(2,)) == "celery's path"
    finally:
        task.pop_request()
    assert calls[0]["args"] == (2,)


def test_a_retry_past_the_expiry_is_the_last_failure(retry_app):
    from celery_dlq.errors import MessageExpired
    from celery_dlq.worker.run.task import EXPIRED_RETRY

    task, _ = retry_app
    soon = (datetime.now(timezone.utc) + timedelta(seconds=2)).isoformat()
    in_worker(task, expires=soon)
    try:
        with pytest.raises(Redeliver):
            task.retry(countdown=1)                      # before the expiry: parked as usual
        with pytest.raises(MessageExpired, match="would come after the message expires"):
            task.retry(countdown=5)
        own = TimeoutError("upstream")
        with pytest.raises(TimeoutError) as raised:
            task.retry(countdown=5, exc=own)
        assert raised.value is own and getattr(task.request, EXPIRED_RETRY) is own
        assert task._redelivery_delay(ValueError()) == 1.0   # the policy's 1 s still fits
    finally:
        task.pop_request()
    in_worker(task, expires=(datetime.now(timezone.utc) + timedelta(seconds=0.5)).isoformat())
    try:
        assert task._redelivery_delay(ValueError()) is None  # 1 s would be too late: the last failure
    finally:
        task.pop_request()


def test_with_arguments_compresses_again_a_compressed_message():
    from kombu.compression import decompress

    original = envelope(json.dumps([[1], {}, {}]).encode())  # kombu hands over the decompressed body
    original = Envelope(original.body, original.content_type, original.content_encoding,
                        {**original.headers, "compression": "application/x-gzip"}, {}, "", "q", "q")
    out = with_arguments(original, [2], {}, Celery(set_as_current=False).conf.accept_content)
    assert out.headers["compression"] == "application/x-gzip"
    assert json.loads(decompress(out.body, "application/x-gzip")) == [[2], {}, {}]


def test_retry_with_only_args_or_only_kwargs_switches_the_calling_convention_as_celery_does():
    from celery_dlq.worker.run.task import retry_arguments

    def run(foo, bar, label=None):
        pass

    # Celery's t/integration test_retry_switches_from_args_to_kwargs and _from_kwargs_to_args.
    assert retry_arguments(run, (1, 2), {}, None, {"foo": 2}) == ((2, 2), {})
    assert retry_arguments(run, (), {"foo": 1, "bar": 2}, (2, 3), None) == ((2, 3), {})
    assert retry_arguments(run, (1,), {"bar": 2}, None, None) == ((1,), {"bar": 2})
    assert retry_arguments(run, (1, 2), {"label": "x"}, (5,), None) == ((5,), {"label": "x"})
