"""The Celery app the integration tests run in real worker processes.

Configured from the environment so each test gets its own broker database,
queue and key prefix: DLQ_TEST_BROKER, DLQ_TEST_QUEUE, DLQ_TEST_PREFIX (and DLQ_TEST_REDIS
for the delivery log when the broker is not Redis).
Every task records each delivery in the Redis list ``<prefix>:log`` (JSON),
which is what the tests assert on.
"""
from __future__ import annotations

import json
import os
import signal
import time

import redis
from celery import Celery, signals

import celery_dlq
from celery_dlq import RedeliveryTask, delivery_count

BROKER = os.environ.get("DLQ_TEST_BROKER", "redis://127.0.0.1:6379/15")
QUEUE = os.environ.get("DLQ_TEST_QUEUE", "dlqtest")
PREFIX = os.environ.get("DLQ_TEST_PREFIX", "dlqtest")
#: Where deliveries are logged: the broker unless it is not Redis (a RabbitMQ broker).
STORE = os.environ.get("DLQ_TEST_REDIS", BROKER)

app = Celery("proj", broker=BROKER, set_as_current=True)
app.conf.update(
    task_default_queue=QUEUE,
    dlq_key_prefix=PREFIX,
    dlq_mover_interval=float(os.environ.get("DLQ_TEST_MOVER_INTERVAL", "0.05")),
    dlq_claim_lease=float(os.environ.get("DLQ_TEST_CLAIM_LEASE", "30")),
    worker_prefetch_multiplier=int(os.environ.get("DLQ_TEST_PREFETCH", "4")),
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
if os.environ.get("DLQ_TEST_CONF"):
    app.conf.update(json.loads(os.environ["DLQ_TEST_CONF"]))
if os.environ.get("DLQ_TEST_HIDE_INTERNAL"):   # tests/integration/test_internals.py: an internal that moved
    from tests.internals_hiding import hide
    hide(os.environ["DLQ_TEST_HIDE_INTERNAL"])
if os.environ.get("DLQ_TEST_STRATEGY_BUG"):   # tests/integration/test_fetch_errors.py: a bug in our strategy
    import celery_dlq.worker.run.strategy as _strategy

    _real_strategy = _strategy.strategy

    def _buggy_strategy(task, *args, **kwargs):
        handler = _real_strategy(task, *args, **kwargs)
        if task.name != os.environ["DLQ_TEST_STRATEGY_BUG"]:
            return handler

        def raises(*a, **kw):
            raise KeyError("an injected bug in the strategy")
        return raises

    _strategy.strategy = _buggy_strategy
celery_dlq.install(app)
if os.environ.get("DLQ_TEST_WEBHOOK"):   # tests/integration/test_webhook.py: the example receiver, as documented
    from examples.monitoring.webhook import WebhookNotifier
    WebhookNotifier(os.environ["DLQ_TEST_WEBHOOK"], timeout=5.0).connect()

_client = None
#: What ``task_dead_lettered`` carries, kept by the receiver below (tests/integration/test_recorded.py).
SIGNAL_FIELDS = ("task_id", "task_name", "original_queue", "dead_letter_queue", "reason", "exception",
                 "delivery_count")


def client() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(STORE)
    return _client


if os.environ.get("DLQ_TEST_SIGNALS"):   # every task_dead_lettered the worker sends, kept in <prefix>:signals
    @celery_dlq.task_dead_lettered.connect(weak=False)
    def _keep_dead_lettered(sender=None, **kwargs):
        client().rpush(f"{PREFIX}:signals",
                       json.dumps({"sender": sender, **{name: kwargs.get(name) for name in SIGNAL_FIELDS}}))


def record(task, **extra) -> int:
    count = delivery_count(task.request)
    client().rpush(f"{PREFIX}:log", json.dumps({
        "task": task.name, "id": task.request.id, "args": list(task.request.args or ()),
        "kwargs": dict(task.request.kwargs or {}), "delivery": count, "at": time.time(),
        "retries": task.request.retries, "pid": os.getpid(), "ppid": os.getppid(), **extra,
    }))
    return count


@app.task(bind=True, base=RedeliveryTask, name="proj.flaky",
          redelivery_policy={"redelivery_delay": 0.3, "redelivery_multiplier": 2,
                             "max_delivery_attempts": 5})
def flaky(self, fail_times, tag=None):
    if record(self) <= fail_times:
        raise ConnectionError(f"flaky failure, tag={tag}")
    return "ok"


@app.task(bind=True, base=RedeliveryTask, name="proj.always_fails",
          redelivery_policy={"redelivery_delay": 0.1, "max_delivery_attempts": 3})
def always_fails(self, n=0):
    record(self)
    raise ValueError(f"always fails #{n}")


@app.task(bind=True, base=RedeliveryTask, name="proj.charge",
          redelivery_policy={"redelivery_delay": 0.05, "max_delivery_attempts": 2})
def charge(self, n=0, kind="key"):
    """Two failures of one task, numbers varying in their messages (the failure groups' tests)."""
    record(self)
    if kind == "key":
        raise KeyError(f"user_{n}")
    raise ValueError(f"card {n} declined after {n * 7} ms")


@app.task(bind=True, base=RedeliveryTask, name="proj.not_retryable",
          redelivery_policy={"redelivery_delay": 0.1, "dead_letter_on": (KeyError,)})
def not_retryable(self):
    record(self)
    raise KeyError("missing")


@app.task(bind=True, base=RedeliveryTask, name="proj.poison",
          redelivery_policy={"redelivery_delay": 0.1, "max_delivery_attempts": 3})
def poison(self):
    record(self)
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(bind=True, base=RedeliveryTask, name="proj.slow_parked",
          redelivery_policy={"redelivery_delay": 2.0, "max_delivery_attempts": 2})
def slow_parked(self):
    if record(self) == 1:
        raise ConnectionError("come back in 2 s")


@app.task(bind=True, base=RedeliveryTask, name="proj.uses_retry",
          redelivery_policy={"max_delivery_attempts": 4})
def uses_retry(self):
    if record(self) < 3:
        raise self.retry(countdown=0.2, exc=TimeoutError("upstream timeout"))
    return "done"


@app.task(bind=True, base=RedeliveryTask, name="proj.noop")
def noop(self, i=0):
    record(self)
    return i


@app.task(bind=True, base=RedeliveryTask, name="proj.park_long",
          redelivery_policy={"redelivery_delay": 3600, "max_delivery_attempts": 2})
def park_long(self, i=0):
    raise ConnectionError("wait an hour")


@app.task(bind=True, base=RedeliveryTask, name="proj.hangs", time_limit=1,
          redelivery_policy={"redelivery_delay": 0.1, "max_delivery_attempts": 2})
def hangs(self):
    record(self)
    time.sleep(30)


@app.task(bind=True, base=RedeliveryTask, name="proj.soft_limited", soft_time_limit=0.5,
          redelivery_policy={"redelivery_delay": 0.1, "max_delivery_attempts": 2})
def soft_limited(self):
    record(self)
    time.sleep(30)


@app.task(bind=True, base=RedeliveryTask, name="proj.kills_worker",
          redelivery_policy={"redelivery_delay": 0.1, "max_delivery_attempts": 2})
def kills_worker(self):
    """Kills the worker's main process, not just its pool child (an OOM kill looks like this)."""
    record(self)
    os.kill(os.getppid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(bind=True, base=RedeliveryTask, name="proj.fixed_by_flag",
          redelivery_policy={"redelivery_delay": 0.1, "max_delivery_attempts": 2})
def fixed_by_flag(self, order_id=0):
    """Fails while the Redis key ``<prefix>:broken`` exists: deleting it is "deploying the fix"."""
    count = record(self)
    if client().exists(f"{PREFIX}:broken"):
        raise RuntimeError(f"bug not fixed yet (order {order_id})")
    return count


@signals.task_failure.connect
def _record_failure(sender=None, task_id=None, exception=None, **kwargs):
    """Every task_failure signal (sent wherever Celery records FAILURE): fired once per task, at the end."""
    client().rpush(f"{PREFIX}:failures", json.dumps({"task": getattr(sender, "name", None), "id": task_id,
                                                      "exception": type(exception).__name__, "pid": os.getpid()}))


@app.task(bind=True, base=RedeliveryTask, name="proj.replaced")
def replaced(self, n=0):
    """Replaces itself with proj.noop: Celery's replace() raises Ignore, which is no failure."""
    record(self)
    raise self.replace(noop.s(n))


@app.task(bind=True, base=RedeliveryTask, name="proj.rejects")
def rejects(self):
    """Rejects its own message without requeue: the task's own say, never a redelivery."""
    from celery.exceptions import Reject

    record(self)
    raise Reject("not for us", requeue=False)


@app.task(bind=True, base=RedeliveryTask, name="proj.requeues_once",
          redelivery_policy={"max_delivery_attempts": 1})
def requeues_once(self):
    """Puts its own message back the first time it runs (``Reject(requeue=True)``), then succeeds."""
    from celery.exceptions import Reject

    runs = client().incr(f"{PREFIX}:requeues:{self.request.id}")
    record(self, run=runs)
    if runs == 1:
        raise Reject("not yet", requeue=True)
    return "done"


@app.task(bind=True, base=RedeliveryTask, name="proj.celery_options", max_retries=1, autoretry_for=(ValueError,))
def celery_options(self):
    """Says its retries in Celery's own terms, with no redelivery_policy (docs/celery-options.md)."""
    record(self)
    raise ValueError("still failing")


@app.task(bind=True, base=RedeliveryTask, name="proj.waits_an_hour", redelivery_policy={"redelivery_delay": 3600})
def waits_an_hour(self):
    record(self)
    raise ValueError("later")


@app.task(bind=True, base=RedeliveryTask, name="proj.sleeps")
def sleeps(self, seconds=1.0):
    record(self)
    time.sleep(seconds)
    return seconds


@app.task(bind=True, base=RedeliveryTask, name="proj.burns")
def burns(self, seconds=1.0):
    """Keeps a CPU busy for ``seconds`` (a pool child at 100%)."""
    record(self)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return seconds


@app.task(bind=True, base=RedeliveryTask, name="proj.long_on_redelivery")
def long_on_redelivery(self, first=4.0, later=30.0):
    """Sleeps ``first`` seconds on its first delivery, ``later`` on any other."""
    seconds = first if record(self) == 1 else later
    time.sleep(seconds)
    return seconds


@app.task(bind=True, base=RedeliveryTask, name="proj.fails_slow_retry",
          redelivery_policy={"redelivery_delay": 5.0, "max_delivery_attempts": 3})
def fails_slow_retry(self):
    """Fails; its next delivery would come 5 s later (sent with a shorter ``expires``: dead-lettered at once)."""
    record(self)
    raise ConnectionError("come back in 5 s")


@app.task(bind=True, base=RedeliveryTask, name="proj.fails_retry_3s",
          redelivery_policy={"redelivery_delay": 3.0, "max_delivery_attempts": 3})
def fails_retry_3s(self):
    """Fails; parked for 3 s (sent with ``expires`` 4 s: parked, and expires if no mover moves it in time)."""
    record(self)
    raise ConnectionError("come back in 3 s")


@app.task(bind=True, base=RedeliveryTask, name="proj.retry_new_args",
          redelivery_policy={"max_delivery_attempts": 3})
def retry_new_args(self, step=0, until=2, note="first"):
    """Retries with new arguments (``self.retry(args=..., kwargs=...)``) until ``step`` reaches ``until``."""
    record(self)
    if step < until:
        raise self.retry(args=(step + 1,), kwargs={"until": until, "note": f"retry {step + 1}"}, countdown=0.1)
    return step


@app.task(bind=True, base=RedeliveryTask, name="proj.poison_slow_retry",
          redelivery_policy={"redelivery_delay": 5.0, "max_delivery_attempts": 3})
def poison_slow_retry(self):
    """Kills its pool process; the next delivery would come 5 s later."""
    record(self)
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(bind=True, base=RedeliveryTask, name="proj.retries_later")
def retries_later(self, countdown=5.0, with_exc=False):
    """Asks for a retry ``countdown`` seconds later (with an exception of its own when ``with_exc``)."""
    record(self)
    raise self.retry(countdown=countdown, exc=TimeoutError("upstream timeout") if with_exc else None)


@app.task(bind=True, base=RedeliveryTask, name="proj.retry_unencodable_args")
def retry_unencodable_args(self):
    """Retries with an argument JSON cannot encode (Celery's own retry() would fail to publish it)."""
    record(self)
    raise self.retry(args=(object(),), countdown=0.1)


# -- chords (tests/integration/test_chords.py) --------------------------------

@app.task(bind=True, base=RedeliveryTask, name="proj.tsum")
def tsum(self, values):
    """A chord body: each run's argument is logged in ``<prefix>:body`` (the tests count the runs)."""
    client().rpush(f"{PREFIX}:body", json.dumps({"values": values, "delivery": delivery_count(self.request),
                                                  "id": self.request.id}))
    return sum(v for v in values if isinstance(v, int))


@app.task(bind=True, base=RedeliveryTask, name="proj.chord_failed")
def chord_failed(self, task_id):
    """A chord body's errback (old style: the failed task's id): each run logged in ``<prefix>:errbacks``."""
    client().rpush(f"{PREFIX}:errbacks", json.dumps({"task_id": task_id}))


@app.task(bind=True, base=RedeliveryTask, name="proj.errback_bytes")
def errback_bytes(self, data):
    """An immutable errback whose argument is bytes (kombu's JSON carries them): each run logged as text."""
    client().rpush(f"{PREFIX}:errbacks", json.dumps({"bytes": data.decode(), "type": type(data).__name__}))


if os.environ.get("DLQ_TEST_KILL_AFTER_SUCCESS"):   # tests/integration/test_chords.py
    @signals.task_success.connect
    def _kill_after_success(sender=None, **kwargs):
        """The whole worker dies right after a task's success is stored (its chord told), before its ack."""
        task_id = getattr(getattr(sender, "request", None), "id", None)
        if task_id and client().delete(f"{PREFIX}:kill_after_success:{task_id}"):
            os.kill(os.getppid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)


# -- circuit breakers and snoozes (tests/integration/test_breakers.py) ---------------------------------

def _call_gateway(task, n):
    """The gateway tasks' one body: fails while ``<prefix>:gateway_down`` exists (the outage); each run logged."""
    down = bool(client().exists(f"{PREFIX}:gateway_down"))
    record(task, ok=not down)
    if down:
        raise ConnectionError(f"gateway down (order {n})")
    return n


@app.task(bind=True, base=RedeliveryTask, name="proj.gateway",
          redelivery_policy={"redelivery_delay": 0.2, "max_delivery_attempts": 10,
                             "breaker": {"enabled": True, "min_failures": 3, "cooldown": 4.0, "max_cooldown": 8.0,
                                         "release_rate": 2.0, "max_release_rate": 20.0}})
def gateway(self, n=0):
    """Fails while the Redis key ``<prefix>:gateway_down`` exists (the outage); each run logged."""
    return _call_gateway(self, n)


@app.task(bind=True, base=RedeliveryTask, name="proj.gateway_redrive",
          redelivery_policy={"redelivery_delay": 0.1, "max_delivery_attempts": 2,
                             "breaker": {"enabled": True, "min_failures": 40, "cooldown": 1.0, "max_cooldown": 2.0,
                                         "auto_redrive": True, "release_rate": 2.0, "max_release_rate": 20.0}})
def gateway_redrive(self, n=0):
    """:func:`gateway` whose dead letters are redriven when its breaker closes; each run logged."""
    return _call_gateway(self, n)


@app.task(bind=True, base=RedeliveryTask, name="proj.gateway_flaps",
          redelivery_policy={"max_delivery_attempts": 1,
                             "breaker": {"enabled": True, "min_failures": 6, "cooldown": 1.0, "max_cooldown": 2.0,
                                         "auto_redrive": True, "release_rate": 1.0, "max_release_rate": 2.0}})
def gateway_flaps(self, n=0):
    """:func:`gateway` dead-lettered at its first failure, redriven at 1/s when its breaker closes."""
    return _call_gateway(self, n)


@app.task(bind=True, base=RedeliveryTask, name="proj.snoozes",
          redelivery_policy={"max_delivery_attempts": 2, "max_snoozes": 3})
def snoozes(self, times=1, seconds=0.1):
    """Snoozes ``times`` times (rate limited), then succeeds; each run logged with its snooze count."""
    snoozed = int(self.request.get("x-dlq-snoozes") or 0)
    record(self, snoozed=snoozed)
    if snoozed < times:
        self.snooze(seconds)
    return snoozed


# -- the table (tests/integration/test_chord_table.py): delay 0.2 s, 3 attempts ----------

_TABLE_POLICY = {"redelivery_delay": 0.2, "max_delivery_attempts": 3}


@app.task(bind=True, base=RedeliveryTask, name="proj.add")
def add(self, x, y):
    record(self)
    return x + y


@app.task(bind=True, base=RedeliveryTask, name="proj.flaky_echo", redelivery_policy=_TABLE_POLICY)
def flaky_echo(self, value):
    """Fails its first two deliveries, then returns ``value`` (the issue's ``flaky``)."""
    if record(self) <= 2:
        raise ConnectionError(f"flaky failure ({value})")
    return value


@app.task(bind=True, base=RedeliveryTask, name="proj.broken_echo", redelivery_policy=_TABLE_POLICY)
def broken_echo(self, value):
    """Fails while ``<prefix>:broken`` exists (three deliveries, then dead-lettered); then returns ``value``."""
    record(self)
    if client().exists(f"{PREFIX}:broken"):
        raise RuntimeError(f"bug not fixed yet ({value})")
    return value
