"""Which deliveries the strategy counts before they run."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from celery_dlq.counting import _waits_for_eta


def test_a_message_waiting_for_its_eta_is_not_counted_yet():
    now = datetime.now(timezone.utc)
    assert _waits_for_eta({"eta": (now + timedelta(hours=1)).isoformat()})
    assert _waits_for_eta({"eta": (now + timedelta(hours=1)).replace(tzinfo=None).isoformat()})  # naive: UTC
    assert not _waits_for_eta({"eta": (now - timedelta(seconds=1)).isoformat()})   # due: it runs now
    assert not _waits_for_eta({"eta": None})
    assert not _waits_for_eta({})
    assert not _waits_for_eta({"eta": "not a time"})  # counted: an unreadable ETA runs like no ETA
