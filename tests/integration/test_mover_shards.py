"""The mover over a sharded store: every shard served, a failing shard does not stop the others."""
from __future__ import annotations

import json
import time

import pytest
import redis
from celery import Celery

import celery_dlq
from celery_dlq.storage.store import DirectPayload
from celery_dlq.worker.park.mover import MoverThread
from tests.unit.test_fetch import celery_message


@pytest.fixture
def sharded(redis_server, unique):
    app = Celery("sharded", broker=redis_server.url, set_as_current=False)
    app.conf.update(task_default_queue=f"q{unique}", dlq_key_prefix=f"ms{unique}", dlq_store_shards=3)
    runtime = celery_dlq.install(app)
    yield app, runtime, f"q{unique}"
    client = redis.Redis.from_url(redis_server.url)
    for key in client.scan_iter(match=f"{{ms{unique}*"):
        client.delete(key)
    client.delete(f"q{unique}")
    app.close()


def park_spread(runtime, queue: str, n: int) -> dict[int, list[str]]:
    """Park n due direct-format entries; task id -> shard index."""
    by_shard: dict[int, list[str]] = {}
    for i in range(n):
        task_id = f"task-{i}"
        element = json.dumps(celery_message(task_id=task_id, tag=f"tag-{i}")).encode()
        payload = DirectPayload(queue, queue, "shop.charge", element).dumps()
        assert runtime.redis().shard(task_id).store.park(f"{task_id}:2", payload, queue, time.time() - 1)
        by_shard.setdefault(runtime.redis().shards.index(task_id), []).append(task_id)
    return by_shard


def test_the_mover_serves_every_shard_and_a_failing_one_does_not_stop_the_rest(sharded, monkeypatch):
    app, runtime, queue = sharded
    by_shard = park_spread(runtime, queue, 30)
    assert sorted(by_shard) == [0, 1, 2]
    broken = runtime.redis().sharded.of(by_shard[1][0]).store

    def down(*args, **kwargs):
        raise redis.ConnectionError("this shard's master is down")

    monkeypatch.setattr(broken, "move_due", down)
    monkeypatch.setattr(broken, "claim_due", down)
    mover = MoverThread(app, runtime.config, runtime.redis())
    with pytest.raises(redis.ConnectionError):
        mover.move_due()
    moved = {json.loads(raw)["headers"]["id"] for raw in runtime.redis().client.lrange(queue, 0, -1)}
    assert moved == set(by_shard[0] + by_shard[2])        # the other shards were served all the same
    assert broken.count() == len(by_shard[1])

    monkeypatch.undo()
    assert mover.move_due() == len(by_shard[1])
    assert runtime.redis().client.llen(queue) == 30 and runtime.redis().sharded.count() == 0
