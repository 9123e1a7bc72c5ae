"""The mover's publish path: what was sent before an error is acked, never released to be sent again."""
from __future__ import annotations

import base64
import json
import time

import pytest
import redis
from celery import Celery
from kombu import Producer

import celery_dlq
from celery_dlq.message import Envelope
from celery_dlq.worker.park.mover import MoverThread
from tests.unit.test_fetch import celery_message


@pytest.fixture
def publishing(redis_server, unique):
    """An app whose store is another database than its broker: the mover claims and publishes."""
    broker, store = redis_server.url.rsplit("/", 1)[0] + "/3", redis_server.url.rsplit("/", 1)[0] + "/4"
    app = Celery("publishing", broker=broker, set_as_current=False)
    app.conf.update(task_default_queue=f"q{unique}", dlq_key_prefix=f"mp{unique}", dlq_redis_url=store)
    runtime = celery_dlq.install(app)
    assert not runtime.config.direct
    yield app, runtime, f"q{unique}"
    for url in (broker, store):
        redis.Redis.from_url(url).flushdb()
    app.close()


def park(runtime, queue: str, n: int) -> list[str]:
    ids = []
    for i in range(n):
        msg = celery_message(task_id=f"task-{i}", tag=f"tag-{i}")
        envelope = Envelope(body=base64.b64decode(msg["body"]), content_type=msg["content-type"],
                            content_encoding=msg["content-encoding"], headers=msg["headers"],
                            properties={"correlation_id": f"task-{i}"}, exchange="", routing_key=queue, queue=queue)
        assert runtime.redis().sharded.home.store.park(f"task-{i}:2", envelope.dumps(), queue, time.time() - 1)
        ids.append(f"task-{i}")
    return ids


def test_without_publish_batches_a_failure_mid_batch_releases_only_what_was_not_sent(publishing, monkeypatch):
    app, runtime, queue = publishing
    park(runtime, queue, 5)
    monkeypatch.delattr(Producer, "batch", raising=False)    # kombu < 5.7: each publish goes out at once
    publish, calls = Envelope.publish, []

    def third_fails(self, producer):
        calls.append(self.task_id)
        if len(calls) == 3:
            raise redis.ConnectionError("the broker went away mid-batch")
        return publish(self, producer)

    monkeypatch.setattr(Envelope, "publish", third_fails)
    with pytest.raises(redis.ConnectionError):
        MoverThread(app, runtime.config, runtime.redis()).move_due()
    on_queue = [json.loads(raw)["headers"]["id"] for raw in runtime.redis().broker.lrange(queue, 0, -1)]
    store = runtime.redis().sharded.home.store
    assert sorted(on_queue) == sorted(calls[:2]), "the two sent before the error"
    assert store.count() == 3, "only the three not sent are given back"
    left = {entry.entry_id.split(":")[0] for entry in store.entries()}
    assert left.isdisjoint(on_queue), "a sent message is never released to be sent again"
