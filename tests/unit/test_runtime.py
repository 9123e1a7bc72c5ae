"""The runtime's parts: connections made once per process, the consumer lent by its bootstep."""
from __future__ import annotations

from types import SimpleNamespace

from celery import Celery

import celery_dlq
from celery_dlq.worker import connections
from celery_dlq.worker.connections import Connections, PerProcess
from celery_dlq.worker.steps import bound_steps


def test_per_process_makes_its_value_once_in_each_process(monkeypatch):
    made = []
    per_process = PerProcess(lambda: made.append(object()) or made[-1])
    monkeypatch.setattr(connections.os, "getpid", lambda: 100)
    first = per_process()
    assert per_process() is first and len(made) == 1
    monkeypatch.setattr(connections.os, "getpid", lambda: 101)   # a forked child: never its parent's sockets
    child = per_process()
    assert child is not first and per_process() is child and len(made) == 2


def test_a_runtime_connects_nothing_until_used_and_then_once_per_process():
    app = Celery("parts", broker="redis://localhost:1/0", set_as_current=False)
    runtime = celery_dlq.install(app)
    assert runtime.redis._made is None
    redis = runtime.redis()
    assert isinstance(redis, Connections) and runtime.redis() is redis
    assert redis.deadletterer.recorder.events is runtime.events and runtime.parking.redis is runtime.redis


def test_the_bind_consumer_step_lends_the_consumer_to_the_request_and_the_task_events():
    app = Celery("bound", broker="redis://localhost:1/0", set_as_current=False)
    runtime = celery_dlq.install(app)
    assert runtime.consumer.timer is None and runtime.consumer.event_dispatcher is None
    [step] = [step for step in bound_steps(runtime) if step.__name__ == "BindConsumer"]
    c = SimpleNamespace(timer=object(), event_dispatcher=object())
    step(c).create(c)
    assert runtime.consumer.timer is c.timer and runtime.events.consumer.event_dispatcher is c.event_dispatcher
    c.event_dispatcher = object()   # the consumer reconnected: a new dispatcher, read at each send
    assert runtime.events.consumer.event_dispatcher is c.event_dispatcher


def test_building_the_task_strategy_changes_nothing_on_the_runtime():
    """Celery builds a strategy per task at each consumer start: it must take, never set, the shared parts."""
    from celery_dlq.worker.run.strategy import strategy

    app = Celery("strategy", broker="redis://localhost:1/0", set_as_current=False)

    @app.task(base=celery_dlq.RedeliveryTask, shared=False)
    def work():
        return None

    runtime = celery_dlq.install(app, validate=False)
    parts = (runtime, runtime.config, runtime.consumer, runtime.events, runtime.parking)
    before = [dict(vars(part)) for part in parts]
    consumer = SimpleNamespace(
        hostname="w@h", connection_errors=(), event_dispatcher=None, timer=SimpleNamespace(call_at=None),
        apply_eta_task=None, disable_rate_limits=True, task_buckets={}, on_task_request=None, _limit_task=None,
        _limit_post_eta=None, pool=SimpleNamespace(apply_async=None), controller=SimpleNamespace(state=SimpleNamespace(revoked=set())))
    assert callable(strategy(work, app, consumer))
    assert [dict(vars(part)) for part in parts] == before
