"""Celery task events of dead letters (``task-dead-lettered``): what is sent, when not, and what Celery's
events State (Flower's) keeps of them. End to end with a real worker and Flower: tests/integration/test_flower.py.
"""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import redis
from celery import Celery
from celery.events.state import State

from celery_dlq import RedeliveryPolicy
from celery_dlq.message import Envelope
from celery_dlq.storage.keys import Keys
from celery_dlq.worker.run.events import DEAD_LETTERED, TaskEvents, failed_exception
from tests.integration.test_deadletter import dead_letter, letterer_for


@pytest.fixture
def setup(redis_server, unique):
    """An app on the test run's redis-server as broker, a key prefix and one message (as test_deadletter.py)."""
    app = Celery("ev", broker=redis_server.url, set_as_current=False)
    client = redis.Redis.from_url(redis_server.url)
    envelope = Envelope(body=b'[[1], {}, {}]', content_type="application/json", content_encoding="utf-8",
                        headers={"task": "t.x", "id": f"id-{unique}"}, properties={"correlation_id": f"id-{unique}"},
                        exchange="", routing_key=f"q{unique}", queue=f"q{unique}")
    yield app, client, Keys(f"ev{unique}"), envelope
    client.delete(f"DLQ.q{unique}")
    client.close()


class Dispatcher:
    """Records what a worker consumer's ``EventDispatcher`` is asked to send."""

    def __init__(self, enabled: bool = True, fails: bool = False) -> None:
        self.enabled, self.fails, self.sent = enabled, fails, []

    def send(self, type_, **fields):
        if self.fails:
            raise ConnectionError("broker gone")
        self.sent.append((type_, fields))


def events_for(app, dispatcher) -> TaskEvents:
    events = TaskEvents(app)
    events.consumer = SimpleNamespace(event_dispatcher=dispatcher)
    return events


def test_a_dead_letter_sends_task_dead_lettered(setup):
    app, client, keys, envelope = setup
    dispatcher = Dispatcher()
    letterer = letterer_for(app, client, keys)
    letterer.recorder.events = events_for(app, dispatcher)
    dead_letter(letterer, envelope)
    assert dispatcher.sent == [(DEAD_LETTERED, {
        "uuid": envelope.task_id, "name": "t.x", "dlq": f"DLQ.{envelope.queue}", "queue": envelope.queue,
        "reason": "max_delivery_attempts", "delivery_count": 3, "exception_type": "ValueError"})]
    dead_letter(letterer, envelope)   # a redelivered copy of a message already dead-lettered: no second event
    assert len(dispatcher.sent) == 1


def test_a_dropped_message_sends_it_with_no_dlq(setup):
    app, client, keys, envelope = setup
    dispatcher = Dispatcher()
    letterer = letterer_for(app, client, keys)
    letterer.recorder.events = events_for(app, dispatcher)
    dead_letter(letterer, envelope, policy=RedeliveryPolicy(dead_letter=False))
    ((type_, fields),) = dispatcher.sent
    assert (type_, fields["dlq"], fields["reason"]) == (DEAD_LETTERED, None, "max_delivery_attempts")


def test_a_failing_dispatcher_loses_nothing(setup, caplog):
    app, client, keys, envelope = setup
    letterer = letterer_for(app, client, keys)
    letterer.recorder.events = events_for(app, Dispatcher(fails=True))
    with caplog.at_level(logging.WARNING, logger="celery_dlq.worker.run.events"):
        assert dead_letter(letterer, envelope) == f"DLQ.{envelope.queue}"
    assert client.llen(f"DLQ.{envelope.queue}") == 1
    assert "could not send the task-dead-lettered event of t.x" in caplog.text


def test_nothing_is_sent_while_events_are_disabled(setup):
    app, *_ = setup
    dispatcher = Dispatcher(enabled=False)
    events_for(app, dispatcher).dead_lettered("id-1", "t.x", dlq="DLQ.q", queue="q", reason="non_retryable",
                                              delivery=1, exception_type="KeyError")
    assert dispatcher.sent == []


def test_outside_a_worker_dead_letters_go_out_without_events(setup):
    """A process with no consumer (a script calling the runtime) has no dispatcher: nothing to send, no error."""
    app, client, keys, envelope = setup
    letterer = letterer_for(app, client, keys)
    letterer.recorder.events = TaskEvents(app)
    assert dead_letter(letterer, envelope) == f"DLQ.{envelope.queue}"
    assert client.llen(f"DLQ.{envelope.queue}") == 1


def test_a_task_with_send_events_false_sends_none(setup):
    app, *_ = setup

    @app.task(name="t.quiet", send_events=False)
    def quiet():
        return None

    dispatcher = Dispatcher()
    events = events_for(app, dispatcher)
    events.redelivery_scheduled("id-1", "t.quiet", delivery=2, due=1.0, queue="q", exception_type="KeyError")
    events.redelivery_scheduled("id-2", "t.other", delivery=2, due=1.0, queue="q", exception_type="KeyError")
    assert [fields["uuid"] for _, fields in dispatcher.sent] == ["id-2"]


def test_the_failed_events_exception_names_the_dlq_and_reason():
    assert failed_exception("ValueError('x')", "DLQ.orders", "max_delivery_attempts", 3) == \
        "ValueError('x') [celery-dlq: dead-lettered to DLQ.orders, reason max_delivery_attempts, delivery 3]"
    assert failed_exception("KeyError('k')", None, "non_retryable", 1) == \
        "KeyError('k') [celery-dlq: dropped (dead_letter=False), reason non_retryable, delivery 1]"


def event(type_, clock, **fields):
    return {"type": type_, "uuid": "id-1", "hostname": "w1@h", "timestamp": 100.0 + clock, "clock": clock,
            "local_received": 100.0 + clock, **fields}


@pytest.mark.parametrize("dead_lettered_first", [True, False])
def test_celerys_events_state_merges_the_fields_but_serves_only_its_own(dead_lettered_first):
    """What Flower keeps (its State is Celery's): the task stays FAILURE; ``as_dict()`` omits custom fields."""
    letter = event(DEAD_LETTERED, 3, name="t.x", dlq="DLQ.q", queue="q", reason="max_delivery_attempts",
                   delivery_count=3, exception_type="ValueError")
    failed = event("task-failed", 4, exception=failed_exception("ValueError('x')", "DLQ.q", "max_delivery_attempts",
                                                                3))
    state = State()
    for e in [event("task-received", 1, name="t.x"), event("task-started", 2)] + \
            ([letter, failed] if dead_lettered_first else [failed, letter]):
        state.event(e)
    task = state.tasks["id-1"]
    assert task.state == "FAILURE"
    assert (task.dlq, task.reason) == ("DLQ.q", "max_delivery_attempts")
    served = task.as_dict()
    assert "dlq" not in served and "reason" not in served
    assert "dead-lettered to DLQ.q, reason max_delivery_attempts" in served["exception"]


def test_with_no_failed_event_after_it_the_task_shows_the_custom_state():
    """A poison message dead-lettered before it runs again: its last event was task-retried (parked)."""
    state = State()
    for e in [event("task-received", 1, name="t.x"), event("task-started", 2),
              event("task-retried", 3, exception="WorkerLostError()"),
              event(DEAD_LETTERED, 4, name="t.x", dlq="DLQ.q", queue="q", reason="worker_lost", delivery_count=3,
                    exception_type="billiard.exceptions.WorkerLostError")]:
        state.event(e)
    assert state.tasks["id-1"].state == "DEAD-LETTERED"
    assert state.tasks["id-1"].as_dict()["state"] == "DEAD-LETTERED"
