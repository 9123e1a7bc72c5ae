"""Issue 14, points 1 and 4 end to end: Celery's ``expires`` and ``self.retry(args=..., kwargs=...)``.

Real redis-server, real prefork workers. Before these changes an expiring
message that failed was parked past its expiry, redelivered, and discarded
by Celery as expired (no dead letter, no count); a retry with new arguments
took Celery's in-memory ETA path (nothing parked, delivery counts lost).
"""
from __future__ import annotations

import base64
import json
import subprocess
import sys
import time

import pytest
import redis
from celery import Celery

from celery_dlq import headers as H
from tests.integration.conftest import ROOT

pytestmark = pytest.mark.integration


def store_keys(prefix: str) -> dict[str, str]:
    base = f"{{{prefix}}}"
    return {name: f"{base}:{name}" for name in ("delayed", "leases", "payloads", "expiries", "stats")}


def assert_store_empty(client: redis.Redis, prefix: str) -> None:
    keys = store_keys(prefix)
    assert client.zcard(keys["delayed"]) == 0
    assert client.zcard(keys["leases"]) == 0
    assert client.hlen(keys["payloads"]) == 0
    assert client.hlen(keys["expiries"]) == 0


def stats(client: redis.Redis, prefix: str) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(store_keys(prefix)["stats"]).items()}


def dlq_cli(harness, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "celery", "-A", "tests.integration.proj", "dlq", *args],
                          cwd=ROOT, env=harness.env(), stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=120)


def test_a_failure_whose_redelivery_would_come_after_expires_is_dead_lettered_at_once(harness):
    with_results(harness)
    harness.worker()
    sent = time.time()
    result = harness.send("proj.fails_slow_retry", expires=2)
    harness.wait_until(lambda: len(harness.dead_letters()) == 1, timeout=20, message="an expired dead letter")
    assert time.time() - sent < 2.0 + 1.0  # at once, not when the 5 s redelivery would have been due
    (letter,) = harness.dead_letters()
    headers = letter["headers"]
    assert headers["id"] == result.id
    assert headers[H.REASON] == "expired"
    assert headers[H.DELIVERY_COUNT] == 1
    assert headers[H.EXCEPTION_TYPE] == "ConnectionError"
    assert headers[H.EXCEPTION_MESSAGE] == "come back in 5 s"
    harness.wait_until(lambda: result.state == "FAILURE", message="FAILURE recorded")  # the last failure
    assert isinstance(result.result, ConnectionError)
    metrics = {k.decode(): int(v) for k, v in harness.redis.hgetall(f"{{{harness.prefix}}}:metrics").items()}
    assert [v for k, v in metrics.items() if k.startswith("dead_lettered_total") and 'reason="expired"' in k] == [1]
    counted = stats(harness.redis, harness.prefix)
    harness.wait_until(lambda: time.time() > sent + 2.0, message="past the expiry")
    harness.after_a_mover_pass()   # nothing was parked, so nothing comes back
    assert [r["delivery"] for r in harness.deliveries(result.id)] == [1]
    assert_store_empty(harness.redis, harness.prefix)
    assert counted.get("dead_lettered") == 1 and counted.get("expired") == 1 and "parked" not in counted
    listed = dlq_cli(harness, "list", harness.queue, "--reason", "expired", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [row["task_id"] for row in json.loads(listed.stdout)] == [result.id]
    other = dlq_cli(harness, "list", harness.queue, "--reason", "max_delivery_attempts")
    assert other.returncode != 0 and "nothing matched" in other.stderr + other.stdout


@pytest.mark.parametrize("fmt", ["direct", "publish"])
def test_a_parked_message_that_expires_while_parked_is_dead_lettered_when_due_and_never_runs(harness, fmt):
    """The only worker stops while the message is parked; when one starts after the expiry its mover
    dead-letters the entry instead of moving it (direct format: inside Redis; publish format: a store
    apart from the broker)."""
    store = separate_store(harness) if fmt == "publish" else harness.redis
    keys = store_keys(harness.prefix)
    with_results(harness)
    try:
        first = harness.worker(name="w1")
        result = harness.send("proj.fails_retry_3s", expires=4)
        expires_at = time.time() + 4
        harness.wait_until(lambda: store.zcard(keys["delayed"]) == 1, timeout=10, message="the parked copy")
        assert store.hlen(keys["expiries"]) == 1  # parked with its expiry beside it (due 3 s < expiry 4 s)
        first.stop()
        assert store.zcard(keys["delayed"]) == 1, "the mover moved it before the worker stopped"
        time.sleep(max(0.0, expires_at - time.time()) + 0.3)
        harness.worker(name="w2")
        harness.wait_until(lambda: len(harness.dead_letters()) == 1, timeout=20, message="an expired dead letter")
        (letter,) = harness.dead_letters()
        headers = letter["headers"]
        assert headers["id"] == result.id
        assert headers[H.REASON] == "expired"
        assert headers[H.DELIVERY_COUNT] == 1 and headers["retries"] == 0  # the one delivery that ran
        assert headers[H.EXCEPTION_TYPE] == "ConnectionError"
        assert headers[H.EXCEPTION_MESSAGE] == "come back in 3 s"
        assert headers[H.WORKER].startswith("w2@")
        harness.wait_until(lambda: result.state == "REVOKED", message="REVOKED recorded")  # as Celery would

        assert json.loads(base64.b64decode(letter["body"]))[0] == []  # the original message's body
        counted = stats(store, harness.prefix)
        harness.after_a_mover_pass(store)
        assert [r["delivery"] for r in harness.deliveries(result.id)] == [1]  # never ran again
        assert harness.redis.llen(harness.queue) == 0
        assert_store_empty(store, harness.prefix)
        assert counted.get("parked") == 1 and counted.get("expired") == 1 and counted.get("dead_lettered") == 1
        assert "redelivered" not in counted
    finally:
        if store is not harness.redis:
            drop_store(store, harness.prefix)


def test_expired_drop_counts_and_logs_the_message_and_keeps_nothing(harness):
    worker = harness.worker(DLQ_TEST_CONF=json.dumps(
        {"dlq_task_policies": {"proj.fails_slow_retry": {"expired": "drop"}}}))
    result = harness.send("proj.fails_slow_retry", expires=2)
    harness.wait_until(lambda: stats(harness.redis, harness.prefix).get("dropped") == 1, timeout=20,
                       message="the drop counted")
    assert stats(harness.redis, harness.prefix).get("expired") == 1
    harness.after_a_mover_pass()
    assert harness.dead_letters() == []
    assert harness.redis.llen(harness.queue) == 0
    assert [r["delivery"] for r in harness.deliveries(result.id)] == [1]
    assert_store_empty(harness.redis, harness.prefix)
    assert f"dropping proj.fails_slow_retry[{result.id}]" in worker.log()
    assert "expired='drop'" in worker.log()
    shown = dlq_cli(harness, "stats", "--json")
    assert shown.returncode == 0, shown.stderr
    counters = {row["name"]: row["value"] for row in json.loads(shown.stdout)}
    assert counters["dropped"] == 1 and counters["expired"] == 1


def configure(harness, **settings) -> None:
    """Add ``settings`` to the workers' configuration (DLQ_TEST_CONF)."""
    conf = json.loads(harness.extra_env.get("DLQ_TEST_CONF", "{}"))
    harness.extra_env["DLQ_TEST_CONF"] = json.dumps({**conf, **settings})


def with_results(harness) -> Celery:
    """Workers and a client app with the broker's Redis as result backend: what Celery records is read back."""
    configure(harness, result_backend=harness.broker)
    harness.app.conf.result_backend = harness.broker
    return harness.app


def separate_store(harness) -> redis.Redis:
    """Parked copies in the publish format: the store on another database of the test's redis-server
    (database 0, which no harness uses as its broker, so no other test's cleanup flushes it)."""
    url = harness.broker.rsplit("/", 1)[0] + "/0"
    configure(harness, dlq_redis_url=url)
    return redis.Redis.from_url(url)


def drop_store(store: redis.Redis, prefix: str) -> None:
    names = ("delayed", "leases", "payloads", "expiries", "stats", "parked", "events", "metrics", "queues")
    store.delete(*(f"{{{prefix}}}:{name}" for name in names))
    store.close()


@pytest.mark.parametrize("fmt", ["direct", "publish"])
def test_retry_with_new_arguments_parks_a_copy_carrying_them(harness, fmt):
    store = separate_store(harness) if fmt == "publish" else harness.redis
    try:
        _retry_with_new_arguments(harness, store)
    finally:
        if store is not harness.redis:
            drop_store(store, harness.prefix)


def _retry_with_new_arguments(harness, store: redis.Redis) -> None:
    harness.worker()
    result = harness.send("proj.retry_new_args", args=(0,), kwargs={"until": 2})
    harness.wait_until(lambda: len(harness.deliveries(result.id)) == 3, message="3 deliveries")
    rows = harness.deliveries(result.id)
    assert [r["delivery"] for r in rows] == [1, 2, 3]
    assert [r["retries"] for r in rows] == [0, 1, 2]
    assert [(r["args"], r["kwargs"]) for r in rows] == [
        ([0], {"until": 2}), ([1], {"until": 2, "note": "retry 1"}), ([2], {"until": 2, "note": "retry 2"})]
    # Parked in Redis like any other redelivery (Celery's own path would hold an ETA message in memory).
    counted = stats(store, harness.prefix)
    assert counted.get("parked") == 2 and counted.get("redelivered") == 2
    harness.after_a_mover_pass(store)
    assert len(harness.deliveries(result.id)) == 3
    assert harness.dead_letters() == []
    assert_store_empty(store, harness.prefix)
    harness.wait_until(lambda: harness.in_flight() == 0, message="no unacked messages")


def test_retry_with_new_arguments_counts_deliveries_and_dead_letters_the_last_arguments(harness):
    harness.worker()
    result = harness.send("proj.retry_new_args", args=(0,), kwargs={"until": 10})
    harness.wait_until(lambda: len(harness.dead_letters()) == 1, message="a dead letter")
    assert [(r["delivery"], r["args"]) for r in harness.deliveries(result.id)] == [(1, [0]), (2, [1]), (3, [2])]
    (letter,) = harness.dead_letters()
    headers = letter["headers"]
    assert headers["id"] == result.id and headers[H.REASON] == "max_delivery_attempts"
    assert headers[H.DELIVERY_COUNT] == 3
    args, kwargs, _embed = json.loads(base64.b64decode(letter["body"]))
    assert (args, kwargs) == ([2], {"until": 10, "note": "retry 2"})
    assert headers["argsrepr"] == "[2]"


def test_a_lost_worker_whose_redelivery_would_come_after_expires_is_dead_lettered_at_once(harness):
    harness.worker()
    sent = time.time()
    result = harness.send("proj.poison_slow_retry", expires=3)
    harness.wait_until(lambda: len(harness.dead_letters()) == 1, timeout=20, message="an expired dead letter")
    headers = harness.dead_letters()[0]["headers"]
    assert headers["id"] == result.id and headers[H.REASON] == "expired"
    assert headers[H.EXCEPTION_TYPE] == "billiard.exceptions.WorkerLostError"
    harness.wait_until(lambda: time.time() > sent + 3.0, message="past the expiry")
    harness.after_a_mover_pass()
    assert [r["delivery"] for r in harness.deliveries(result.id)] == [1]
    assert_store_empty(harness.redis, harness.prefix)


@pytest.mark.parametrize("with_exc", [False, True])
def test_a_retry_asked_for_after_expires_is_dead_lettered_at_once(harness, with_exc):
    harness.worker()
    result = harness.send("proj.retries_later", kwargs={"countdown": 5.0, "with_exc": with_exc}, expires=2)
    harness.wait_until(lambda: len(harness.dead_letters()) == 1, timeout=20, message="an expired dead letter")
    headers = harness.dead_letters()[0]["headers"]
    assert headers["id"] == result.id and headers[H.REASON] == "expired"
    if with_exc:  # the task's own exception, as Celery's retry() raises it when it cannot retry
        assert (headers[H.EXCEPTION_TYPE], headers[H.EXCEPTION_MESSAGE]) == ("TimeoutError", "upstream timeout")
    else:
        assert headers[H.EXCEPTION_TYPE] == "celery_dlq.errors.MessageExpired"
        assert "would come after the message expires" in headers[H.EXCEPTION_MESSAGE]
    assert [r["delivery"] for r in harness.deliveries(result.id)] == [1]
    assert_store_empty(harness.redis, harness.prefix)


def test_retry_arguments_the_serializer_cannot_encode_dead_letter_the_original(harness):
    with_results(harness)
    worker = harness.worker()
    result = harness.send("proj.retry_unencodable_args")
    harness.wait_until(lambda: len(harness.dead_letters()) == 1, message="a dead letter")
    headers = harness.dead_letters()[0]["headers"]
    assert headers["id"] == result.id and headers[H.REASON] == "non_retryable"
    assert headers[H.EXCEPTION_TYPE] == "kombu.exceptions.EncodeError"
    assert json.loads(base64.b64decode(harness.dead_letters()[0]["body"]))[0] == []  # the original arguments
    harness.wait_until(lambda: result.state == "FAILURE", message="FAILURE recorded")
    assert [r["delivery"] for r in harness.deliveries(result.id)] == [1]
    assert "cannot encode the new retry arguments" in worker.log()
    assert_store_empty(harness.redis, harness.prefix)
    harness.wait_until(lambda: harness.in_flight() == 0, message="no unacked messages")


def test_a_redelivered_copy_that_expires_waiting_for_a_pool_process_is_dead_lettered(harness):
    """Moved back in time, but the only pool process is busy until after the expiry: Celery would
    discard the copy before running it (REVOKED); it is dead-lettered instead."""
    with_results(harness)
    harness.worker(concurrency=1)
    result = harness.send("proj.fails_retry_3s", expires=5)           # fails at once, parked for 3 s
    harness.wait_until(lambda: len(harness.deliveries(result.id)) == 1, message="the first delivery")
    blocker = harness.send("proj.sleeps", kwargs={"seconds": 7.0})   # holds the pool past the expiry
    harness.wait_until(lambda: len(harness.deliveries(blocker.id)) == 1, message="the blocker running")
    harness.wait_until(lambda: len(harness.dead_letters()) == 1, timeout=20, message="an expired dead letter")
    headers = harness.dead_letters()[0]["headers"]
    assert headers["id"] == result.id and headers[H.REASON] == "expired"
    assert headers[H.DELIVERY_COUNT] == 1 and headers[H.EXCEPTION_MESSAGE] == "come back in 3 s"
    harness.wait_until(lambda: result.state == "REVOKED", message="REVOKED recorded, as Celery does")
    assert [r["delivery"] for r in harness.deliveries(result.id)] == [1]
    counted = stats(harness.redis, harness.prefix)
    assert counted.get("redelivered") == 1 and counted.get("expired") == 1
    harness.wait_until(lambda: harness.in_flight() == 0, message="no unacked messages")


def test_a_first_delivery_that_expires_in_the_queue_is_left_to_celery(harness):
    """Nothing failed yet: Celery's own expires (REVOKED, discarded) applies, no dead letter."""
    with_results(harness)
    harness.worker(concurrency=1)
    blocker = harness.send("proj.sleeps", kwargs={"seconds": 3.0})
    harness.wait_until(lambda: len(harness.deliveries(blocker.id)) == 1, message="the blocker running")
    result = harness.send("proj.noop", expires=1)
    harness.wait_until(lambda: result.state == "REVOKED", timeout=20, message="REVOKED by Celery")
    assert harness.deliveries(result.id) == [] and harness.dead_letters() == []
