"""When celery-dlq's own Redis is down, the original message is not acknowledged and not lost."""
from __future__ import annotations

import json

import pytest
import redis

from celery_dlq import headers as H
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration


def test_store_outage_leaves_the_message_unacked_until_redis_is_back(harness):
    store = RedisServer().start()
    try:
        harness.extra_env["DLQ_TEST_CONF"] = json.dumps({
            "dlq_redis_url": store.url,
            "broker_transport_options": {"visibility_timeout": 2, "unacked_restore_interval": 1,
                                         "unacked_restore_throttle": 1},
        })
        worker = harness.worker(concurrency=1)
        store.stop()  # celery-dlq's Redis goes away; the broker stays up
        result = harness.send("proj.always_fails", args=(1,))
        harness.wait_until(lambda: harness.deliveries(result.id), message="first delivery")
        worker.wait_for_log("leaving the message unacknowledged", timeout=20)
        assert harness.in_flight() == 1, "the failed delivery must stay unacknowledged"
        assert harness.dead_letters() == []

        store = RedisServer(port=store.port).start()  # back, empty
        harness.wait_until(lambda: len(harness.dead_letters()) == 1, timeout=60, message="dead letter")
        headers = harness.dead_letters()[0]["headers"]
        assert headers["id"] == result.id
        assert headers[H.REASON] == "max_delivery_attempts"
        harness.wait_until(lambda: harness.in_flight() == 0, timeout=20)
        assert harness.redis.llen(harness.queue) == 0
        harness.after_a_mover_pass(redis.Redis.from_url(store.url))
        assert len(harness.dead_letters()) == 1
    finally:
        store.stop()


def test_a_failed_write_is_retried_soon_after_redis_is_back_not_after_the_visibility_timeout(harness):
    """Default visibility timeout (1 h): the worker itself retries the park, the task does not run again."""
    store = RedisServer().start()
    try:
        harness.extra_env["DLQ_TEST_CONF"] = json.dumps({"dlq_redis_url": store.url})
        worker = harness.worker(concurrency=1)
        store.stop()
        result = harness.send("proj.flaky", args=(1,))  # fails once, then succeeds
        harness.wait_until(lambda: harness.deliveries(result.id), message="first delivery")
        worker.wait_for_log("trying again in 1s", timeout=20)
        worker.wait_for_log("trying again in 2s", timeout=20)   # a failed retry while Redis is down
        assert harness.in_flight() == 1, "still unacknowledged while the store is down"
        store = RedisServer(port=store.port).start()  # back, empty
        harness.wait_until(lambda: len(harness.deliveries(result.id)) == 2, timeout=30,
                           message="parked by a retried write, then redelivered")
        assert [d["delivery"] for d in harness.deliveries(result.id)] == [1, 2], "the task body ran once per delivery"
        harness.wait_until(lambda: harness.in_flight() == 0, timeout=10)
        assert harness.dead_letters() == []
    finally:
        store.stop()
