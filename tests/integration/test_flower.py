"""Celery events of dead letters and parked retries, end to end: a real prefork worker with ``-E``, a real
Flower process read over its HTTP API, and an ``app.events.Receiver`` as any event consumer would run it.
"""
from __future__ import annotations

import base64
import json
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from celery import Celery
from prometheus_client.parser import text_string_to_metric_families

from celery_dlq.worker.run.events import DEAD_LETTERED, REDELIVERY_SCHEDULED
from tests.integration.conftest import Worker
from tests.processes import ServerProcess, wait_for

pytestmark = pytest.mark.integration

AUTH = ("ops", "flower-test")


class Flower(ServerProcess):
    """``celery -A tests.integration.proj flower --port P --address 127.0.0.1``, with basic auth."""

    def __init__(self, env: dict, log: Path) -> None:
        super().__init__(lambda port: [sys.executable, "-m", "celery", "-A", "tests.integration.proj", "flower",
                                       f"--port={port}", "--address=127.0.0.1", f"--basic-auth={AUTH[0]}:{AUTH[1]}"],
                         env, log, ready="/healthcheck", what="Flower", timeout=60)

    def get(self, path: str) -> str:
        self.alive()
        token = base64.b64encode(":".join(AUTH).encode()).decode()
        request = urllib.request.Request(self.base + path, headers={"Authorization": f"Basic {token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.read().decode()

    def task(self, task_id: str) -> dict | None:
        try:
            return json.loads(self.get(f"/api/task/info/{task_id}"))
        except urllib.error.HTTPError as exc:
            if exc.code == 404:   # no event of it yet
                return None
            raise

    def events_total(self) -> dict[tuple[str, str], float]:
        """Flower's own Prometheus counter of the events it received: ``(type, task) -> count``."""
        counts: dict[tuple[str, str], float] = {}
        for family in text_string_to_metric_families(self.get("/metrics")):
            for sample in family.samples:
                if sample.name == "flower_events_total":
                    counts[(sample.labels["type"], sample.labels["task"])] = sample.value
        return counts

    def worker_online(self, worker: str) -> bool:
        return any(sample.name == "flower_worker_online" and sample.labels["worker"] == worker and sample.value == 1
                   for family in text_string_to_metric_families(self.get("/metrics")) for sample in family.samples)



class EventTap:
    """An ``app.events.Receiver`` in a thread, as ``celery events`` runs one: every event it gets, in order."""

    def __init__(self, broker: str) -> None:
        self.app = Celery("tap", broker=broker, set_as_current=False)
        self.events: list[dict] = []
        self._receiver = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> EventTap:
        self._thread.start()
        return self

    def _run(self) -> None:
        with self.app.connection_for_read() as connection:
            self._receiver = self.app.events.Receiver(connection, handlers={"*": self.events.append})
            self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def of_worker(self, hostname: str) -> list[dict]:
        return [e for e in list(self.events) if e["type"].startswith("worker-") and e["hostname"] == hostname]

    def of(self, task_id: str, type_: str) -> list[dict]:
        return [e for e in list(self.events) if e.get("uuid") == task_id and e["type"] == type_]

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(timeout=10)


@pytest.fixture
def flower(harness):
    started = Flower(harness.env(), harness.tmp_path / "flower.log").start()
    yield started
    started.stop()


@pytest.fixture
def tap(harness):
    started = EventTap(harness.broker).start()
    yield started
    started.stop()


def events_worker(harness) -> Worker:
    """A prefork worker sending task events (``-E``) and heartbeats, so event consumers see it come online."""
    worker = Worker(harness.env(), 2, "w1", harness.tmp_path / "w1.log")
    worker.options = ("-E", "--without-mingle", "--without-gossip")
    harness.workers.append(worker)
    return worker.start()


def test_flower_shows_a_dead_lettered_task_with_its_dlq_and_reason(harness, flower, tap):
    events_worker(harness)
    name = f"w1@{socket.gethostname()}"
    wait_for(lambda: tap.of_worker(name) and flower.worker_online(name), 60,
             "Flower and the tap to hear from the worker", flower.log_path)
    dlq = f"DLQ.{harness.queue}"
    fails = harness.send("proj.always_fails", args=(7,))        # 3 deliveries, 2 parked, then dead-lettered
    refused = harness.send("proj.not_retryable")                # KeyError: dead-lettered at once
    harness.wait_until(lambda: len(harness.dead_letters()) == 2, timeout=60, message="two dead letters")

    # Flower's task view: state FAILURE, and the exception says where the message went and why.
    info = wait_for(lambda: (t := flower.task(fails.id)) and t["state"] == "FAILURE" and t, 30,
                    "Flower to see the task fail", flower.log_path)
    assert info["exception"] == (f"ValueError('always fails #7') [celery-dlq: dead-lettered to {dlq}, "
                                 f"reason max_delivery_attempts, delivery 3]")
    assert info["name"] == "proj.always_fails" and info["worker"] == name
    info = wait_for(lambda: (t := flower.task(refused.id)) and t["state"] == "FAILURE" and t, 30,
                    "Flower to see the second task fail", flower.log_path)
    assert info["exception"] == (f"KeyError('missing') [celery-dlq: dead-lettered to {dlq}, "
                                 f"reason non_retryable, delivery 1]")
    # Flower keeps Celery's own task fields only: the custom event's fields are merged into its State
    # but not served, which is why the task-failed event carries the note above.
    assert "dlq" not in info and "reason" not in info

    listed = json.loads(flower.get("/api/tasks?state=FAILURE"))
    assert set(listed) == {fails.id, refused.id}
    assert f"dead-lettered to {dlq}" in listed[fails.id]["exception"]
    assert "reason non_retryable" in listed[refused.id]["exception"]

    # Flower received the custom events themselves (its /metrics counts them per type and task).
    counts = wait_for(lambda: (c := flower.events_total()).get((DEAD_LETTERED, "proj.always_fails")) and c, 30,
                      "Flower to count task-dead-lettered", flower.log_path)
    assert counts[(DEAD_LETTERED, "proj.always_fails")] == 1
    assert counts[(DEAD_LETTERED, "proj.not_retryable")] == 1
    assert counts[(REDELIVERY_SCHEDULED, "proj.always_fails")] == 2

    # Any event consumer gets their fields.
    (letter,) = wait_for(lambda: tap.of(fails.id, DEAD_LETTERED), 30, "the tap to get task-dead-lettered")
    assert {k: letter[k] for k in ("dlq", "queue", "reason", "delivery_count", "exception_type", "name")} == {
        "dlq": dlq, "queue": harness.queue, "reason": "max_delivery_attempts", "delivery_count": 3,
        "exception_type": "ValueError", "name": "proj.always_fails"}
    assert letter["hostname"] == name
    scheduled = tap.of(fails.id, REDELIVERY_SCHEDULED)
    assert [e["delivery_count"] for e in scheduled] == [2, 3]
    runs = [d["at"] for d in harness.deliveries(fails.id)]
    assert len(runs) == 3
    for event, failed_run, next_run in zip(scheduled, runs, runs[1:]):   # due 0.1 s after a failure
        assert event["exception_type"] == "ValueError" and event["queue"] == harness.queue
        assert failed_run < event["due"] <= next_run + 0.05
    (refusal,) = wait_for(lambda: tap.of(refused.id, DEAD_LETTERED), 30, "the tap to get the second one")
    assert (refusal["reason"], refusal["delivery_count"], refusal["exception_type"]) == ("non_retryable", 1, "KeyError")


def test_without_task_events_nothing_is_sent(harness, tap):
    """Without ``-E`` the worker sends no task events, celery-dlq's included; it still dead-letters as usual."""
    worker = Worker(harness.env(), 1, "w1", harness.tmp_path / "w1.log")
    worker.options = ("--without-mingle", "--without-gossip")   # heartbeats on, task events off
    harness.workers.append(worker)
    worker.start()
    name = f"w1@{socket.gethostname()}"
    wait_for(lambda: tap.of_worker(name), 30, "the tap to hear from the worker")
    result = harness.send("proj.not_retryable")
    harness.wait_until(lambda: len(harness.dead_letters()) == 1, timeout=30, message="the dead letter")
    dead_lettered_at = time.time()
    # The worker's loop flushes buffered task events before its next heartbeat (every 2 s) goes out:
    # a heartbeat sent after the dead letter means any task event would have arrived before it.
    wait_for(lambda: [e for e in tap.of_worker(name) if e["type"] == "worker-heartbeat"
                      and e["timestamp"] > dead_lettered_at], 30, "a heartbeat after the dead letter")
    assert [e for e in tap.events if e["type"].startswith("task-")] == []
    assert harness.deliveries(result.id)


def test_flower_shows_the_worker_page_with_its_stats(harness, flower):
    """Flower's worker page reads ``inspect stats`` (issue 45: a celery-dlq worker sent no reply, its broker
    transport options held an object JSON cannot encode, and the page answered 404)."""
    worker = events_worker(harness)
    name = f"w1@{socket.gethostname()}"
    wait_for(lambda: flower.worker_online(name), 60, "Flower to hear from the worker", flower.log_path)
    workers = wait_for(lambda: (w := json.loads(flower.get(f"/api/workers?refresh=1&workername={name}")))
                       .get(name, {}).get("stats") and w, 60, "Flower's stats of the worker", flower.log_path)
    stats = workers[name]["stats"]
    assert stats["pid"] == worker.proc.pid
    assert stats["pool"]["max-concurrency"] == 2 and stats["prefetch_count"] == 2 * 4   # -c 2, DLQ_TEST_PREFETCH
    assert stats["broker"]["transport"] == "celery_dlq.worker.fetch.transport:Transport"
    assert stats["broker"]["hostname"] == "127.0.0.1"
    assert f"{harness.queue}" in [q["name"] for q in workers[name]["active_queues"]]
    page = flower.get(f"/worker/{name}")   # the page itself, as an operator opens it
    shown = dict(re.findall(r"<td>([^<]+)</td>\s*<td>([^<]*)</td>", page))
    assert (shown["Worker PID"], shown["Prefetch Count"]) == (str(worker.proc.pid), "8")
    assert "celery_dlq.worker.fetch.transport:Transport" in page
