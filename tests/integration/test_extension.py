"""Parking.redeliver_later: the parked copy, its headers, and the redelivery signal."""
from __future__ import annotations

import time

import pytest
from celery import Celery

import celery_dlq
from celery_dlq import headers as H
from celery_dlq import task_redelivery_scheduled
from celery_dlq.message import Envelope


@pytest.fixture
def dlq(redis_server, unique):
    app = Celery("ext", broker=redis_server.url, set_as_current=False)
    app.conf.dlq_key_prefix = f"ext{unique}"
    return celery_dlq.install(app)


def envelope(unique, headers=None):
    return Envelope(body=b"[[1], {}, {}]", content_type="application/json", content_encoding="utf-8",
                    headers={"task": "t.x", "id": f"id-{unique}", "retries": 0, **(headers or {})},
                    properties={"correlation_id": f"id-{unique}", "priority": 0},
                    exchange="", routing_key="orders", queue="orders")


FAILURE = {"type": "ValueError", "message": "boom", "traceback": "tb"}


def test_park_stores_the_original_with_next_delivery_headers(dlq, unique):
    before = time.time()
    due = dlq.parking.redeliver_later(envelope(unique), delivery=1, failure=FAILURE, delay=5)
    assert before + 5 <= due <= time.time() + 5
    (entry,) = list(dlq.redis().store.entries())
    assert entry.entry_id == f"id-{unique}:2"
    assert abs(entry.due - due) < 0.002
    copy = Envelope.loads(entry.payload)
    assert copy.body == b"[[1], {}, {}]"
    assert copy.properties == {"correlation_id": f"id-{unique}", "priority": 0}
    assert copy.headers[H.DELIVERY_COUNT] == 2
    assert copy.headers["retries"] == 1
    assert copy.headers[H.ORIGINAL_QUEUE] == "orders"
    assert copy.headers[H.LAST_EXCEPTION] == "ValueError: boom"
    assert before <= copy.headers[H.FIRST_FAILURE_AT] <= time.time()


def test_first_failure_time_is_kept_across_redeliveries(dlq, unique):
    dlq.parking.redeliver_later(envelope(unique, {H.FIRST_FAILURE_AT: 1000.0, H.DELIVERY_COUNT: 2}), delivery=2,
             failure=FAILURE, delay=0)
    (entry,) = list(dlq.redis().store.entries())
    assert Envelope.loads(entry.payload).headers[H.FIRST_FAILURE_AT] == 1000.0


def test_park_is_idempotent_per_delivery(dlq, unique):
    sent = []

    def receiver(sender, **kwargs):
        sent.append(kwargs["task_id"])

    task_redelivery_scheduled.connect(receiver, weak=False)
    try:
        dlq.parking.redeliver_later(envelope(unique), delivery=1, failure=FAILURE, delay=5)
        dlq.parking.redeliver_later(envelope(unique), delivery=1, failure=FAILURE, delay=5)
    finally:
        task_redelivery_scheduled.disconnect(receiver)
    assert dlq.redis().store.count() == 1
    assert dlq.redis().client.hget(dlq.redis().keys.stats, "parked") == b"1"   # counted by the park script, once
    assert sent == [f"id-{unique}"]
    assert dlq.redis().client.xlen(dlq.redis().keys.events) == 1


def test_redelivery_signal_is_sent_and_a_raising_receiver_is_harmless(dlq, unique):
    seen = []

    def receiver(sender, **kwargs):
        seen.append((sender, kwargs["task_id"], kwargs["delivery_count"], kwargs["exception"]["type"]))
        raise RuntimeError("receiver bug")

    task_redelivery_scheduled.connect(receiver, weak=False)
    try:
        dlq.parking.redeliver_later(envelope(unique), delivery=1, failure=FAILURE, delay=0)
    finally:
        task_redelivery_scheduled.disconnect(receiver)
    assert seen == [("t.x", f"id-{unique}", 2, "ValueError")]
    assert dlq.redis().store.count() == 1


def test_delivery_counter_counts_restored_instances_from_the_header(dlq, unique):
    assert dlq.redis().counters.count(f"id-{unique}", "tag-1", floor=1) == 2   # delivery 1 restored once
    assert dlq.redis().counters.count(f"id-{unique}", "tag-1", floor=1) == 3   # and again
    assert dlq.redis().counters.count(f"id-{unique}", "tag-2", floor=3) == 4   # a parked copy (3), restored
    dlq.redis().counters.uncount([(f"id-{unique}", "tag-3", 1)])              # reserved, never started
    assert dlq.redis().counters.count(f"id-{unique}", "tag-3", floor=1) == 1   # so still delivery 1


def test_delivery_count_reads_the_request():
    class Request(dict):
        pass
    assert celery_dlq.delivery_count(Request()) == 1
    assert celery_dlq.delivery_count(Request({H.DELIVERY_COUNT: 4})) == 4
    assert celery_dlq.delivery_count(Request({H.DELIVERY_COUNT: "junk"})) == 1


def test_acknowledged_messages_counters_are_deleted_in_batches(dlq, unique):
    for tag in ("tag-1", "tag-2", "tag-3"):
        dlq.redis().counters.count(f"id-{unique}", tag, floor=1)
    dlq.redis().counters.forget(f"id-{unique}", "tag-1")
    dlq.redis().counters.forget(f"id-{unique}", "tag-2")
    assert dlq.redis().counters.flush(batch=1) == 2
    assert dlq.redis().counters.flush() == 0
    left = sorted(k.decode() for k in dlq.redis().client.keys(f"*{{ext{unique}}}:count:*"))
    assert left == [dlq.redis().keys.delivery_count(f"id-{unique}:tag-3")]


def test_two_messages_sharing_a_task_id_are_both_parked_a_repeat_is_not(dlq, unique):
    from dataclasses import replace

    first = replace(envelope(unique), delivery_tag="tag-a")
    other = replace(envelope(unique), delivery_tag="tag-b")   # the application reused the task id
    dlq.parking.redeliver_later(first, delivery=1, failure=FAILURE, delay=5)
    dlq.parking.redeliver_later(first, delivery=1, failure=FAILURE, delay=5)     # the same message, delivered again
    dlq.parking.redeliver_later(other, delivery=1, failure=FAILURE, delay=5)
    entries = sorted(entry.entry_id for entry in dlq.redis().store.entries())
    assert entries == [f"id-{unique}:2", f"id-{unique}:2:tag-b"]
    assert dlq.redis().client.hget(dlq.redis().keys.stats, "parked") == b"2"
    assert all(Envelope.loads(e.payload).headers[H.DELIVERY_COUNT] == 2 for e in dlq.redis().store.entries())
