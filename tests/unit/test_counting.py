"""Which deliveries the strategy counts before they run."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

from celery_dlq import headers as H
from celery_dlq.worker.run.strategy import _waits_for_eta


def test_a_message_waiting_for_its_eta_is_not_counted_yet():
    now = datetime.now(timezone.utc)
    assert _waits_for_eta({"eta": (now + timedelta(hours=1)).isoformat()})
    assert _waits_for_eta({"eta": (now + timedelta(hours=1)).replace(tzinfo=None).isoformat()})  # naive: UTC
    assert not _waits_for_eta({"eta": (now - timedelta(seconds=1)).isoformat()})   # due: it runs now
    assert not _waits_for_eta({"eta": None})
    assert not _waits_for_eta({})
    assert not _waits_for_eta({"eta": "not a time"})  # counted: an unreadable ETA runs like no ETA


class FakeDLQ:
    """The runtime as the strategy uses it: delivery counters and one message's context."""

    def __init__(self, policy, stored: int | None = None) -> None:
        self.calls: list[tuple] = []
        self.stored = stored
        self.policy = policy
        self.counters = self

    def count(self, task_id, tag, floor):
        self.calls.append((task_id, tag, floor))
        return floor + 1 if self.stored is None else max(self.stored + 1, floor)

    def context(self, message):
        return SimpleNamespace(policy=self.policy, delivery=H.delivery_count_of(message.headers))


class FakeMessage:
    def __init__(self, headers: dict, redelivered: bool = False) -> None:
        self.headers = headers
        self.properties = {"delivery_tag": "tag-1"}
        self.delivery_info = {"exchange": "", "routing_key": "q", **({"redelivered": True} if redelivered else {})}


def test_a_first_delivery_costs_no_redis_call_a_restored_one_is_counted():
    from celery_dlq import RedeliveryPolicy
    from celery_dlq import headers as H
    from celery_dlq.worker.features.delivery_counts import count_or_dead_letter
    from celery_dlq.worker.middleware import Chain

    policy = RedeliveryPolicy(max_delivery_attempts=3)
    dlq = FakeDLQ(policy)
    first = FakeMessage({"id": "t1", "task": "x", H.DELIVERY_COUNT: 2})
    assert count_or_dead_letter(dlq, None, first, dlq.context(first), "w", Chain(())) is False
    assert dlq.calls == [] and first.headers[H.DELIVERY_COUNT] == 2
    restored = FakeMessage({"id": "t1", "task": "x", H.DELIVERY_COUNT: 2}, redelivered=True)
    assert count_or_dead_letter(dlq, None, restored, dlq.context(restored), "w", Chain(())) is False
    assert dlq.calls == [("t1", "tag-1", 2)] and restored.headers[H.DELIVERY_COUNT] == 3
