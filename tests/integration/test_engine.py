"""The redelivery engine end to end: real redis-server, real prefork workers."""
from __future__ import annotations

import json

import pytest

from celery_dlq import headers as H

pytestmark = pytest.mark.integration


def test_flaky_task_is_redelivered_on_policy_schedule_then_succeeds(harness):
    harness.worker()
    result = harness.send("proj.flaky", args=(2,), kwargs={"tag": "abc"})
    harness.wait_until(lambda: len(harness.deliveries(result.id)) == 3, message="3 deliveries")
    rows = harness.deliveries(result.id)
    assert [r["delivery"] for r in rows] == [1, 2, 3]
    assert [r["retries"] for r in rows] == [0, 1, 2]
    assert {r["id"] for r in rows} == {result.id}
    assert all(r["args"] == [2] and r["kwargs"] == {"tag": "abc"} for r in rows)
    gaps = [b["at"] - a["at"] for a, b in zip(rows, rows[1:])]
    # policy: delay 0.3 s, multiplier 2 -> 0.3 s then 0.6 s (mover interval 0.05 s)
    assert 0.3 <= gaps[0] < 0.3 + 1.0, gaps
    assert 0.6 <= gaps[1] < 0.6 + 1.0, gaps
    harness.wait_until(lambda: harness.redis.zcard(f"{{{harness.prefix}}}:delayed") == 0)
    assert harness.dead_letters() == []


DEAD_LETTER_HEADERS = (
    H.DELIVERY_COUNT, H.ORIGINAL_QUEUE, H.ORIGINAL_EXCHANGE, H.ORIGINAL_ROUTING_KEY,
    H.FIRST_FAILURE_AT, H.LAST_EXCEPTION, H.REASON, H.EXCEPTION_TYPE, H.EXCEPTION_MESSAGE,
    H.TRACEBACK, H.DEAD_LETTERED_AT, H.WORKER,
)


def test_always_failing_task_ends_in_its_dlq_with_every_header(harness):
    harness.worker()
    result = harness.send("proj.always_fails", args=(7,))
    harness.wait_until(lambda: len(harness.dead_letters()) == 1, message="a dead letter")
    assert [r["delivery"] for r in harness.deliveries(result.id)] == [1, 2, 3]
    (letter,) = harness.dead_letters()
    headers = letter["headers"]
    for name in DEAD_LETTER_HEADERS:
        assert name in headers, name
    assert headers["id"] == result.id and headers["task"] == "proj.always_fails"
    assert headers[H.REASON] == "max_delivery_attempts"
    assert headers[H.DELIVERY_COUNT] == 3
    assert headers[H.ORIGINAL_QUEUE] == harness.queue
    assert headers[H.ORIGINAL_ROUTING_KEY] == harness.queue
    assert headers[H.EXCEPTION_TYPE] == "ValueError"
    assert headers[H.EXCEPTION_MESSAGE] == "always fails #7"
    assert headers[H.LAST_EXCEPTION] == "ValueError: always fails #7"
    assert "Traceback" in headers[H.TRACEBACK] and "always fails #7" in headers[H.TRACEBACK]
    assert headers[H.WORKER].startswith("w1@")
    assert headers[H.FIRST_FAILURE_AT] <= headers[H.DEAD_LETTERED_AT]
    # The body is the original one, untouched: same args, decodable by kombu.
    import base64
    import json
    assert json.loads(base64.b64decode(letter["body"]))[0] == [7]
    assert harness.redis.llen(f"DLQ.{harness.queue}") == 1
    assert harness.redis.zcard(f"{{{harness.prefix}}}:delayed") == 0
    assert harness.redis.zcard(f"{{{harness.prefix}}}:leases") == 0
    assert harness.redis.hlen(f"{{{harness.prefix}}}:payloads") == 0
    assert harness.redis.llen(harness.queue) == 0
    # Celery's result state and the message: acknowledged, nothing left unacked.
    harness.wait_until(lambda: harness.in_flight() == 0, message="no unacked messages")


def test_non_retryable_exception_goes_straight_to_the_dlq(harness):
    harness.worker()
    result = harness.send("proj.not_retryable")
    harness.wait_until(lambda: len(harness.dead_letters()) == 1)
    assert len(harness.deliveries(result.id)) == 1
    headers = harness.dead_letters()[0]["headers"]
    assert headers[H.REASON] == "non_retryable"
    assert headers[H.EXCEPTION_TYPE] == "KeyError"


def test_a_dead_letter_on_exception_is_non_retryable_even_on_the_last_allowed_delivery(harness):
    harness.worker(DLQ_TEST_CONF=json.dumps({"dlq_task_policies": {"proj.not_retryable": {"max_delivery_attempts": 1}}}))
    harness.send("proj.not_retryable")
    harness.wait_until(lambda: len(harness.dead_letters()) == 1)
    assert harness.dead_letters()[0]["headers"][H.REASON] == "non_retryable"


def test_self_retry_goes_through_the_parked_path_and_counts_deliveries(harness):
    harness.worker()
    result = harness.send("proj.uses_retry")
    harness.wait_until(lambda: len(harness.deliveries(result.id)) == 3)
    rows = harness.deliveries(result.id)
    assert [r["delivery"] for r in rows] == [1, 2, 3]
    assert all(b["at"] - a["at"] >= 0.2 for a, b in zip(rows, rows[1:]))
    assert harness.redis.hget(f"{{{harness.prefix}}}:stats", "parked") == b"2"
    assert harness.dead_letters() == []


def test_other_messages_flow_while_one_waits_out_its_delay(harness):
    harness.worker(concurrency=2)
    slow = harness.send("proj.slow_parked")
    harness.wait_until(lambda: len(harness.deliveries(slow.id)) == 1)
    first_at = harness.deliveries(slow.id)[0]["at"]
    ids = [harness.send("proj.noop", args=(i,)).id for i in range(100)]
    harness.wait_until(lambda: all(harness.deliveries(i) for i in ids), message="100 noop tasks")
    done_at = max(harness.deliveries(i)[0]["at"] for i in ids)
    assert len(harness.deliveries(slow.id)) == 1, "the parked task must still be waiting"
    assert done_at - first_at < 2.0
    harness.wait_until(lambda: len(harness.deliveries(slow.id)) == 2, timeout=10)
    assert harness.deliveries(slow.id)[1]["at"] - first_at >= 2.0
    # Every delivery was counted in Redis first; once acknowledged, no counter is left behind.
    counters = lambda: harness.redis.keys(f"{{{harness.prefix}}}:count:*")  # noqa: E731
    harness.wait_until(lambda: counters() == [], timeout=10, message="delivery counters deleted")


def test_poison_task_is_dead_lettered_worker_lost_and_worker_survives(harness):
    worker = harness.worker(concurrency=1)
    poison = harness.send("proj.poison")
    harness.wait_until(lambda: len(harness.dead_letters()) == 1, timeout=60, message="poison dead letter")
    assert [r["delivery"] for r in harness.deliveries(poison.id)] == [1, 2, 3]
    headers = harness.dead_letters()[0]["headers"]
    assert headers[H.REASON] == "worker_lost"
    assert headers[H.DELIVERY_COUNT] == 3
    after = harness.send("proj.noop", args=(1,))
    harness.wait_until(lambda: harness.deliveries(after.id), message="normal task after poison")
    assert worker.proc.poll() is None
    assert len(harness.deliveries(poison.id)) == 3  # never run again


def test_unregistered_task_is_dead_lettered_unknown_task(harness):
    harness.worker()
    result = harness.send("proj.does_not_exist", args=(1, 2))
    harness.wait_until(lambda: len(harness.dead_letters()) == 1)
    headers = harness.dead_letters()[0]["headers"]
    assert headers[H.REASON] == "unknown_task"
    assert headers["id"] == result.id
    assert headers["task"] == "proj.does_not_exist"
    assert harness.redis.llen(harness.queue) == 0


def test_invalid_message_is_dead_lettered_invalid_message(harness):
    harness.worker()
    with harness.app.producer_or_acquire() as producer:
        # Protocol-2 headers but a content type the worker does not accept.
        producer.publish(b"\x80\x04not-json", routing_key=harness.queue, content_type="application/x-evil",
                         content_encoding="binary", headers={"task": "proj.noop", "id": "bad-1"})
    harness.wait_until(lambda: len(harness.dead_letters()) == 1)
    letter = harness.dead_letters()[0]
    assert letter["headers"][H.REASON] == "invalid_message"
    assert letter["headers"]["id"] == "bad-1"


def test_bad_setting_stops_the_worker_at_start_naming_it(harness):
    worker = harness.worker(wait_ready=False, DLQ_TEST_CONF='{"dlq_mover_batch_size": 0}')
    worker.proc.wait(timeout=30)
    assert worker.proc.returncode != 0
    assert "dlq_mover_batch_size" in worker.log()


def test_hard_time_limit_is_a_failed_delivery_then_dead_lettered_time_limit(harness):
    worker = harness.worker(concurrency=1)
    result = harness.send("proj.hangs")
    harness.wait_until(lambda: len(harness.dead_letters()) == 1, timeout=60)
    assert [r["delivery"] for r in harness.deliveries(result.id)] == [1, 2]
    headers = harness.dead_letters()[0]["headers"]
    assert headers[H.REASON] == "time_limit"
    assert "TimeLimitExceeded" in headers[H.EXCEPTION_TYPE]
    after = harness.send("proj.noop", args=(2,))
    harness.wait_until(lambda: harness.deliveries(after.id))
    assert len(harness.dead_letters()) == 1, "reported twice by the pool, dead-lettered once"
    assert worker.proc.poll() is None
    harness.wait_until(lambda: harness.in_flight() == 0, message="message acknowledged")
    failures = [json.loads(r) for r in harness.redis.lrange(f"{harness.prefix}:failures", 0, -1)]
    assert [f["id"] for f in failures] == [result.id], "FAILURE recorded once, at the end, not per timeout"


def test_replace_and_reject_are_the_tasks_own_say_not_failed_deliveries(harness):
    harness.worker(concurrency=1)
    replaced = harness.send("proj.replaced", args=(7,))
    rejected = harness.send("proj.rejects")
    harness.wait_until(lambda: [d["args"] for d in harness.deliveries() if d["task"] == "proj.noop"] == [[7]],
                       message="the replacement ran")
    harness.wait_until(lambda: harness.deliveries(rejected.id), message="rejects ran")
    harness.after_a_mover_pass()   # a redelivery (the bug), parked due at once, would have run by now
    # replace() keeps the task id for the replacement: one run of each, not a redelivered original.
    assert [d["task"] for d in harness.deliveries(replaced.id)] == ["proj.replaced", "proj.noop"]
    assert len(harness.deliveries(rejected.id)) == 1
    assert harness.dead_letters() == []
    assert harness.redis.zcard(f"{{{harness.prefix}}}:delayed") == 0


def test_a_task_that_requeues_itself_uses_up_no_attempt_and_is_never_taken_for_a_lost_worker(harness):
    """``Reject(requeue=True)`` with one attempt allowed: kombu redelivers it marked ``redelivered``."""
    harness.worker(concurrency=1)
    result = harness.send("proj.requeues_once")
    harness.wait_until(lambda: len(harness.deliveries(result.id)) == 2, message="the requeued message ran again")
    runs = harness.deliveries(result.id)
    assert [r["run"] for r in runs] == [1, 2]
    assert [r["delivery"] for r in runs] == [1, 1], "the requeue did not count as a delivery"
    assert harness.dead_letters() == []
    assert "worker_lost" not in harness.workers[0].log()


def test_soft_time_limit_is_redelivered_then_dead_lettered_time_limit(harness):
    harness.worker()
    result = harness.send("proj.soft_limited")
    harness.wait_until(lambda: len(harness.dead_letters()) == 1, timeout=30)
    assert [r["delivery"] for r in harness.deliveries(result.id)] == [1, 2]
    headers = harness.dead_letters()[0]["headers"]
    assert headers[H.REASON] == "time_limit"
    assert headers[H.EXCEPTION_TYPE].endswith("SoftTimeLimitExceeded")


def test_messages_reserved_but_never_started_are_not_counted_by_a_warm_shutdown(harness):
    """One delivery allowed: a restart must not dead-letter the prefetched messages that never ran."""
    conf = json.dumps({"dlq_task_policies": {"proj.noop": {"max_delivery_attempts": 1}}})
    first = harness.worker(concurrency=1, DLQ_TEST_CONF=conf)
    busy = harness.send("proj.sleeps", args=(2.0,))
    harness.wait_until(lambda: harness.deliveries(busy.id), message="the busy task started")
    waiting = [harness.send("proj.noop", args=(i,)).id for i in range(3)]
    harness.wait_until(lambda: harness.redis.llen(harness.queue) == 0, message="all three prefetched")
    first.stop()  # SIGTERM: warm shutdown; the busy task finishes, the three never start
    assert "3 reserved message(s) never started" in first.log()
    for task_id in waiting:  # recorded as "delivery 1 did not happen" for the restored copy
        [key] = harness.redis.keys(f"{{{harness.prefix}}}:count:{task_id}:*")
        assert harness.redis.get(key) == b"0"
    assert not any(harness.deliveries(t) for t in waiting)
    harness.worker(concurrency=1, name="w2", DLQ_TEST_CONF=conf)
    harness.wait_until(lambda: all(harness.deliveries(t) for t in waiting), timeout=60,
                       message="the three run after the restart")
    assert [d["delivery"] for t in waiting for d in harness.deliveries(t)] == [1, 1, 1]
    assert harness.dead_letters() == []
    counters = lambda: harness.redis.keys(f"{{{harness.prefix}}}:count:*")  # noqa: E731
    harness.wait_until(lambda: counters() == [], timeout=10, message="counters deleted once acknowledged")
