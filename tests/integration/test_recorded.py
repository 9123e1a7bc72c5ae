"""A real worker's dead letters are recorded alike whatever their reason: the DLQ, the stats, the metric, the
trend, the archive and the task_dead_lettered signal agree, an invalid message found by the fetch included.

Which code writes those records is tested in tests/unit/test_recorder.py.
"""
from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from celery_dlq import headers as H
from celery_dlq.headers import Reason
from celery_dlq.storage import totals, trends
from celery_dlq.storage.archive import EventLog
from celery_dlq.storage.events import EventType
from celery_dlq.storage.keys import Keys, Stat
from celery_dlq.storage.totals import Metric
from tests.integration.test_fetch_path import envelope, template

pytestmark = pytest.mark.integration


def records(harness) -> dict[str, Counter]:
    """Each record of the test's dead letters, counted by reason."""
    keys, client = Keys(harness.prefix), harness.redis
    metric: Counter = Counter()
    for (name, labels), n in totals.read(client, keys).items():
        if name == Metric.DEAD_LETTERED:
            assert dict(labels)["queue"] == harness.queue
            metric[dict(labels)["reason"]] += n
    trend = trends.parse(client.hgetall(keys.trends).items(), time.time())
    by_reason = Counter({name: sum(values) for (kind, dim, name), values in trend.minutes.items()
                         if kind == "dead_lettered" and dim == "reason"})
    assert sum(trend.total("dead_lettered")) == sum(by_reason.values()), "the queue's series and the reasons' agree"
    archive = Counter(event.reason for _, event in EventLog(client, keys, 100_000).events()
                      if event.type == EventType.DEAD_LETTERED)
    return {
        "dlq": Counter(letter["headers"][H.REASON] for letter in harness.dead_letters()),
        "metric": metric, "trend": by_reason, "archive": archive,
        "signal": Counter(signal["reason"] for signal in signals(harness)),
        "stats": Counter({"all": int(client.hget(keys.stats, Stat.DEAD_LETTERED) or 0)}),
    }


def signals(harness) -> list[dict]:
    return [json.loads(raw) for raw in harness.redis.lrange(f"{harness.prefix}:signals", 0, -1)]


def push_invalid(harness) -> None:
    """Two list elements that cannot be tasks: one fetch.lua quarantines, one the fetch's validation refuses."""
    harness.redis.lpush(harness.queue, b"\x00 not a kombu message")
    harness.redis.lpush(harness.queue, json.dumps(envelope(template(harness), 1, body="!! not base64")))


def settled(harness, n: int) -> None:
    harness.wait_until(lambda: len(harness.dead_letters()) == n and len(signals(harness)) == n, timeout=60,
                       message=f"{n} dead letters and their signals")


def test_an_invalid_message_raises_the_trend_the_signal_and_the_metric_alike(harness):
    harness.worker(concurrency=1, DLQ_TEST_SIGNALS="1")
    push_invalid(harness)
    settled(harness, 2)
    assert all(letter["headers"].get(H.RAW) for letter in harness.dead_letters()), "stored raw, as evidence"
    both = Counter({Reason.INVALID_MESSAGE: 2})
    assert records(harness) == {"dlq": both, "metric": both, "trend": both, "archive": both, "signal": both,
                                "stats": Counter({"all": 2})}
    for signal in signals(harness):
        assert (signal["sender"], signal["task_id"], signal["task_name"]) == (None, None, None)
        assert signal["original_queue"] == harness.queue and signal["dead_letter_queue"] == f"DLQ.{harness.queue}"
        assert signal["exception"]["type"] == "celery_dlq.errors.InvalidMessage" and signal["delivery_count"] == 1
    assert {key for (_, labels) in totals.read(harness.redis, Keys(harness.prefix))
            for key in [dict(labels).get("task")]} == {""}, "not a task: counted with task=''"


def test_every_reason_a_worker_dead_letters_is_recorded_alike(harness):
    harness.worker(concurrency=2, DLQ_TEST_SIGNALS="1")
    sent = {
        Reason.NON_RETRYABLE: [harness.send("proj.not_retryable")],
        Reason.MAX_DELIVERY_ATTEMPTS: [harness.send("proj.always_fails")],
        Reason.TIME_LIMIT: [harness.send("proj.soft_limited")],
        Reason.WORKER_LOST: [harness.send("proj.poison")],
        Reason.EXPIRED: [harness.send("proj.fails_slow_retry", expires=2)],
        Reason.UNKNOWN_TASK: [harness.send("proj.does_not_exist")],
    }
    with harness.app.producer_or_acquire() as producer:   # a content type the worker does not accept
        producer.publish(b"\x80\x04not-json", routing_key=harness.queue, content_type="application/x-evil",
                         content_encoding="binary", headers={"task": "proj.noop", "id": "bad-1"})
    push_invalid(harness)
    assert set(sent) | {Reason.INVALID_MESSAGE} == set(Reason.ALL)
    expected = Counter({reason: 1 for reason in sent}) + Counter({Reason.INVALID_MESSAGE: 3})
    settled(harness, sum(expected.values()))
    assert records(harness) == {"dlq": expected, "metric": expected, "trend": expected, "archive": expected,
                                "signal": expected, "stats": Counter({"all": sum(expected.values())})}
    by_id = {signal["task_id"]: signal for signal in signals(harness)}
    for reason, results in sent.items():
        for result in results:
            assert by_id[result.id]["reason"] == reason
            assert by_id[result.id]["sender"] == by_id[result.id]["task_name"]
