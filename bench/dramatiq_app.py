"""Dramatiq's side of benchmark 2: the same flaky task with Dramatiq's Retries middleware, on Redis.

    BENCH_BROKER   the benchmark's redis-server
    BENCH_PREFIX   Dramatiq's namespace, and the prefix of the done counter
    BENCH_ATTEMPTS attempts per flaky message (3)
    BENCH_COUNTER_URL where the done counter is kept (default BENCH_BROKER; bench/rtt.py keeps it off
                   the delayed path, so the task's own INCR is neither delayed nor counted)

Each message fails all but its last attempt (twice by default); the last
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
ATTEMPTS = int(os.environ.get("BENCH_ATTEMPTS", "3"))

broker = RedisBroker(url=BROKER, namespace=f"dramatiq-{PREFIX}")
broker.add_middleware(CurrentMessage())
dramatiq.set_broker(broker)
_client = redis.Redis.from_url(os.environ.get("BENCH_COUNTER_URL", BROKER))


@dramatiq.actor(queue_name=QUEUE, max_retries=ATTEMPTS - 1, min_backoff=100, max_backoff=100)
def flaky(i: int = 0) -> None:
    message = CurrentMessage.get_current_message()
    if message.options.get("retries", 0) < ATTEMPTS - 1:
        raise ConnectionError("transient")
    _client.incr(f"{PREFIX}:done")


@dramatiq.actor(queue_name=QUEUE, max_retries=ATTEMPTS - 1, min_backoff=100, max_backoff=100)
def warm(fails: int = 0) -> None:
    """A warm-up message (bench/failure_path.py): fails ``fails`` times as ``flaky`` does, then records the
    worker process that ran it in ``<prefix>:warm`` and INCRs ``<prefix>:done``."""
    if CurrentMessage.get_current_message().options.get("retries", 0) < fails:
        raise ConnectionError("transient")
    _client.sadd(f"{PREFIX}:warm", os.getpid())
    _client.incr(f"{PREFIX}:done")


@dramatiq.actor(queue_name=QUEUE)
def ok(i: int = 0) -> None:
    """The success path: one attempt that INCRs ``<prefix>:done``."""
    _client.incr(f"{PREFIX}:done")
