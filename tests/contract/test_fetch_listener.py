"""The default idle fetch on every version: woken by the fetch listener, on a default server and with keyspace
notifications on.

An idle worker blocks on a wake marker per queue, which the lease holder's
listener writes when client tracking tells it a queue's list was written to
(worker/fetch/listener.py). This module checks, on the session's Celery,
kombu and redis-py, that the listener hears the worker's queues (the
listening SET, the worker's log line, the worker blocked in ``BZPOPMIN``) and
that a message on a list other than the first, on a priority sub-list and a
retry moved back by the mover each wake the idle worker. Its fallback wait is
``dlq_fetch_wait = 30`` s, so a message taken within 10 s was taken because
the listener woke the fetch. Run twice: on a server with default settings,
and with ``notify-keyspace-events KEA`` (every notification on, as some
deployments have it; the fetch does not use them, ``dlq_fetch_notifications``
is obsolete), each on a redis-server of its own.
"""
from __future__ import annotations

import json

import pytest

from celery_dlq.storage.keys import Keys
from tests.contract.conftest import READY_TIMEOUT, ContractWorker, contract_harness
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.contract, pytest.mark.integration]

#: The fallback's longest wait: a message found sooner on another list than the first was found by a wake.
LONG_WAIT = {"dlq_fetch_wait": 30.0}
#: What a woken fetch gets: well below LONG_WAIT and the listener's shortest marker wait (10 s).
WOKEN_WITHIN = 10


@pytest.fixture(params=["default", "notifications"])
def harness(request, tmp_path, unique):
    """A redis-server of the test's own, default or with every keyspace notification on."""
    args = ("--notify-keyspace-events", "KEA") if request.param == "notifications" else ()
    server = RedisServer(None, *args).start()
    h = contract_harness(server, tmp_path, unique)
    try:
        yield h
    finally:
        h.close()
        server.stop()


def test_an_idle_worker_is_woken_by_the_listener_for_every_list_and_a_moved_retry(harness):
    flags = harness.redis.config_get("notify-keyspace-events")["notify-keyspace-events"]
    second = f"{harness.queue}.second"
    worker = ContractWorker(harness.env(DLQ_TEST_CONF=json.dumps(LONG_WAIT)), 1, "w1", harness.tmp_path / "w1.log")
    worker.options = (*ContractWorker.options, "-Q", f"{harness.queue},{second}")   # the last -Q wins
    harness.workers.append(worker)
    worker.start()
    worker.wait_for_log("an idle fetch waits for the fetch listener", timeout=READY_TIMEOUT)
    listening = Keys(harness.prefix).fetch_listening
    harness.wait_until(lambda: {m.decode() for m in harness.redis.smembers(listening)} >= {harness.queue, second},
                       timeout=60, message=f"the listener hears both queues (notify-keyspace-events {flags!r})")
    harness.wait_until(lambda: any(c.get("cmd") == "bzpopmin" for c in harness.redis.client_list()),
                       timeout=60, message="the idle worker blocked on its markers")

    for options in ({"queue": second}, {"queue": harness.queue, "priority": 9}, {"queue": harness.queue}):
        result = harness.app.send_task("proj.noop", args=(1,), **options)
        harness.wait_until(lambda: harness.deliveries(result.id), timeout=WOKEN_WITHIN,
                           message=f"the message sent with {options}, woken (the fallback waits 30 s)")

    flaky = harness.app.send_task("proj.flaky", args=(2, "listener"), queue=second)   # retries 0.3 s, 0.6 s
    harness.wait_until(lambda: len(harness.deliveries(flaky.id)) == 3, timeout=3 * WOKEN_WITHIN,
                       message="deliveries 1, 2 and 3, the retries moved back and woken")
    harness.after_a_mover_pass()       # a duplicate would have run by now
    assert [row["delivery"] for row in harness.deliveries(flaky.id)] == [1, 2, 3]
    assert harness.dead_letters() == []
    assert "Unrecoverable error" not in worker.log() and worker.proc.poll() is None
