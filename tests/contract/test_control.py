"""Every ``celery inspect`` and ``celery control`` command against a real celery-dlq worker (issue 45).

Celery's remote control answers over the broker, its replies encoded by the
control serializer (JSON): a worker that puts something JSON cannot encode
in a reply (``inspect stats`` once carried the fetch context in the broker's
transport options) sends none, and Flower, health checks and autoscalers
reading ``stats`` see the worker as gone. Each inspect command must answer
with a well-formed reply, and each control command must be acknowledged and,
where the test can see it, take effect. Two workers: ``ctl`` (prefork, one
process: its pool grows and shrinks) and ``auto`` (``--autoscale``, its own
queue); ``shutdown`` goes last and stops both.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid

import pytest

from tests.contract.conftest import READY_TIMEOUT, ContractWorker, contract_harness
from tests.integration.conftest import ROOT
from tests.redis_server import RedisServer

#: One process runs the module (one pair of workers; ``shutdown`` last), as tests/contract/test_worker.py does.
pytestmark = [pytest.mark.contract, pytest.mark.integration, pytest.mark.xdist_group("contract-control")]

HOST = socket.gethostname()
CTL, AUTO = f"ctl@{HOST}", f"auto@{HOST}"
#: Seconds a reply may take: a hang detector on a loaded machine (a reply comes at the first one: ``limit=1``).
REPLY = 20


class ControlledWorker(ContractWorker):
    """The contract app's worker with heartbeats: its event dispatcher is what ``enable_events`` turns on."""

    options = ("--without-mingle", "--without-gossip")


class AutoscaledWorker(ControlledWorker):
    """The same with an autoscaler (between one and two processes)."""

    options = (*ControlledWorker.options, "--autoscale=2,1")


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A redis-server, ``ctl`` on the harness's queue and ``auto`` on a queue of its own, started side by side."""
    server = RedisServer().start()
    h = contract_harness(server, tmp_path_factory.mktemp("control"), uuid.uuid4().hex[:8])
    h.worker_cls = ControlledWorker
    try:
        ctl = h.worker(concurrency=1, name="ctl", wait_ready=False)
        h.worker_cls = AutoscaledWorker
        auto = h.worker(concurrency=1, name="auto", wait_ready=False, DLQ_TEST_QUEUE=f"{h.queue}.auto")
        for worker in (ctl, auto):
            worker.wait_for_log("ready.", timeout=READY_TIMEOUT)
        yield h
    finally:
        h.close()
        server.stop()


def inspect(h, method: str, *args, node: str = CTL):
    """``celery inspect METHOD ARGS`` to one node: its reply (the test fails when it sends none)."""
    replies = getattr(h.app.control.inspect(destination=[node], timeout=REPLY, limit=1), method)(*args)
    assert replies and node in replies, f"inspect {method}: no reply from {node}"
    return replies[node]


def control(h, command: str, node: str = CTL, **arguments):
    """``celery control COMMAND`` to one node, with a reply: the reply."""
    replies = h.app.control.broadcast(command, arguments=arguments, destination=[node], reply=True,
                                      timeout=REPLY, limit=1)
    assert replies and node in replies[0], f"control {command}: no reply from {node}"
    return replies[0][node]


def cli(h, *args: str) -> subprocess.CompletedProcess:
    """``celery -A tests.integration.ops_app ARGS``: the command line an operator types."""
    return subprocess.run([sys.executable, "-m", "celery", "-A", "tests.integration.ops_app", *args], cwd=ROOT,
                          env=h.env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


def processes(h, node: str = CTL) -> int:
    return len(inspect(h, "stats", node=node)["pool"]["processes"])


def test_celery_inspect_stats_answers_on_the_command_line(node):
    """The regression as a user saw it: ``celery inspect stats`` said "No nodes replied"."""
    proc = cli(node, "inspect", "stats", "--destination", CTL, "--timeout", str(REPLY), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stats = json.loads(proc.stdout)[CTL]
    assert stats["broker"]["transport"] == "celery_dlq.worker.fetch.transport:Transport"
    assert [worker.proc.pid for worker in node.workers if worker.name == "ctl"] == [stats["pid"]]


def test_every_inspect_command_answers_with_a_well_formed_reply(node):
    h = node
    ctl = next(worker for worker in h.workers if worker.name == "ctl")
    assert inspect(h, "ping") == {"ok": "pong"}

    stats = inspect(h, "stats")
    assert stats["pid"] == ctl.proc.pid and stats["pool"]["max-concurrency"] == 1 and stats["prefetch_count"] == 4
    broker = stats["broker"]
    assert (broker["transport"], broker["hostname"], broker["virtual_host"]) == (
        "celery_dlq.worker.fetch.transport:Transport", "127.0.0.1", str(h.db))
    assert "password" not in broker and json.loads(json.dumps(broker["transport_options"])) == \
        broker["transport_options"]
    assert set(stats) >= {"total", "uptime", "clock", "rusage"}
    auto_stats = inspect(h, "stats", node=AUTO)
    assert auto_stats["autoscaler"] == {"max": 2, "min": 1, "current": 1, "qty": 0}

    # One task running (the pool's only process, for 20 s: the checks below take well under one), one waiting
    # for it, one due in ten minutes.
    sleeper = h.send("proj.sleeps", kwargs={"seconds": 20})
    h.wait_until(lambda: h.deliveries(sleeper.id), timeout=60, message="the sleeper to start")
    waiting = h.send("proj.noop", args=(1,))
    later = h.send("proj.noop", args=(2,), countdown=600)
    h.wait_until(lambda: inspect(h, "reserved") and inspect(h, "scheduled"), timeout=60,
                 message="the waiting task reserved and the later one scheduled")

    (active,) = inspect(h, "active")
    assert (active["id"], active["name"], active["kwargs"], active["worker_pid"]) == (
        sleeper.id, "proj.sleeps", {"seconds": 20}, stats["pool"]["processes"][0])
    assert [r["id"] for r in inspect(h, "reserved")] == [waiting.id]
    (scheduled,) = inspect(h, "scheduled")
    assert scheduled["request"]["id"] == later.id and scheduled["eta"]
    assert inspect(h, "query_task", sleeper.id, waiting.id) == {
        sleeper.id: ["active", active], waiting.id: ["reserved", inspect(h, "reserved")[0]]}
    assert inspect(h, "revoked") == []

    registered = inspect(h, "registered")
    assert {"proj.noop", "proj.sleeps", "contract.traced"} <= set(registered)
    conf = inspect(h, "conf")
    assert (conf["dlq_mover_interval"], conf["task_default_queue"], conf["broker_transport"]) == (
        0.05, h.queue, "celery_dlq.worker.fetch.transport:Transport")   # dlq_key_prefix: Celery masks a "key"
    (queue,) = inspect(h, "active_queues")
    assert queue["name"] == h.queue
    assert "software -> celery:" in inspect(h, "report")["ok"]
    assert inspect(h, "clock")["clock"] > 0

    # The memory-debugging commands: objgraph needs a library the worker lacks, and says so in its reply.
    objgraph = inspect(h, "objgraph")
    try:
        import objgraph as _objgraph  # noqa: F401
    except ImportError:
        assert "objgraph" in objgraph["error"]
    # memsample and memdump read the process's memory with psutil (celery.utils.debug): without it, as in the
    # contract sessions, the sample is None and the dump says so.
    sample = inspect(h, "memsample")
    dump = inspect(h, "memdump")
    try:
        import psutil  # noqa: F401
    except ImportError:
        assert sample is None and "psutil not installed" in dump
    else:
        assert isinstance(sample, str) and sample.endswith("MB")
        assert isinstance(dump, str) and f"> {sample}" in dump and "- rss (end): " in dump   # the sample above
    h.app.control.revoke(later.id)   # leaves nothing due for the control test's checks


def test_every_control_command_is_acknowledged_and_takes_effect(node):
    h = node
    # Task events, on and off: each command changes the worker's state once.
    assert control(h, "enable_events") == {"ok": "task events enabled"}
    assert control(h, "enable_events") == {"ok": "task events already enabled"}
    assert control(h, "disable_events") == {"ok": "task events disabled"}
    assert control(h, "disable_events") == {"ok": "task events already disabled"}

    # A consumer added runs the tasks of its queue; cancelled, the queue is no longer consumed.
    extra = f"{h.queue}.extra"
    assert control(h, "add_consumer", queue=extra) == {"ok": f"add consumer {extra}"}
    h.wait_until(lambda: extra in [q["name"] for q in inspect(h, "active_queues")], timeout=60,
                 message="the added queue consumed")
    on_extra = h.app.send_task("proj.noop", args=(3,), queue=extra)
    h.wait_until(lambda: h.deliveries(on_extra.id), timeout=120, message="a task of the added queue to run")
    assert control(h, "cancel_consumer", queue=extra) == {"ok": f"no longer consuming from {extra}"}
    h.wait_until(lambda: [q["name"] for q in inspect(h, "active_queues")] == [h.queue], timeout=60,
                 message="the added queue cancelled")

    # Limits, as ``registered`` shows them afterwards.
    assert control(h, "rate_limit", task_name="proj.noop", rate_limit="600/m") == {
        "ok": "new rate limit set successfully"}
    assert control(h, "time_limit", task_name="proj.noop", soft=50, hard=60) == {"ok": "time limits set successfully"}
    noop = [entry for entry in inspect(h, "registered", "rate_limit", "time_limit", "soft_time_limit")
            if entry.startswith("proj.noop ")]
    assert noop == ["proj.noop [rate_limit=600/m time_limit=60 soft_time_limit=50]"]
    assert control(h, "rate_limit", task_name="proj.noop", rate_limit="") == {
        "ok": "rate limit disabled successfully"}
    assert control(h, "time_limit", task_name="proj.nothing") == {"error": "unknown task"}

    # A revoked id is listed, and a task sent with it never runs.
    revoked = str(uuid.uuid4())
    reply = control(h, "revoke", task_id=revoked)["ok"]
    assert revoked in reply and reply.endswith("flagged as revoked")
    assert revoked in inspect(h, "revoked")
    h.send("proj.noop", args=(4,), task_id=revoked)
    after = h.send("proj.noop", args=(5,))
    h.wait_until(lambda: h.deliveries(after.id), timeout=120, message="the task after the revoked one")
    assert h.deliveries(revoked) == []

    # The pool grows by one process and shrinks back (a pool of fixed size: no autoscaler on ctl).
    assert processes(h) == 1
    assert control(h, "pool_grow", n=1) == {"ok": "pool will grow"}
    h.wait_until(lambda: processes(h) == 2, timeout=60, message="the pool grown to two processes")
    assert control(h, "pool_shrink", n=1) == {"ok": "pool will shrink"}
    h.wait_until(lambda: processes(h) == 1, timeout=60, message="the pool shrunk back to one process")

    # The autoscaler's bounds, where a worker has one.
    assert control(h, "autoscale", AUTO, max=3, min=2) == {"ok": "autoscale now max=3 min=2"}
    h.wait_until(lambda: processes(h, AUTO) == 2, timeout=60, message="the autoscaler grown to its new minimum")
    assert inspect(h, "stats", node=AUTO)["autoscaler"] == {"max": 3, "min": 2, "current": 2, "qty": 0}
    assert "Autoscale not enabled" in control(h, "autoscale", CTL, max=3, min=2)["error"]


def test_shutdown_stops_each_worker_cleanly(node):
    """Last: ``celery control shutdown`` (no reply, by Celery's design); each worker exits with status 0."""
    h = node
    for worker in h.workers:
        h.app.control.shutdown(destination=[f"{worker.name}@{HOST}"])
    deadline = time.monotonic() + 60
    for worker in h.workers:
        worker.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        assert worker.proc.returncode == 0, worker.log()[-3000:]
        assert "Got shutdown from remote" in worker.log()
