"""Real workers in subprocesses, against the test run's own redis-server."""
from __future__ import annotations

import base64
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from celery import Celery

from celery_dlq.message import Envelope
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.store import ParkedStore

ROOT = Path(__file__).resolve().parents[2]
#: The argument of the noop canaries of ``Harness.after_a_mover_pass``.
CANARY = "canary"
_db_counter = itertools.cycle(range(1, 16))


@pytest.fixture
def any_redis(real_redis):
    """The test run's redis-server: the tests under on_redis/ take it where tests/unit gives fakeredis."""
    return real_redis


@pytest.fixture
def emptied_any_redis(any_redis):
    """As ``any_redis``, for tests that read the whole database: emptied after the test."""
    yield any_redis
    any_redis.flushdb()


class Worker:
    """A `celery worker` subprocess (prefork) for the test app in tests/integration/proj.py."""

    #: Worker options after the fixed ones (a test that needs events passes ``("-E",)`` with heartbeats on).
    options: tuple[str, ...] = ("--without-heartbeat", "--without-mingle", "--without-gossip")
    #: The app module given to ``-A`` (tests/contract/proj.py adds tasks of its own to this one's).
    app: str = "tests.integration.proj"
    #: The pool (``solo`` runs tasks in the worker's main process).
    pool: str = "prefork"

    def __init__(self, env: dict, concurrency: int = 2, name: str = "w1", log_path: Path | None = None,
                 cwd: Path = ROOT):
        self.env, self.concurrency, self.name, self.log_path, self.cwd = env, concurrency, name, log_path, cwd
        self.proc: subprocess.Popen | None = None
        self._terminated = False

    @staticmethod
    def root() -> Path:
        """The checkout the tests run from."""
        return ROOT

    def start(self, wait_ready: bool = True) -> "Worker":
        self._log, self._terminated = open(self.log_path, "ab"), False
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", self.app, "worker",
             "-P", self.pool, "-c", str(self.concurrency), "-Q", self.env["DLQ_TEST_QUEUE"],
             "-n", f"{self.name}@%h", *self.options, "-l", "INFO"],
            cwd=self.cwd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
        )
        if wait_ready:
            self.wait_for_log("ready.", timeout=30)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_for_log(self, text: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited ({self.proc.returncode}):\n{self.log()[-4000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"worker never logged {text!r}:\n{self.log()[-4000:]}")
            time.sleep(0.1)

    def terminate(self) -> None:
        """Begin a warm shutdown; :meth:`stop` then waits for it (workers of one test shut down side by side)."""
        if self.proc and self.proc.poll() is None and not self._terminated:
            self.proc.send_signal(signal.SIGTERM)
            self._terminated = True

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            if sig == signal.SIGTERM:
                self.terminate()
            else:
                self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()


class Harness:
    """One test's broker database, queue, key prefix, workers and client-side app."""

    def __init__(self, redis_server, tmp_path: Path, unique: str):
        self.db = next(_db_counter)
        self.broker = redis_server.url.rsplit("/", 1)[0] + f"/{self.db}"
        self.queue = f"q{unique}"
        self.prefix = f"p{unique}"
        self.tmp_path = tmp_path
        self.redis = redis.Redis.from_url(self.broker)
        self.workers: list[Worker] = []
        #: What :meth:`worker` starts (a subclass runs another app module).
        self.worker_cls: type[Worker] = Worker
        self.extra_env: dict[str, str] = {}
        self.app = Celery("client", broker=self.broker, set_as_current=False)
        self.app.conf.task_default_queue = self.queue

    def env(self, **extra) -> dict:
        env = dict(os.environ)
        env.update(DLQ_TEST_BROKER=self.broker, DLQ_TEST_QUEUE=self.queue, DLQ_TEST_PREFIX=self.prefix,
                   PYTHONPATH=str(ROOT))
        env.update(self.extra_env)
        env.update(extra)
        return env

    def worker(self, concurrency: int = 2, name: str | None = None, wait_ready: bool = True, **env) -> Worker:
        name = name or f"w{len(self.workers) + 1}"
        worker = self.worker_cls(self.env(**env), concurrency, name, self.tmp_path / f"{name}.log")
        self.workers.append(worker)
        return worker.start(wait_ready)

    def send(self, name: str, args=(), kwargs=None, **options):
        return self.app.send_task(name, args=args, kwargs=kwargs or {}, queue=self.queue, **options)

    def deliveries(self, task_id: str | None = None) -> list[dict]:
        """Deliveries logged by the test app's tasks (the canaries of :meth:`after_a_mover_pass` left out)."""
        rows = [json.loads(r) for r in self.redis.lrange(f"{self.prefix}:log", 0, -1)]
        return [r for r in rows if (task_id is None and r["args"] != [CANARY]) or r["id"] == task_id]

    def park_noops(self, n: int, due: float, arg=None, store_client=None) -> list[str]:
        """Publish ``proj.noop`` messages to a staging list, then park them exactly as the engine stores them
        (publish format), due at ``due``, in the broker's Redis or ``store_client``; their argument is their
        number, or ``arg``."""
        stage = f"{self.queue}.stage"
        ids = [self.app.send_task("proj.noop", args=(i if arg is None else arg,), queue=stage).id for i in range(n)]
        store = ParkedStore(store_client or self.redis, Keys(self.prefix))
        raw = self.redis.lrange(stage, 0, -1)
        self.redis.delete(stage)
        assert len(raw) == n
        for item in raw:
            msg = json.loads(item)
            envelope = Envelope(body=base64.b64decode(msg["body"]), content_type=msg["content-type"],
                                content_encoding=msg["content-encoding"], headers=msg["headers"],
                                properties={"correlation_id": msg["properties"]["correlation_id"]},
                                exchange="", routing_key=self.queue, queue=self.queue)
            assert store.park(f"{envelope.task_id}:2", envelope.dumps(), self.queue, due)
        return ids

    def after_a_mover_pass(self, store_client=None, timeout: float = 30) -> None:
        """The positive signal a test waits for before asserting that something did NOT happen.

        A noop parked due now and a noop queued now have both run: since this
        call a mover made a pass over the store (moving everything due by now)
        and a worker fetched past everything queued before. Their rows are left
        out of :meth:`deliveries`; the store's counters get one ``parked`` and
        one ``redelivered`` more, so read counters before calling this.
        ``store_client``: the workers' store when it is not the broker's Redis.
        """
        parked = self.park_noops(1, due=time.time(), arg=CANARY, store_client=store_client)[0]
        queued = self.send("proj.noop", args=(CANARY,)).id
        self.wait_until(lambda: self.deliveries(parked) and self.deliveries(queued), timeout=timeout,
                        message="a mover pass and a fetch (the canaries ran)")

    def in_flight(self) -> int:
        """Messages fetched and not settled: every worker process's in-flight hash, and kombu's ``unacked``."""
        keys = self.redis.keys(Keys(self.prefix).inflight("*"))
        return sum(self.redis.hlen(key) for key in keys) + self.redis.hlen("unacked")

    def holder_of(self, tag: str) -> str | None:
        """The consumer (``host:pid:random``) whose in-flight hash holds delivery tag ``tag``."""
        for key in self.redis.keys(Keys(self.prefix).inflight("*")):
            if self.redis.hexists(key, tag):
                return key.decode().split(":inflight:", 1)[1]
        return None

    def dead_letters(self, dlq: str | None = None) -> list[dict]:
        """The raw kombu messages in a DLQ (oldest first), as redis-cli would show them."""
        raw = self.redis.lrange(dlq or f"DLQ.{self.queue}", 0, -1)
        return [json.loads(r) for r in reversed(raw)]

    def dlq(self, *args: str, conf: dict | None = None) -> subprocess.CompletedProcess:
        """``celery -A tests.integration.ops_app dlq ARGS`` on this test's broker and key prefix; ``conf``:
        settings the operator's app adds (a store of its own, shards)."""
        return subprocess.run([sys.executable, "-m", "celery", "-A", "tests.integration.ops_app", "dlq", *args],
                              cwd=ROOT, env=self.env(DLQ_TEST_OPS_CONF=json.dumps(conf or {})),
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)

    def dlq_json(self, *args: str, conf: dict | None = None):
        """:meth:`dlq` with ``--json``, which must succeed: its output, parsed."""
        proc = self.dlq(*args, "--json", conf=conf)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    def wait_until(self, predicate, timeout: float = 30, message: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {message}\n{self.log_excerpt()}")
            time.sleep(0.05)

    def log_excerpt(self) -> str:
        """What a timed-out wait shows: each worker's celery-dlq lines (the last 40), then its log's tail."""
        parts = []
        for worker in self.workers:
            text = worker.log()
            ours = [line for line in text.splitlines() if "celery-dlq" in line][-40:]
            parts.append("--- celery-dlq lines ---\n" + "\n".join(ours) + "\n--- tail ---\n" + text[-3000:])
        return "\n".join(parts)

    def features_off(self) -> list[str]:
        """Each worker's warnings that a feature is off because a Celery or kombu internal moved
        (``internals/base.py:usable``): on the versions the suite runs, each one is a defect that the
        tests would otherwise pass over (a fallback such as Celery's own chord_unlock often passes too).
        A worker told to hide an internal (``DLQ_TEST_HIDE_INTERNAL``: test_internals.py) is expected to."""
        return [line for worker in self.workers if not worker.env.get("DLQ_TEST_HIDE_INTERNAL")
                for line in worker.log().splitlines()
                if "WARNING" in line and "celery-dlq:" in line and " is off, " in line]

    def close(self) -> None:
        for worker in self.workers:
            worker.terminate()
        for worker in self.workers:
            worker.stop()
        off = self.features_off()
        self.redis.flushdb()  # this test's own database only
        self.redis.close()
        assert not off, "a worker turned a feature off:\n" + "\n".join(off)


@pytest.fixture
def harness(redis_server, tmp_path, unique):
    h = Harness(redis_server, tmp_path, unique)
    yield h
    h.close()


@pytest.fixture(params=["listener", "fallback"])
def fetch_harness(request, redis_server, tmp_path, unique):
    """A harness whose idle fetches wait for the fetch listener, and one whose wait on their first list
    (``dlq_fetch_listener = False``)."""
    h = Harness(redis_server, tmp_path, unique)
    if request.param == "fallback":
        h.extra_env["DLQ_TEST_CONF"] = json.dumps({"dlq_fetch_listener": False})
    yield h
    h.close()
