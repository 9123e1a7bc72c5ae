"""Dramatiq's side of benchmark 2: the same flaky task with Dramatiq's Retries middleware, on Redis.

    BENCH_BROKER   the benchmark's redis-server
    BENCH_PREFIX   Dramatiq's namespace, and the prefix of the done counter

Each message fails twice and succeeds on its third attempt; the third
attempt INCRs ``<prefix>:done``. Retries has min_backoff = max_backoff =
100 ms, so no exponential growth, but its jitter (``dramatiq.common.
compute_backoff``) brings a backoff above max_backoff back to 50-100% of
it: each retry waits 50 to 100 ms (about 75 on average), not the other
sides' 0.1 s.
"""
from __future__ import annotations

import os

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage

BROKER = os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/0")
PREFIX = os.environ.get("BENCH_PREFIX", "bench")
QUEUE = os.environ.get("BENCH_QUEUE", "default")

broker = RedisBroker(url=BROKER, namespace=f"dramatiq-{PREFIX}")
broker.add_middleware(CurrentMessage())
dramatiq.set_broker(broker)
_client = redis.Redis.from_url(BROKER)


@dramatiq.actor(queue_name=QUEUE, max_retries=2, min_backoff=100, max_backoff=100)
def flaky(i: int = 0) -> None:
    message = CurrentMessage.get_current_message()
    if message.options.get("retries", 0) < 2:
        raise ConnectionError("transient")
    _client.incr(f"{PREFIX}:done")


@dramatiq.actor(queue_name=QUEUE)
def ok(i: int = 0) -> None:
    """The success path: one attempt that INCRs ``<prefix>:done``."""
    _client.incr(f"{PREFIX}:done")
