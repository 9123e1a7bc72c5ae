"""Dramatiq's side of bench/storm.py: the same two kinds, retried by its Retries middleware (1 s to 30 s, 20)."""
from __future__ import annotations

import os
import time

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

BROKER = os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/0")
PREFIX = os.environ.get("BENCH_PREFIX", "storm")
QUEUE = os.environ.get("BENCH_QUEUE", "storm")

broker = RedisBroker(url=BROKER, namespace=f"dramatiq-{PREFIX}")
dramatiq.set_broker(broker)
_client = redis.Redis.from_url(BROKER)


@dramatiq.actor(queue_name=QUEUE, max_retries=20, min_backoff=1000, max_backoff=30000)
def failing(i: int = 0) -> None:
    _client.incr(f"{PREFIX}:attempts")
    until = _client.get(f"{PREFIX}:outage_until")
    if until is not None and float(until) > time.time():
        raise ConnectionError("gateway down")
    pipe = _client.pipeline(transaction=False)
    pipe.sadd(f"{PREFIX}:ok", i)
    pipe.incr(f"{PREFIX}:ok_runs")
    pipe.execute()


@dramatiq.actor(queue_name=QUEUE)
def healthy(sent_at: float = 0.0) -> None:
    _client.rpush(f"{PREFIX}:lat", time.time() - sent_at)
