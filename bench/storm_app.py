"""The apps of bench/storm.py: a failing kind during an outage, and a healthy kind, on Celery or Dramatiq.

    BENCH_BROKER   the benchmark's redis-server
    BENCH_QUEUE    the queue (both kinds share it)
    BENCH_MODE     dlq_breaker  RedeliveryTask, circuit breaker on
                   dlq          RedeliveryTask, no breaker
                   celery       plain Celery, autoretry_for with retry_backoff (acks late, as the others)
    BENCH_PREFIX   dlq_key_prefix, and the prefix of the benchmark's own keys

``storm.failing(i)`` raises ConnectionError while ``<prefix>:outage_until``
is in the future, else adds ``i`` to ``<prefix>:ok`` (a set: lost and
duplicated runs are read from it and ``<prefix>:ok_runs``). Every attempt
INCRs ``<prefix>:attempts``. ``storm.healthy(sent_at)`` pushes its
queue-to-start latency to ``<prefix>:lat``. Every side retries with the same
backoff: 1 s doubling to 30 s, 20 retries (enough to outlast the outage).
"""
from __future__ import annotations

import os
import time

import redis
from celery import Celery, Task

BROKER = os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/0")
QUEUE = os.environ.get("BENCH_QUEUE", "storm")
MODE = os.environ.get("BENCH_MODE", "dlq_breaker")
PREFIX = os.environ.get("BENCH_PREFIX", "storm")
MODES = ("dlq_breaker", "dlq", "celery")
if MODE not in MODES:
    raise SystemExit(f"BENCH_MODE must be one of {MODES}, got {MODE!r}")
#: The retry schedule every side is given.
BACKOFF_FIRST, BACKOFF_MAX, RETRIES = 1.0, 30.0, 20
BREAKER = {"breaker": {"enabled": True, "min_failures": 20, "failure_ratio": 0.5, "cooldown": 5.0,
                       "cooldown_multiplier": 2.0, "max_cooldown": 30.0, "release_rate": 50.0,
                       "max_release_rate": 1000.0}}

app = Celery("storm", broker=BROKER, set_as_current=True)
app.conf.update(task_default_queue=QUEUE, task_ignore_result=True, worker_hijack_root_logger=False,
                broker_connection_retry_on_startup=True, task_acks_late=True)
_client = redis.Redis.from_url(BROKER)
options: dict = {}
Base: type[Task] = Task
if MODE.startswith("dlq"):
    from dataclasses import fields

    from celery_dlq import RedeliveryTask
    from celery_dlq.policy import RedeliveryPolicy

    app.conf.update(dlq_key_prefix=PREFIX)
    Base = RedeliveryTask
    breaker = BREAKER if MODE == "dlq_breaker" else {}
    if breaker and "breaker_min_failures" in {f.name for f in fields(RedeliveryPolicy)}:
        # an earlier package (bench/storm.py --before), from before the breaker's options were nested: flat names
        breaker = {"breaker": True, **{f"breaker_{name}": value for name, value in BREAKER["breaker"].items()
                                       if name != "enabled"}}
    options["redelivery_policy"] = {"redelivery_delay": BACKOFF_FIRST, "redelivery_multiplier": 2.0,
                                    "max_redelivery_delay": BACKOFF_MAX, "max_delivery_attempts": RETRIES + 1,
                                    "redelivery_collision_avoidance_factor": 0.2, **breaker}
else:
    options.update(autoretry_for=(ConnectionError,), retry_backoff=BACKOFF_FIRST, retry_backoff_max=BACKOFF_MAX,
                   retry_jitter=True, max_retries=RETRIES)


def outage() -> bool:
    until = _client.get(f"{PREFIX}:outage_until")
    return until is not None and float(until) > time.time()


@app.task(bind=True, base=Base, name="storm.failing", **options)
def failing(self, i: int = 0) -> None:
    _client.incr(f"{PREFIX}:attempts")
    if outage():
        raise ConnectionError("gateway down")
    pipe = _client.pipeline(transaction=False)
    pipe.sadd(f"{PREFIX}:ok", i)
    pipe.incr(f"{PREFIX}:ok_runs")
    pipe.execute()


@app.task(bind=True, base=Base, name="storm.healthy")
def healthy(self, sent_at: float = 0.0) -> None:
    _client.rpush(f"{PREFIX}:lat", time.time() - sent_at)
