"""The example webhook receiver (examples/monitoring/webhook.py) in a real prefork worker, posting to a real
local HTTP server: a hanging webhook does not hold up dead-lettering.
"""
from __future__ import annotations

import pytest

from tests.unit.test_webhook import Sink

pytestmark = pytest.mark.integration


@pytest.fixture
def sink():
    started = Sink()
    yield started
    started.close()


def test_a_worker_posts_its_dead_letters_and_a_hanging_webhook_does_not_hold_it_up(harness, sink):
    harness.worker(DLQ_TEST_WEBHOOK=sink.url)
    sink.release.clear()                      # the webhook hangs from the first request on
    refused = [harness.send("proj.not_retryable") for _ in range(3)]
    fails = harness.send("proj.always_fails", args=(1,))
    # Every message reaches its DLQ while the webhook holds its first request.
    harness.wait_until(lambda: len(harness.dead_letters()) == 4, timeout=60, message="four dead letters")
    assert len(sink.posts) == 1
    sink.release.set()
    bodies = {post["body"]["task_id"]: post["body"] for post in sink.wait_for(4, timeout=30)}
    assert set(bodies) == {r.id for r in refused} | {fails.id}
    assert bodies[fails.id] == {
        "event": "task_dead_lettered", "task_id": fails.id, "task_name": "proj.always_fails",
        "queue": harness.queue, "dead_letter_queue": f"DLQ.{harness.queue}", "reason": "max_delivery_attempts",
        "delivery_count": 3, "exception_type": "ValueError"}
    assert {bodies[r.id]["reason"] for r in refused} == {"non_retryable"}
    assert all(post["path"] == "/hooks/s3cr3t" for post in sink.posts)
