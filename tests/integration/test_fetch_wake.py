"""An idle fetch: woken by keyspace notifications of every list it watches, or falling back to its first list.

Every worker here waits up to ``dlq_fetch_wait = 30`` s per idle wait, so a message found within 10 s on a
list other than the first was found because a notification woke the fetch, not because a wait ran out.
"""
from __future__ import annotations

import json
import time

import pytest
import redis

from tests.integration.conftest import Harness, Worker
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

LONG_WAIT = json.dumps({"dlq_fetch_wait": 30.0})


def two_queue_worker(harness: Harness, second: str, conf: str = LONG_WAIT) -> Worker:
    worker = Worker(harness.env(DLQ_TEST_CONF=conf), 1, "w1", harness.tmp_path / "w1.log")
    worker.options = (*Worker.options, "-Q", f"{harness.queue},{second}")   # the last -Q wins
    harness.workers.append(worker)
    return worker.start()


@pytest.fixture
def notified(notifying_redis_server, tmp_path, unique):
    h = Harness(notifying_redis_server, tmp_path, unique)
    yield h
    h.close()


def test_an_idle_fetch_is_woken_for_a_second_queue_and_a_priority_list(notified):
    second = f"{notified.queue}.second"
    worker = two_queue_worker(notified, second)
    worker.wait_for_log("waits for keyspace notifications of every list it watches")
    time.sleep(2.0)   # idle: every wait sent
    for options in ({"queue": second}, {"queue": notified.queue, "priority": 9}, {"queue": notified.queue}):
        before = len(notified.deliveries())
        notified.app.send_task("proj.noop", **options)
        notified.wait_until(lambda: len(notified.deliveries()) > before, timeout=10,
                            message=f"the message sent with {options} (a wait of 30 s never ran out)")
        time.sleep(1.0)
    assert "Unrecoverable error" not in worker.log()


def test_without_notifications_an_idle_fetch_blocks_on_its_first_list_and_says_so(harness):
    second = f"{harness.queue}.second"
    worker = two_queue_worker(harness, second)
    worker.wait_for_log("blocks on its first list and looks at every list each 30s")
    time.sleep(2.0)
    harness.send("proj.noop")   # the first list: the no-op BLMOVE wakes at once
    harness.wait_until(lambda: len(harness.deliveries()) == 1, timeout=10, message="the first list's message")


def test_configure_turns_list_events_on_and_off_leaves_the_server_alone(tmp_path, unique):
    server = RedisServer().start()   # its own: the session's server must keep its configuration
    harness = Harness(server, tmp_path, unique)
    flags = lambda: redis.Redis.from_url(harness.broker).config_get("notify-keyspace-events")  # noqa: E731
    try:
        assert flags() == {"notify-keyspace-events": ""}
        worker = harness.worker(DLQ_TEST_CONF=json.dumps({"dlq_fetch_notifications": "off"}))
        worker.wait_for_log("dlq_fetch_notifications is 'off'")
        assert flags() == {"notify-keyspace-events": ""}, "never changed unless asked"
        worker = harness.worker(DLQ_TEST_CONF=json.dumps({"dlq_fetch_notifications": "configure"}))
        worker.wait_for_log("waits for keyspace notifications")
        assert "K" in flags()["notify-keyspace-events"] and "l" in flags()["notify-keyspace-events"]
    finally:
        harness.close()
        server.stop()
