"""The report over the hand-built archive (conftest.HAND_BUILT), every number worked out by hand.

Worked out in docs/analytics-reference.md ("The hand-built archive"). as_of = 2024-03-15 12:00 UTC.
"""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from celery_dlq.analytics.options import ReportOptions
from celery_dlq.analytics.plan import load_plan
from tests.analytics.conftest import AS_OF

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark")]


def test_event_and_dead_letter_counts(hand_report):
    report, _ = hand_report
    assert report["events"] == {"total": 13, "by_type": {
        "dead_lettered": 6, "dropped": 1, "parked": 3, "redelivered": 2, "replayed": 1}}
    assert report["dead_letters"]["total"] == 6
    assert report["dead_letters"]["dropped"] == 1


def test_dead_letters_per_utc_day_queue_task_and_exception(hand_report):
    report, _ = hand_report
    # A failed first at 23:50 on the 14th and was dead-lettered at 00:10 UTC on the 15th
    # (20:10 on the 14th in New York, the JVM's default zone here): it counts on the 15th.
    assert report["dead_letters"]["per_day"] == [
        {"day": "2024-02-20", "queue": "orders", "task_name": "shop.charge", "exception_type": "ValueError",
         "dead_letters": 1},
        {"day": "2024-03-02", "queue": "orders", "task_name": "shop.refund", "exception_type": "TimeoutError",
         "dead_letters": 1},
        {"day": "2024-03-08", "queue": "emails", "task_name": "shop.send_receipt",
         "exception_type": "smtplib.SMTPException", "dead_letters": 1},
        {"day": "2024-03-10", "queue": "emails", "task_name": "shop.send_receipt", "exception_type": "KeyError",
         "dead_letters": 1},
        {"day": "2024-03-15", "queue": "orders", "task_name": "shop.charge", "exception_type": "ValueError",
         "dead_letters": 2},
    ]


def test_attempts_before_death(hand_report):
    report, _ = hand_report
    assert report["attempts_before_death"] == [
        {"attempts": 1, "dead_letters": 1}, {"attempts": 2, "dead_letters": 2}, {"attempts": 3, "dead_letters": 1},
        {"attempts": 4, "dead_letters": 1}, {"attempts": 5, "dead_letters": 1}]


def test_time_to_dead_letter_exact_percentiles(hand_report):
    report, _ = hand_report
    t = report["time_to_dead_letter"]
    # seconds, sorted: D 0, B 60, F 600, A 1200, E 3600, H 7200 (n = 6)
    # p50: position 2.5 -> (600 + 1200) / 2 = 900; p90: 4.5 -> (3600 + 7200) / 2 = 5400;
    # p99: 4.95 -> 0.05 x 3600 + 0.95 x 7200 = 7020
    assert t["count"] == 6 and t["max"] == 7200.0
    assert (t["p50"], t["p90"]) == (900.0, 5400.0)
    assert t["p99"] == pytest.approx(7020.0, abs=1e-9)
    assert [h["dead_letters"] for h in t["histogram"]] == [1, 0, 0, 1, 2, 2, 0, 0]
    emails, orders = t["by_queue"]
    # emails: [0, 3600] -> 1800, 3240, 3564; orders: [60, 600, 1200, 7200] -> 900, 5400, 7020
    assert (emails["queue"], emails["count"], emails["p50"]) == ("emails", 2, 1800.0)
    assert emails["p90"] == pytest.approx(3240.0, abs=1e-9) and emails["p99"] == pytest.approx(3564.0, abs=1e-9)
    assert (orders["queue"], orders["count"], orders["p50"]) == ("orders", 4, 900.0)
    assert orders["p90"] == pytest.approx(5400.0, abs=1e-9) and orders["p99"] == pytest.approx(7020.0, abs=1e-9)


def test_redelivery_success_rate_per_task(hand_report):
    report, _ = hand_report
    assert report["redelivery"] == [
        # A: redelivered then dead; B, H: dead without redelivery; C: redelivered, nothing after -> succeeded
        {"task_name": "shop.charge", "redelivered": 2, "succeeded_after_redelivery": 1, "dead_after_redelivery": 1,
         "pending": 0, "dead": 3, "success_rate": 0.5},
        # F: dead (its replay is not part of it); G: still parked
        {"task_name": "shop.refund", "redelivered": 0, "succeeded_after_redelivery": 0, "dead_after_redelivery": 0,
         "pending": 1, "dead": 1, "success_rate": None},
        # D, E dead-lettered, I dropped
        {"task_name": "shop.send_receipt", "redelivered": 0, "succeeded_after_redelivery": 0,
         "dead_after_redelivery": 0, "pending": 0, "dead": 3, "success_rate": None},
    ]


def test_one_recurring_poison_payload(hand_report):
    report, _ = hand_report
    assert report["poison_payloads"] == {"min_dead_letters": 2, "count": 1, "top": [{
        "payload_hash": "p1", "dead_letters": 2, "messages": 2, "task_name": "shop.charge",
        "exception_types": ["ValueError"], "first_seen": "2024-03-15T00:10:00.000000Z",
        "last_seen": "2024-03-15T09:00:00.000000Z"}]}


def test_trend_last_7_days_against_the_previous_7(hand_report):
    report, _ = hand_report
    trend = report["trend"]
    # last [03-08 12:00, 03-15 12:00): E (exactly at the start), D, A, B; previous: F
    assert trend["last_7d"] == {"start": "2024-03-08T12:00:00.000000Z", "end": "2024-03-15T12:00:00.000000Z",
                                "dead_letters": 4}
    assert trend["previous_7d"]["dead_letters"] == 1
    assert trend["change"] == 3.0
    assert trend["by_queue"] == [{"queue": "emails", "last_7d": 2, "previous_7d": 0},
                                 {"queue": "orders", "last_7d": 2, "previous_7d": 1}]


def test_default_replay_plan_excludes_poison_and_replayed(hand_report):
    report, out = hand_report
    manifest = report["replay_plan"]
    # in the DLQ: A, B, D, E, H (F was replayed); A and B share poison payload p1
    assert manifest["counts"] == {"in_dlq": 5, "matched": 5, "excluded_poison": 2, "selected": 3}
    assert manifest["by_dlq"] == {"DLQ.emails": 2, "DLQ.orders": 1}
    assert manifest["predicates"] == {"exception_types": [], "task_names": [], "max_age_seconds": None,
                                      "exclude_poison": True, "poison_min_dead_letters": 2}
    plan = load_plan(str(out))
    assert [(e.task_id, e.dlq, e.queue, e.exception_type) for e in plan.entries] == [
        ("H", "DLQ.orders", "orders", "ValueError"),
        ("E", "DLQ.emails", "emails", "smtplib.SMTPException"),
        ("D", "DLQ.emails", "emails", "KeyError")]
    assert plan.entries[0].dead_lettered_at == AS_OF.timestamp() - 24 * 86400
    assert plan.by_dlq() == {"DLQ.orders": ["H"], "DLQ.emails": ["E", "D"]}
    assert json.loads((out / "replay_plan" / "manifest.json").read_text()) == manifest


def test_documents_and_tables_are_written(hand_report):
    report, out = hand_report
    assert json.loads((out / "report.json").read_text())["dead_letters"]["total"] == 6
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 6 and "p1" in html and "<script" not in html
    per_day = pq.read_table(out / "tables" / "dead_letters_per_day")
    assert per_day.num_rows == 5 and per_day.column("dead_letters").to_pylist() == [1, 1, 1, 1, 2]
    latency = pq.read_table(out / "tables" / "time_to_dead_letter")
    assert sorted(latency.column("seconds").to_pylist()) == [0.0, 60.0, 600.0, 1200.0, 3600.0, 7200.0]
    for name in ("attempts_before_death", "redelivery_by_task", "poison_payloads", "trend_by_queue",
                 "time_to_dead_letter_by_queue"):
        assert pq.read_table(out / "tables" / name).num_rows > 0, name


#: Every check of the hand-built report above: test_standalone.py runs them on the report a cluster computed.
HAND_REPORT_CHECKS = (test_event_and_dead_letter_counts, test_dead_letters_per_utc_day_queue_task_and_exception,
                      test_attempts_before_death, test_time_to_dead_letter_exact_percentiles,
                      test_redelivery_success_rate_per_task, test_one_recurring_poison_payload,
                      test_trend_last_7_days_against_the_previous_7, test_default_replay_plan_excludes_poison_and_replayed,
                      test_documents_and_tables_are_written)


def _plan(hand_events, out, **predicates):
    from celery_dlq.analytics import figures as M
    from celery_dlq.analytics.report import Report

    session, events = hand_events
    report = Report(session, ReportOptions("hand", str(out), as_of=AS_OF, **predicates))
    manifest = report.replay_plan(events, M.payload_hashes(M.dead_letters(events)))
    return manifest, [e.task_id for e in load_plan(str(out)).entries]


def test_plan_predicates_and_poison(hand_events, tmp_path):
    # ValueError within 7 days: A and B, both poison
    manifest, ids = _plan(hand_events, tmp_path / "a", replay_exceptions=("ValueError",), replay_max_age="7d")
    assert manifest["counts"] == {"in_dlq": 5, "matched": 2, "excluded_poison": 2, "selected": 0} and ids == []
    assert manifest["by_dlq"] == {}
    manifest, ids = _plan(hand_events, tmp_path / "b", replay_exceptions=("ValueError",), replay_max_age="7d",
                          include_poison=True)
    assert manifest["counts"] == {"in_dlq": 5, "matched": 2, "excluded_poison": 0, "selected": 2}
    assert ids == ["A", "B"] and manifest["by_dlq"] == {"DLQ.orders": 2}
    # an exception's last dotted part matches; task wildcards as in Artemis
    manifest, ids = _plan(hand_events, tmp_path / "c", replay_exceptions=("KeyError", "SMTPException"),
                          replay_tasks=("shop.#",))
    assert manifest["counts"]["selected"] == 2 and ids == ["E", "D"]
    manifest, ids = _plan(hand_events, tmp_path / "d", replay_tasks=("shop.refund",))
    assert manifest["counts"] == {"in_dlq": 5, "matched": 0, "excluded_poison": 0, "selected": 0} and ids == []


def test_report_of_an_archive_with_nothing_exported_yet(spark, tmp_path):
    from celery_dlq.analytics.report import run_report

    report = run_report(spark, ReportOptions(str(tmp_path / "nothing"), str(tmp_path / "out"), as_of=AS_OF))
    assert report["events"] == {"total": 0, "by_type": {}}
    assert report["dead_letters"]["per_day"] == [] and report["poison_payloads"]["count"] == 0
    assert report["time_to_dead_letter"]["count"] == 0 and report["time_to_dead_letter"]["p50"] is None
    assert report["trend"]["change"] is None
    assert report["replay_plan"]["counts"] == {"in_dlq": 0, "matched": 0, "excluded_poison": 0, "selected": 0}
    assert load_plan(str(tmp_path / "out")).entries == ()
    assert (tmp_path / "out" / "report.html").read_text().count("data:image/png;base64,") == 6


def test_an_archive_holding_some_events_twice_is_reported_once(spark, hand_archive, tmp_path):
    """Copies of exported files (an export written twice) change nothing: the archive is deduplicated on event_id."""
    import shutil

    from celery_dlq.analytics.report import run_report

    archive = tmp_path / "archive"
    shutil.copytree(hand_archive, archive)
    files = sorted((archive / "events").rglob("*.parquet"))
    for path in files[::2]:
        shutil.copy(path, path.with_name("copy-" + path.name))
    assert len(list((archive / "events").rglob("*.parquet"))) > len(files)
    report = run_report(spark, ReportOptions(str(archive), str(tmp_path / "out"), as_of=AS_OF))
    assert report["events"]["total"] == 13 and report["dead_letters"]["total"] == 6
    assert [(r["task_name"], r["redelivered"], r["succeeded_after_redelivery"]) for r in report["redelivery"]] == [
        ("shop.charge", 2, 1), ("shop.refund", 0, 0), ("shop.send_receipt", 0, 0)]
    assert report["replay_plan"]["counts"] == {"in_dlq": 5, "matched": 5, "excluded_poison": 2, "selected": 3}
    assert report["time_to_dead_letter"]["count"] == 6 and report["poison_payloads"]["count"] == 1
