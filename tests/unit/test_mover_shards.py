"""The mover over a sharded store: every shard served, a failing shard does not stop the others."""
from __future__ import annotations

import json
import time

import pytest
import redis
from celery import Celery

import celery_dlq
from celery_dlq.redis.store import DirectPayload
from celery_dlq.worker.mover import MoverThread
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
        assert runtime.shard(task_id).store.park(f"{task_id}:2", payload, queue, time.time() - 1)
        by_shard.setdefault(runtime.shards.index(task_id), []).append(task_id)
    return by_shard


def test_the_mover_serves_every_shard_and_a_failing_one_does_not_stop_the_rest(sharded, monkeypatch):
    app, runtime, queue = sharded
    by_shard = park_spread(runtime, queue, 30)
    assert sorted(by_shard) == [0, 1, 2]
    broken = runtime.sharded.of(by_shard[1][0]).store

    def down(*args, **kwargs):
        raise redis.ConnectionError("this shard's master is down")

    monkeypatch.setattr(broken, "move_due", down)
    monkeypatch.setattr(broken, "claim_due", down)
    mover = MoverThread(app, runtime)
    with pytest.raises(redis.ConnectionError):
        mover.move_due()
    moved = {json.loads(raw)["headers"]["id"] for raw in runtime.client.lrange(queue, 0, -1)}
    assert moved == set(by_shard[0] + by_shard[2])        # the other shards were served all the same
    assert broken.count() == len(by_shard[1])

    monkeypatch.undo()
    assert mover.move_due() == len(by_shard[1])
    assert runtime.client.llen(queue) == 30 and runtime.sharded.count() == 0


def test_the_mover_wakes_for_an_entry_due_before_its_next_tick(sharded):
    app, runtime, queue = sharded
    mover = MoverThread(app, runtime)                       # interval 0.2 s
    started = time.monotonic()
    assert 0.19 <= mover._next_wait(started) <= 0.2         # nothing parked: the next tick
    park_spread(runtime, queue, 1)                          # due a second ago
    assert mover._next_wait(started) == pytest.approx(0.02)  # overdue: as soon as allowed, never a busy loop
    runtime.sharded.of("task-0").store.remove("task-0:2")
    element = json.dumps(celery_message(task_id="soon", tag="t")).encode()
    runtime.shard("soon").store.park("soon:2", DirectPayload(queue, queue, "shop.charge", element).dumps(), queue,
                                     time.time() + 0.08)
    assert 0.06 <= mover._next_wait(time.monotonic()) <= 0.082   # due in 80 ms: woken then, not at 200 ms
    runtime.shard("soon").store.remove("soon:2")
    runtime.shard("later").store.park("later:2", DirectPayload(queue, queue, "shop.charge", element).dumps(), queue,
                                      time.time() + 10)
    assert 0.19 <= mover._next_wait(time.monotonic()) <= 0.2     # due after the next tick: the tick
