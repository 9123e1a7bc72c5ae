"""Every Redis command the operator API and retention send is sent from storage/ (issue 44).

Each command a client sends, or queues on a pipeline, is traced back to the
innermost frame of celery-dlq's own code: that frame must be in
``celery_dlq/storage/``. The operations below run against fakeredis while
the tracer is on; the letters are put there (by the worker's dead-letterer)
before it is.
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.client

import celery_dlq
from celery_dlq.ops import Filter, Operator, PlanReplay, TaskIds
from celery_dlq.ops.audit import Actor
from celery_dlq.ops.edit import Edit, replay_edited
from celery_dlq.ops.window import find_letter, letter_at, read_window
from celery_dlq.worker.deadletter.retention import Retention
from tests.unit.test_manage import T0, FakeClock, dead_letter

PACKAGE = Path(celery_dlq.__file__).parent
STORAGE = PACKAGE / "storage"


def _sender() -> Path | None:
    """The innermost frame of celery-dlq's own code on the stack (None: none, as for a test's own command)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if PACKAGE in path.parents:
            return path
        frame = frame.f_back
    return None


@contextlib.contextmanager
def sent_from(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str]]]:
    """Note ``(command, module)`` for every command sent (or queued) by celery-dlq's code while inside."""
    seen: list[tuple[str, str]] = []

    def tracing(original):
        def execute_command(self, *args, **options):
            sender = _sender()
            if sender is not None:
                seen.append((str(args[0]), str(sender.relative_to(PACKAGE))))
            return original(self, *args, **options)
        return execute_command

    with monkeypatch.context() as patch:
        patch.setattr(redis.client.Redis, "execute_command", tracing(redis.client.Redis.execute_command))
        patch.setattr(redis.client.Pipeline, "execute_command", tracing(redis.client.Pipeline.execute_command))
        yield seen


def outside_storage(seen: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return sorted({(command, module) for command, module in seen if not module.startswith("storage/")})


@pytest.fixture
def op(app, fake):
    return Operator(app, broker=fake, client=fake, clock=FakeClock())


def test_the_tracer_sees_a_command_sent_outside_storage(op, monkeypatch):
    """The check itself: a command sent from ops/ is caught (as ``Backend.depth`` sent LLEN before issue 44)."""
    from celery_dlq.ops import backend

    with sent_from(monkeypatch) as seen:
        backend.Backend.list_keys(op, "DLQ.orders")   # no command
        exec(compile("op.client.llen('DLQ.orders')", str(PACKAGE / "ops" / "backend.py"), "exec"), {"op": op})
    assert outside_storage(seen) == [("LLEN", "ops/backend.py")]


def test_reading_a_dlq_sends_every_command_from_storage(op, fake, monkeypatch):
    letters = [dead_letter(fake, args=(i,), at=T0 + i, priority=9 if i % 2 else 0) for i in range(6)]
    fake.lpush(op.keys.quarantine("orders"), b"\x00raw")
    with sent_from(monkeypatch) as seen:
        rows = op.queues()
        op.sizes([row.name for row in rows if row.name])
        op.stats(rows)
        op.totals()
        op.trends()
        op.groups()
        dead = op.queue("orders")
        assert dead.count() == 6 and dead.count(Filter(task_id=letters[2].task_id)) == 1
        assert dead.get(letters[3].task_id) is not None
        window = read_window(dead, 0, 3, newest_first=True)
        assert len(window.letters) == 3
        read_window(dead, 0, 3, where=Filter(task_name="shop.charge"))
        assert letter_at(dead, 99, letters[1].task_id) is not None
        assert find_letter(dead, letters[4].task_id, (0, 1)) is not None
        op.details(letters[0])
        list(op.queue("quarantine:orders").entries())
    assert seen and outside_storage(seen) == []


def test_replaying_purging_and_trimming_send_every_command_from_storage(op, fake, monkeypatch):
    letters = [dead_letter(fake, args=(i,), at=T0 + i) for i in range(12)]
    dead = op.queue("orders")
    with sent_from(monkeypatch) as seen:
        assert dead.replay(TaskIds([letters[0].task_id])).done == 1
        assert dead.replay(Filter(task_id=letters[1].task_id), rate=1000).done == 1
        assert replay_edited(dead, Edit(letters[2].task_id, args=[7]), Actor.of()).done == 1
        assert PlanReplay(op, {"DLQ.orders": [letters[3].task_id]}).replay("DLQ.orders").done == 1
        assert dead.purge(TaskIds([letters[4].task_id], every=True), force=True).done == 1
        assert Retention(op.side).trim("DLQ.orders", max_length=5) == 2
        assert dead.purge(force=True).done == 5
    assert seen and outside_storage(seen) == []


def test_purging_whole_lists_sends_every_command_from_storage(app, fake, monkeypatch):
    app.conf.dlq_events_max_length = 0   # no archive: the lists go whole, in one transaction
    op = Operator(app, broker=fake, client=fake, clock=FakeClock())
    for i in range(3):
        dead_letter(fake, args=(i,), at=T0 + i)
    with sent_from(monkeypatch) as seen:
        assert op.queue("orders").purge(force=True).done == 3
    assert ("DEL", "storage/dlq.py") in seen and outside_storage(seen) == []
