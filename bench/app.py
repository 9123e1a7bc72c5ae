"""The Celery app the benchmark workers run, configured from the environment.

    BENCH_BROKER   broker URL (the benchmark's own redis-server)
    BENCH_QUEUE    the queue the worker consumes
    BENCH_MODE     celery          plain Celery, default settings (acks early)
                   celery_late     plain Celery with acks_late (what RedeliveryTask implies)
                   dlq             RedeliveryTask, persist_delivery_count_before_delivery on (the default)
                   dlq_nopersist   RedeliveryTask, persist_delivery_count_before_delivery off
                   dlq_kombufetch  as dlq, but fetching with kombu's own Redis transport (dlq_fetch_transport off)
    BENCH_PREFIX   dlq_key_prefix, and the prefix of the benchmark's own counters
    BENCH_CONF     optional JSON merged into app.conf
    BENCH_ATTEMPTS attempts of ``bench.flaky`` (default 3: it fails twice, then succeeds)

In the ``celery*`` modes celery_dlq is not even imported, so the plain side
carries no trace of the extension.
"""
from __future__ import annotations

import json
import os
import time

import redis
from celery import Celery, Task

BROKER = os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/0")
QUEUE = os.environ.get("BENCH_QUEUE", "bench")
MODE = os.environ.get("BENCH_MODE", "celery")
PREFIX = os.environ.get("BENCH_PREFIX", "bench")
MODES = ("celery", "celery_late", "dlq", "dlq_nopersist", "dlq_kombufetch")
if MODE not in MODES:
    raise SystemExit(f"BENCH_MODE must be one of {MODES}, got {MODE!r}")
DLQ = MODE.startswith("dlq")

#: how long a failed attempt waits (benchmark 2) and the one-hour park (benchmark 3)
FLAKY_DELAY = 0.1
#: ``bench.flaky``'s attempts: it fails all but the last
ATTEMPTS = int(os.environ.get("BENCH_ATTEMPTS", "3"))
PARK_DELAY = 3600.0
DONE_KEY = f"{PREFIX}:done"

app = Celery("bench", broker=BROKER, set_as_current=True)
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
    task_acks_late=MODE == "celery_late",
)
if DLQ:
    import celery_dlq
    from celery_dlq import RedeliveryTask, delivery_count

    app.conf.update(
        dlq_key_prefix=PREFIX,
        dlq_default_policy={"persist_delivery_count_before_delivery": MODE in ("dlq", "dlq_kombufetch")},
        dlq_fetch_transport=MODE != "dlq_kombufetch",
    )
    Base: type[Task] = RedeliveryTask
else:
    Base = Task
if os.environ.get("BENCH_CONF"):
    app.conf.update(json.loads(os.environ["BENCH_CONF"]))

_client: tuple[int, redis.Redis] | None = None


def client() -> redis.Redis:
    global _client
    if _client is None or _client[0] != os.getpid():
        _client = (os.getpid(), redis.Redis.from_url(BROKER))
    return _client[1]


@app.task(base=Base, name="bench.noop")
def noop(i=0):
    return None


@app.task(base=Base, name="bench.ok")
def ok(i=0):
    """The success path of bench/failure_path.py: one attempt that counts itself."""
    client().incr(DONE_KEY)


@app.task(base=Base, name="bench.stamp")
def stamp(sent_at):
    """How long a message took from its publish (``sent_at``, unix seconds) to its task (bench/scale.py)."""
    client().rpush(f"{PREFIX}:pickup", f"{time.time() - sent_at:.6f}")


@app.task(bind=True, base=Base, name="bench.sleeps")
def sleeps(self, token, seconds):
    """A long task (bench/recovery.py): records each start in ``{PREFIX}:starts:<token>`` (unix time, the
    worker's node name and main pid, celery-dlq's delivery count), then waits ``seconds`` or until the
    benchmark pushes to ``{PREFIX}:release:<token>`` (one BLPOP, on a client whose socket timeout outlasts it)."""
    record = {"at": time.time(), "worker": self.request.hostname, "pid": os.getppid(),
              "delivery": delivery_count(self.request) if DLQ else None}
    client().rpush(f"{PREFIX}:starts:{token}", json.dumps(record))
    with redis.Redis.from_url(BROKER, socket_timeout=seconds + 30) as waiting:
        waiting.blpop([f"{PREFIX}:release:{token}"], timeout=seconds)


if DLQ:
    @app.task(bind=True, base=Base, name="bench.flaky",
              redelivery_policy={"redelivery_delay": FLAKY_DELAY, "max_delivery_attempts": ATTEMPTS})
    def flaky(self, i=0):
        if delivery_count(self.request) < ATTEMPTS:
            raise ConnectionError("transient")
        client().incr(DONE_KEY)

    @app.task(bind=True, base=Base, name="bench.park_long",
              redelivery_policy={"redelivery_delay": PARK_DELAY, "max_delivery_attempts": 2})
    def park_long(self, i=0):
        raise ConnectionError("come back in an hour")

    celery_dlq.install(app)
else:
    @app.task(bind=True, base=Base, name="bench.flaky", max_retries=ATTEMPTS - 1)
    def flaky(self, i=0):
        if self.request.retries < ATTEMPTS - 1:
            raise self.retry(countdown=FLAKY_DELAY, exc=ConnectionError("transient"))
        client().incr(DONE_KEY)

    @app.task(bind=True, base=Base, name="bench.park_long", max_retries=1)
    def park_long(self, i=0):
        if self.request.retries < 1:
            raise self.retry(countdown=PARK_DELAY, exc=ConnectionError("come back in an hour"))
