"""One SparkSession for every Spark test, and a hand-built archive with its report.

Time zones: the JVM runs with a non-UTC default zone (America/New_York), and
the hand-built archive is exported and reported with the process's local
zone set to America/New_York too, on purpose: nothing may depend on either
(the report's session time zone is UTC; export computes UTC dates itself).
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from datetime import datetime, timezone

import fakeredis
import pytest

from tests.services import SPARK_EXTRA

pytest.importorskip("pyspark", reason=SPARK_EXTRA)

from celery_dlq.analytics.export import export_events  # noqa: E402
from celery_dlq.storage.archive import Event, EventLog  # noqa: E402
from celery_dlq.storage.keys import Keys  # noqa: E402

AS_OF = datetime(2024, 3, 15, 12, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="session")
def spark():
    from celery_dlq.analytics.session import build_session

    session = build_session("local[2]", conf=[
        ("spark.driver.extraJavaOptions", "-Duser.timezone=America/New_York"),
        ("spark.sql.shuffle.partitions", "2"),
    ])
    yield session
    session.stop()


def us(text: str) -> int:
    """ISO time (UTC) to integer microseconds."""
    moment = datetime.fromisoformat(text).replace(tzinfo=timezone.utc)
    return int(moment.timestamp()) * 1_000_000


def dead(task_id, task, queue, at, first, delivery, exc, digest, reason="max_delivery_attempts"):
    return Event("dead_lettered", us(at), task_id=task_id, task_name=task, queue=queue, dlq=f"DLQ.{queue}",
                 delivery=delivery, reason=reason, exception_type=exc, exception_message=f"{exc} in {task_id}",
                 first_failure_us=us(first), payload_size=42, payload_hash=digest, worker="w1@host")


def parked(task_id, task, queue, at, exc, digest):
    return Event("parked", us(at), task_id=task_id, task_name=task, queue=queue, delivery=1,
                 exception_type=exc, first_failure_us=us(at), due_us=us(at) + 60_000_000,
                 payload_size=42, payload_hash=digest)


def redelivered(task_id, task, queue, at, digest):
    return Event("redelivered", us(at), task_id=task_id, task_name=task, queue=queue, delivery=2,
                 payload_size=42, payload_hash=digest)


#: The hand-built archive, in stream order (docs/analytics-reference.md works the expected results out).
#: Messages: A, B (same payload p1: poison), C (succeeds after a redelivery), D (non-retryable),
#: E (dead-lettered exactly at as_of - 7 d), F (later replayed), G (still parked), H (old),
#: I (dropped). A's first failure is before UTC midnight, its dead letter after.
HAND_BUILT = [
    dead("H", "shop.charge", "orders", "2024-02-20T12:00:00", "2024-02-20T10:00:00", 2, "ValueError", "p4"),
    dead("F", "shop.refund", "orders", "2024-03-02T00:00:00", "2024-03-01T23:50:00", 5, "TimeoutError", "p5"),
    dead("E", "shop.send_receipt", "emails", "2024-03-08T12:00:00", "2024-03-08T11:00:00", 4,
         "smtplib.SMTPException", "p3"),
    dead("D", "shop.send_receipt", "emails", "2024-03-10T06:00:00", "2024-03-10T06:00:00", 1, "KeyError", "p2",
         reason="non_retryable"),
    parked("C", "shop.charge", "orders", "2024-03-13T08:00:00", "ConnectionError", "p6"),
    redelivered("C", "shop.charge", "orders", "2024-03-13T08:01:00", "p6"),
    Event("replayed", us("2024-03-14T09:00:00"), task_id="F", task_name="shop.refund", queue="orders",
          dlq="DLQ.orders", delivery=5, payload_hash="p5"),
    Event("dropped", us("2024-03-14T18:00:00"), task_id="I", task_name="shop.send_receipt", queue="emails",
          delivery=3, reason="max_delivery_attempts", exception_type="OSError", payload_hash="p7"),
    parked("A", "shop.charge", "orders", "2024-03-14T23:50:00", "ValueError", "p1"),
    redelivered("A", "shop.charge", "orders", "2024-03-14T23:55:00", "p1"),
    dead("A", "shop.charge", "orders", "2024-03-15T00:10:00", "2024-03-14T23:50:00", 2, "ValueError", "p1"),
    dead("B", "shop.charge", "orders", "2024-03-15T09:00:00", "2024-03-15T08:59:00", 3, "ValueError", "p1"),
    parked("G", "shop.refund", "orders", "2024-03-15T11:00:00", "TimeoutError", "p8"),
]


def write_archive(path, events=HAND_BUILT) -> None:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    keys = Keys("hand")
    assert EventLog(client, keys, max_length=1000).append(events) == len(events)
    assert export_events(client, keys, str(path)).rows == len(events)


@contextmanager
def local_time_zone(name: str):
    """The process's local time zone (``TZ``) set to ``name`` for the block."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = name
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()


@pytest.fixture(scope="session")
def hand_archive(tmp_path_factory):
    path = tmp_path_factory.mktemp("hand") / "archive"
    with local_time_zone("America/New_York"):
        write_archive(path)
    return path


@pytest.fixture(scope="session")
def hand_report(spark, hand_archive, tmp_path_factory):
    from celery_dlq.analytics.options import ReportOptions
    from celery_dlq.analytics.report import run_report

    out = tmp_path_factory.mktemp("hand-report")
    with local_time_zone("America/New_York"):
        assert time.strftime("%Z", time.localtime(0)) == "EST"
        report = run_report(spark, ReportOptions(str(hand_archive), str(out), as_of=AS_OF))
    return report, out


@pytest.fixture(scope="session")
def hand_events(spark, hand_archive):
    """The hand-built archive read once (cached) on a report session, for replay-plan variants."""
    from celery_dlq.analytics import figures as M
    from celery_dlq.analytics.session import report_session

    session = report_session(spark)
    events = M.read_events(session, str(hand_archive)).cache()
    yield session, events
    events.unpersist()
