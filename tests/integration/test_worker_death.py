"""When a worker dies: its in-flight messages come back within the lease, and a live worker's never do.

Real prefork (and solo) workers of tests/integration/proj.py. A task's
rows in ``harness.deliveries`` say which worker ran it (``ppid``: the
worker's main process; ``pid`` under the solo pool) and as which delivery.
"""
from __future__ import annotations

import json
import signal
import threading
import time
import uuid

import psutil
import pytest
import redis

from celery_dlq import headers as H
from celery_dlq.storage.keys import Keys
from tests.integration.conftest import Harness, Worker
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

#: A short lease for the tests that need not show the default's bound: a worker silent for 1 s is gone.
SHORT = {"dlq_inflight_lease": 1.0, "dlq_heartbeat_interval": 0.25}
#: dlq_inflight_lease (10 s) + one heartbeat (2.5 s), the defaults, and the next fetch: "say 15 s".
DEFAULT_BOUND = 15.0


def kill_hard(worker: Worker) -> float:
    """SIGKILL the worker's main process and its pool children (an OOM kill, a lost node); when."""
    procs = [psutil.Process(worker.proc.pid), *psutil.Process(worker.proc.pid).children(recursive=True)]
    at = time.time()
    for proc in procs:
        proc.send_signal(signal.SIGKILL)
    worker.proc.wait(10)
    return at


def main_pid(row: dict) -> int:
    return row["ppid"]   # a prefork pool child's parent


def in_flight(harness) -> list[tuple[int, str]]:
    """Every in-flight record: (the worker's main pid, delivery tag)."""
    rows = []
    for key in harness.redis.keys(Keys(harness.prefix).inflight("*")):
        pid = int(key.decode().split(":inflight:", 1)[1].rsplit(":", 2)[1])
        rows += [(pid, tag.decode()) for tag in harness.redis.hkeys(key)]
    return rows


def started(harness, task_id: str, n: int, timeout: float = 30) -> list[dict]:
    harness.wait_until(lambda: len(harness.deliveries(task_id)) >= n, timeout=timeout,
                       message=f"delivery {n} of {task_id}")
    return harness.deliveries(task_id)


class CommandWatch:
    """Redis ``MONITOR`` in a thread, until a command naming both ``words`` runs (the first one seen)."""

    def __init__(self, client: redis.Redis, *words: str) -> None:
        self.client = redis.Redis(connection_pool=redis.ConnectionPool(
            **{**client.connection_pool.connection_kwargs, "socket_timeout": 1.0}))
        self.words, self.command = words, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._ready = threading.Event()

    def start(self) -> CommandWatch:
        self._thread.start()
        assert self._ready.wait(10), "MONITOR never started"
        return self

    def _watch(self) -> None:
        with self.client.monitor() as monitor:
            self._ready.set()
            while not self._stop.is_set():
                try:
                    command = monitor.next_command()["command"]
                except redis.TimeoutError:
                    continue
                if all(word in command for word in self.words):
                    self.command = command
                    return

    def seen(self, timeout: float) -> str | None:
        """The command, once Redis ran it (``None`` after ``timeout``)."""
        self._thread.join(timeout)
        self._stop.set()
        self._thread.join(5)
        self.client.close()
        return self.command


def stop_all(harness) -> None:
    for worker in harness.workers:
        worker.stop(signal.SIGKILL)


def test_a_killed_workers_task_starts_on_a_live_worker_within_the_default_bound(harness):
    workers = {w.proc.pid: w for w in (harness.worker(concurrency=1, name="a"), harness.worker(concurrency=1, name="b"))}
    task = harness.send("proj.sleeps", args=(60,))
    [first] = started(harness, task.id, 1)
    victim = workers.pop(main_pid(first))
    [survivor] = workers.values()
    killed_at = kill_hard(victim)
    second = started(harness, task.id, 2, timeout=DEFAULT_BOUND + 15)[1]
    assert (second["delivery"], main_pid(second)) == (2, survivor.proc.pid)
    assert second["at"] - killed_at <= DEFAULT_BOUND, f"back after {second['at'] - killed_at:.1f}s"
    assert [pid for pid, _ in in_flight(harness)] == [survivor.proc.pid]   # the dead one's record is gone
    stop_all(harness)


@pytest.mark.parametrize("pool, task", [("prefork", "proj.sleeps"), ("prefork", "proj.burns"), ("solo", "proj.sleeps")])
def test_a_task_running_ten_times_the_lease_on_a_live_worker_runs_once(harness, pool, task):
    """``proj.burns`` keeps its pool child at 100% CPU; under solo the task sleeps in the worker's main process
    (a long C call that releases the GIL). The beat is a thread of its own in the main process."""
    harness.extra_env["DLQ_TEST_CONF"] = json.dumps(SHORT)
    harness.worker_cls = type("PoolWorker", (Worker,), {"pool": pool})
    harness.worker(concurrency=1, name="a")
    harness.worker(concurrency=1, name="b")
    sent = harness.send(task, args=(10,))
    harness.wait_until(lambda: harness.deliveries(sent.id) and harness.in_flight() == 0, timeout=40,
                       message="the 10 s task done and acknowledged")
    harness.after_a_mover_pass()
    assert [row["delivery"] for row in harness.deliveries(sent.id)] == [1]
    assert harness.redis.llen(harness.queue) == 0 and harness.in_flight() == 0


def test_a_stopped_workers_task_runs_elsewhere_and_its_late_ack_settles_nothing_of_the_other(harness):
    harness.extra_env["DLQ_TEST_CONF"] = json.dumps(SHORT)
    workers = {w.proc.pid: w for w in (harness.worker(concurrency=1, name="a"), harness.worker(concurrency=1, name="b"))}
    task = harness.send("proj.long_on_redelivery", kwargs={"first": 4.0, "later": 60.0})
    [first] = started(harness, task.id, 1)
    frozen = workers.pop(main_pid(first))
    [other] = workers.values()
    [(_, tag)] = in_flight(harness)
    frozen_consumer = harness.holder_of(tag)
    frozen.proc.send_signal(signal.SIGSTOP)      # its heartbeat stops with it; its pool child sleeps on
    try:
        second = started(harness, task.id, 2, timeout=20)[1]
        assert (second["delivery"], main_pid(second)) == (2, other.proc.pid)
        assert in_flight(harness) == [(other.proc.pid, tag)]
        late_ack = CommandWatch(harness.redis, frozen_consumer, tag).start()
    finally:
        frozen.proc.send_signal(signal.SIGCONT)
    frozen.wait_for_log(f"Task proj.long_on_redelivery[{task.id}] succeeded", timeout=20)
    # The positive signal: Redis ran the frozen worker's acknowledgement (a command naming its own in-flight
    # record and the tag), and it settled nothing of the other worker's delivery.
    assert late_ack.seen(timeout=20), "the frozen worker never sent its late acknowledgement"
    assert in_flight(harness) == [(other.proc.pid, tag)], f"{late_ack.command!r} settled the other delivery"
    assert harness.redis.llen(harness.queue) == 0
    assert len(harness.deliveries(task.id)) == 2   # the documented duplicate: the frozen run finished too
    stop_all(harness)


def test_a_task_that_kills_its_worker_every_time_is_dead_lettered_after_its_attempts(harness):
    """Three live workers, none restarted: each delivery kills one, the sweeper gives the message back counted,
    and the third delivery is refused (max_delivery_attempts 2) and dead-lettered as worker_lost."""
    harness.extra_env["DLQ_TEST_CONF"] = json.dumps(SHORT)
    workers = [harness.worker(concurrency=1, name=n) for n in ("a", "b", "c")]
    poison = harness.send("proj.kills_worker")
    harness.wait_until(lambda: len(harness.dead_letters()) == 1, timeout=60, message="the worker_lost dead letter")
    headers = harness.dead_letters()[0]["headers"]
    assert (headers["id"], headers[H.REASON], headers[H.DELIVERY_COUNT]) == (poison.id, "worker_lost", 2)
    assert [row["delivery"] for row in harness.deliveries(poison.id)] == [1, 2], "never run a third time"
    assert sorted(w.proc.poll() for w in workers if w.proc.poll() is not None) == [-9, -9]
    after = harness.send("proj.noop", args=(3,))
    harness.wait_until(lambda: harness.deliveries(after.id), message="the survivor runs the next task")
    harness.wait_until(lambda: harness.in_flight() == 0, message="nothing left in flight")


def test_a_redis_restart_while_a_dead_workers_messages_wait_loses_nothing(tmp_path):
    server = RedisServer(None, "--appendonly", "yes", "--appendfsync", "always").start()
    harness = Harness(server, tmp_path, uuid.uuid4().hex[:8])
    try:
        harness.extra_env["DLQ_TEST_CONF"] = json.dumps({"dlq_inflight_lease": 3.0, "dlq_heartbeat_interval": 0.5})
        workers = {w.proc.pid: w for w in (harness.worker(concurrency=2, name="a"),
                                           harness.worker(concurrency=2, name="b"))}
        long = harness.send("proj.long_on_redelivery", kwargs={"first": 60.0, "later": 0.1})
        [first] = started(harness, long.id, 1)
        short = [harness.send("proj.sleeps", args=(0.2,)).id for _ in range(40)]
        victim = workers.pop(main_pid(first))
        kill_hard(victim)                        # its long task and its prefetched ones are in flight
        server.shutdown()
        time.sleep(1)
        server.start()                           # back from its AOF, the dead worker's records with it
        harness.wait_until(lambda: all(harness.deliveries(t) for t in [long.id, *short])
                           and len(harness.deliveries(long.id)) == 2, timeout=90,
                           message="every task ran, the dead worker's long one again")
        assert harness.deliveries(long.id)[1]["delivery"] == 2
        harness.wait_until(lambda: harness.in_flight() == 0 and harness.redis.llen(harness.queue) == 0,
                           message="nothing left in flight or queued")
        assert harness.dead_letters() == []
        [survivor] = workers.values()
        assert survivor.proc.poll() is None
    finally:
        harness.close()
        server.stop()


def test_beside_a_worker_on_kombus_fetch_nothing_is_lost_or_run_twice_and_it_sweeps_too(harness):
    """A mixed deployment: worker A fetches with kombu's own transport (its messages in kombu's ``unacked``,
    its visibility timeout), B with celery-dlq's. A holds the mover lease, so A sweeps B's messages after B dies."""
    harness.extra_env["DLQ_TEST_CONF"] = json.dumps(SHORT)
    kombu_side = harness.worker(concurrency=2, name="a", DLQ_TEST_CONF=json.dumps({**SHORT,
                                                                                  "dlq_fetch_transport": False}))
    kombu_side.wait_for_log("this worker moves due messages now")
    side_queue = f"{harness.queue}b"
    dlq_side = harness.worker(concurrency=2, name="b", DLQ_TEST_QUEUE=f"{harness.queue},{side_queue}")
    ids = [harness.send("proj.sleeps", args=(0.05,)).id for _ in range(100)]
    harness.wait_until(lambda: all(harness.deliveries(t) for t in ids), timeout=60, message="all 100 ran")
    assert {row["ppid"] for row in harness.deliveries()} == {kombu_side.proc.pid, dlq_side.proc.pid}
    long = harness.app.send_task("proj.sleeps", args=(60,), queue=side_queue)   # only B consumes it
    started(harness, long.id, 1)
    kill_hard(dlq_side)
    harness.wait_until(lambda: harness.redis.llen(side_queue) == 1, timeout=10,
                       message="B's message given back by A, the kombu-fetch worker holding the mover lease")
    assert json.loads(harness.redis.lindex(side_queue, 0))["headers"]["id"] == long.id
    harness.wait_until(lambda: harness.in_flight() == 0, message="nothing else in flight")
    assert all(len(harness.deliveries(t)) == 1 for t in ids), "each ran exactly once"
    stop_all(harness)
