"""DeadLetterer against the test run's redis-server as broker: audit, drop, isolated signals."""
from __future__ import annotations

import json
import logging

import pytest
import redis
from celery import Celery

from celery_dlq import RedeliveryPolicy, task_dead_lettered
from celery_dlq import headers as H
from celery_dlq.message import Envelope
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.sharding import Shards
from celery_dlq.storage.shards import ShardedStore
from celery_dlq.worker.deadletter.dead_letterer import DeadLetterer


@pytest.fixture
def setup(redis_server, unique):
    app = Celery("dl", broker=redis_server.url, set_as_current=False)
    client = redis.Redis.from_url(redis_server.url)
    keys = Keys(f"dl{unique}")
    envelope = Envelope(body=b'[[1], {}, {}]', content_type="application/json", content_encoding="utf-8",
                        headers={"task": "t.x", "id": f"id-{unique}"}, properties={"correlation_id": f"id-{unique}"},
                        exchange="", routing_key=f"q{unique}", queue=f"q{unique}")
    yield app, client, keys, envelope
    client.delete(f"DLQ.q{unique}")
    client.close()


def letterer_for(app, client, keys, redis_url=None):
    store = ShardedStore(client, Shards(keys.prefix, keys.global_keyprefix), events_max_length=100_000)
    return DeadLetterer(app, client, store, audit_ttl=60, redis_url=redis_url or app.conf.broker_url)


FAILURE = {"type": "ValueError", "message": "boom", "traceback": "Traceback..."}


def dead_letter(letterer, envelope, policy=None, delivery=3):
    return letterer.dead_letter(envelope, delivery=delivery, policy=policy or RedeliveryPolicy(),
                                reason="max_delivery_attempts", failure=FAILURE, worker="w@host")


def test_dead_letter_is_published_once_per_task_and_delivery(setup):
    app, client, keys, envelope = setup
    letterer = letterer_for(app, client, keys)
    assert dead_letter(letterer, envelope) == f"DLQ.{envelope.queue}"
    assert dead_letter(letterer, envelope) == f"DLQ.{envelope.queue}"   # redelivered copy: suppressed
    assert client.llen(f"DLQ.{envelope.queue}") == 1
    assert client.hget(keys.stats, "dead_letter_duplicates_suppressed") == b"1"
    letter = json.loads(client.lindex(f"DLQ.{envelope.queue}", 0))
    assert letter["headers"][H.REASON] == "max_delivery_attempts"
    assert letter["headers"][H.DELIVERY_COUNT] == 3
    assert letter["properties"]["correlation_id"] == envelope.task_id
    # A later delivery number of the same task is a different dead letter.
    dead_letter(letterer, envelope, delivery=4)
    assert client.llen(f"DLQ.{envelope.queue}") == 2


def test_pending_audit_is_published_again_never_lost(setup):
    app, client, keys, envelope = setup
    client.set(keys.audit(envelope.task_id, 3), b"pending")  # a worker died between publish and mark
    dead_letter(letterer_for(app, client, keys), envelope)
    assert client.llen(f"DLQ.{envelope.queue}") == 1
    assert client.get(keys.audit(envelope.task_id, 3)) == b"done"


def test_dead_letter_false_drops_logs_and_counts(setup, caplog):
    app, client, keys, envelope = setup
    with caplog.at_level(logging.WARNING, logger="celery_dlq.worker.deadletter.dead_letterer"):
        assert dead_letter(letterer_for(app, client, keys), envelope, RedeliveryPolicy(dead_letter=False)) is None
    assert client.llen(f"DLQ.{envelope.queue}") == 0
    assert client.hget(keys.stats, "dropped") == b"1"
    assert "dropping t.x" in caplog.text


def test_named_dead_letter_queue(setup):
    app, client, keys, envelope = setup
    name = f"graveyard-{envelope.queue}"
    try:
        dead_letter(letterer_for(app, client, keys), envelope, RedeliveryPolicy(dead_letter=name))
        assert client.llen(name) == 1
    finally:
        client.delete(name)


def test_a_raising_signal_receiver_loses_nothing(setup, caplog):
    app, client, keys, envelope = setup
    seen = []

    def broken(sender, **kwargs):
        seen.append(kwargs["reason"])
        raise RuntimeError("receiver bug")

    task_dead_lettered.connect(broken, weak=False)
    try:
        with caplog.at_level(logging.ERROR):
            dead_letter(letterer_for(app, client, keys), envelope)
    finally:
        task_dead_lettered.disconnect(broken)
    assert seen == ["max_delivery_attempts"]
    assert client.llen(f"DLQ.{envelope.queue}") == 1
    assert "receiver bug" in caplog.text


def test_broker_failure_raises_and_leaves_audit_pending(setup):
    app, client, keys, envelope = setup
    store_url = app.conf.broker_url   # the store (client) stays up
    app.conf.broker_url = "redis://127.0.0.1:1/0"  # nothing listens there
    app.conf.broker_connection_max_retries = 1
    letterer = letterer_for(app, client, keys, redis_url=store_url)
    with pytest.raises(Exception):
        dead_letter(letterer, envelope)
    assert client.get(keys.audit(envelope.task_id, 3)) == b"pending"


def test_audit_is_per_message_instance(setup):
    """A restored instance (same tag) is suppressed; a republished dead letter (new tag) is not lost."""
    from dataclasses import replace
    app, client, keys, envelope = setup
    letterer = letterer_for(app, client, keys)
    restored = replace(envelope, delivery_tag="tag-a")
    dead_letter(letterer, restored)
    dead_letter(letterer, restored)
    assert client.llen(f"DLQ.{envelope.queue}") == 1
    dead_letter(letterer, replace(envelope, delivery_tag="tag-b"))
    assert client.llen(f"DLQ.{envelope.queue}") == 2
