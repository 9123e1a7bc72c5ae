"""Counters are written by their own bootstep, on a timer of its own: a flush that fails never delays moving."""
from __future__ import annotations

import base64
import logging
import time
from types import SimpleNamespace

import pytest
import redis
from celery import Celery

import celery_dlq
from celery_dlq.message import Envelope
from celery_dlq.storage.counters import DeliveryCounters
from celery_dlq.worker.park.mover import MoverThread
from celery_dlq.worker.steps import FlushCounts, bound_steps
from tests.unit.test_fetch import celery_message


@pytest.fixture
def worker_app(redis_server, unique):
    app = Celery("flush", broker=redis_server.url, set_as_current=False)
    # A mover that backs off after an error waits dlq_mover_interval (5 s here) before its next pass.
    app.conf.update(task_default_queue=f"q{unique}", dlq_key_prefix=f"fc{unique}", dlq_mover_interval=5.0,
                    dlq_mover_lease=1.2, dlq_heartbeat_interval=0.1)
    runtime = celery_dlq.install(app)
    yield app, runtime, f"q{unique}"
    client = redis.Redis.from_url(redis_server.url)
    for key in [*client.scan_iter(match=f"*fc{unique}*"), f"q{unique}"]:
        client.delete(key)
    app.close()


def flush_step(runtime) -> FlushCounts:
    [step] = [step for step in bound_steps(runtime) if step.__name__ == "FlushCounts"]
    return step(SimpleNamespace())


def failing_flushes(monkeypatch) -> list[float]:
    calls: list[float] = []

    def flush(self, batch: int = 1000) -> int:
        calls.append(time.monotonic())
        raise redis.ConnectionError("the counters' flush failed")

    monkeypatch.setattr(DeliveryCounters, "flush", flush)
    return calls


def test_a_counters_flush_that_raises_does_not_delay_a_due_retrys_move(worker_app, monkeypatch):
    app, runtime, queue = worker_app
    flushes = failing_flushes(monkeypatch)
    msg = celery_message(task_id="late-1", tag="tag-1")
    envelope = Envelope(body=base64.b64decode(msg["body"]), content_type=msg["content-type"],
                        content_encoding=msg["content-encoding"], headers=msg["headers"],
                        properties={"correlation_id": "late-1"}, exchange="", routing_key=queue, queue=queue)
    due = time.time() + 1.0
    assert runtime.redis().store.park("late-1:2", envelope.dumps(), queue, due)
    step, c = flush_step(runtime), SimpleNamespace()
    mover = MoverThread(app, runtime.config, runtime.redis())
    step.start(c)
    mover.start()
    try:
        while runtime.redis().client.llen(queue) == 0 and time.time() < due + 6:
            time.sleep(0.02)
        moved_at = time.time()
    finally:
        mover.stop()
        step.stop(c)
    assert runtime.redis().client.llen(queue) == 1 and runtime.redis().store.count() == 0
    assert moved_at - due < 1.0, f"moved {moved_at - due:.2f}s late: a failed flush backed the mover off"
    assert len(flushes) >= 3, "the failing flush ran, on its own timer, while the mover moved"


def test_the_flush_step_flushes_on_its_timer_and_once_more_when_it_stops(worker_app, monkeypatch, caplog):
    _, runtime, _ = worker_app
    flushes = failing_flushes(monkeypatch)
    step, c = flush_step(runtime), SimpleNamespace()
    with caplog.at_level(logging.ERROR, logger="celery_dlq.worker.steps"):
        step.start(c)
        time.sleep(0.35)
        on_timer = len(flushes)
        step.stop(c)               # raises nothing: logged
    assert on_timer >= 2 and len(flushes) == on_timer + 1
    assert "could not delete the counters of acknowledged messages" in caplog.text
    time.sleep(0.25)
    assert len(flushes) == on_timer + 1, "the timer stopped with the step"
