"""The Grafana dashboard's queries against the real stack: a prefork worker's failures, operator commands, the
real exporter and a real Prometheus scraping it. Every panel's query returns data.
(The dashboard's structure and PromQL syntax: tests/unit/test_grafana_dashboard.py.)
"""
from __future__ import annotations

import json
import time

import pytest

from celery_dlq.storage.keys import Keys, Stat
from celery_dlq.storage.totals import Metric, field
from tests.integration.test_exporter import RULES, ExporterProcess, Prometheus, dlq_cli, needs, ops_env, wait_for
from tests.unit.test_grafana_dashboard import filled, targets

pytestmark = pytest.mark.integration


#: Markers in :func:`panels` for values the test does not fix exactly.
RATE, AGE, DURATION = object(), object(), object()
COUNTERS = ("dead_lettered_total", "parked_total", "redelivered_total", "dropped_total", "replayed_total",
            "purged_total", "trimmed_total", "snoozed_total", "breaker_held_total")


def panels(q: str, instance: str) -> dict[str, dict[tuple, object]]:
    """Every panel's query (filled in) and its series, labels to value, from what the test set up."""
    dlq = f"DLQ.{q}"
    return {
        'sum(celery_dlq_dead_letters{dlq=~".*"})': {(): 1},    # 4 dead-lettered, 1 trimmed, 1 purged, 1 replayed
        'sum(celery_dlq_parked{queue=~".*"})': {(): 1},        # proj.park_long
        "sum(celery_dlq_overdue_parked)": {(): 0},
        "min(celery_dlq_redis_up)": {(): 1},
        'sum by (dlq, queue) (celery_dlq_dead_letters{dlq=~".*"})': {(("dlq", dlq), ("queue", q)): 1},
        'max by (dlq) (celery_dlq_oldest_dead_letter_age_seconds{dlq=~".*"})': {(("dlq", dlq),): AGE},
        'sum by (task, reason) (rate(celery_dlq_dead_lettered_total{queue=~".*"}[1m])) * 60': {
            (("reason", "max_delivery_attempts"), ("task", "proj.always_fails")): RATE},
        'sum by (queue) (rate(celery_dlq_parked_total{queue=~".*"}[1m])) * 60': {(("queue", q),): RATE},
        'sum by (queue) (rate(celery_dlq_redelivered_total{queue=~".*"}[1m])) * 60': {(("queue", q),): RATE},
        'sum by (queue) (celery_dlq_parked{queue=~".*"})': {(("queue", q),): 1},
        "sum by (queue) (celery_dlq_overdue_parked)": {(("queue", q),): 0},
        'sum by (queue, task) (increase(celery_dlq_dropped_total{queue=~".*"}[1m]))': {
            (("queue", q), ("task", "proj.not_retryable")): RATE},
        'sum by (dlq) (rate(celery_dlq_replayed_total{dlq=~".*"}[1m])) * 60': {(("dlq", dlq),): RATE},
        'sum by (dlq) (rate(celery_dlq_purged_total{dlq=~".*"}[1m])) * 60': {(("dlq", dlq),): RATE},
        'sum by (dlq) (rate(celery_dlq_trimmed_total{dlq=~".*"}[1m])) * 60': {(("dlq", dlq),): RATE},
        "max by (instance) (celery_dlq_scrape_duration_seconds)": {(("instance", instance),): DURATION},
        'max by (queue, task, group, state) (celery_dlq_breaker_state{queue=~".*", state!="closed"})': {
            (("group", "*:proj.noop"), ("queue", q), ("state", "half_open"), ("task", "proj.noop")): 0,
            (("group", "*:proj.noop"), ("queue", q), ("state", "open"), ("task", "proj.noop")): 1},   # paused
        'sum by (queue, task) (rate(celery_dlq_snoozed_total{queue=~".*"}[1m]))': {
            (("queue", q), ("task", "proj.snoozes")): RATE},
        'sum by (queue, task) (rate(celery_dlq_breaker_held_total{queue=~".*"}[1m]))': {
            (("queue", q), ("task", "proj.noop")): RATE},
    }


def counters(q: str) -> dict[str, dict[str | None, float]]:
    """The counters behind the rate panels, by task (or DLQ): what the test's tasks and commands did."""
    dlq = f"DLQ.{q}"
    return {
        "dead_lettered_total": {"proj.always_fails": 4},   # each of the four after its third delivery
        "parked_total": {"proj.always_fails": 8, "proj.park_long": 1},
        "redelivered_total": {"proj.always_fails": 8, "proj.snoozes": 1},
        "dropped_total": {"proj.not_retryable": 1},
        "replayed_total": {dlq: 1}, "purged_total": {dlq: 1}, "trimmed_total": {dlq: 1},
        "snoozed_total": {"proj.snoozes": 1}, "breaker_held_total": {"proj.noop": 1},
    }


def test_every_panel_shows_data_from_a_real_worker_exporter_and_prometheus(harness, tmp_path):
    needs("prometheus")
    began = time.time()
    q = harness.queue
    harness.extra_env["DLQ_TEST_CONF"] = json.dumps({
        "dlq_task_policies": {"proj.not_retryable": {"dead_letter": False},    # dropped_total
                              "proj.noop": {"breaker": "manual"}},             # a paused breaker, held_total
        "dlq_queue_policies": {q: {"dead_letter_max_length": 3}},              # trimmed_total
        "dlq_breaker_refresh": 0.2,
    })
    harness.worker()
    env = ops_env(harness.broker, q, harness.prefix)
    paused = dlq_cli(env, "pause", "proj.noop", "-Q", q, "--force")
    assert paused.returncode == 0, paused.stdout + paused.stderr
    harness.send("proj.noop", args=(1,))       # held by the paused breaker (kept in Redis by the fetch)
    snoozed = harness.send("proj.snoozes", kwargs={"times": 1})               # snoozed_total
    failing = [harness.send("proj.always_fails", args=(i,)) for i in range(4)]
    harness.send("proj.park_long")
    harness.send("proj.not_retryable")
    stats, metrics = Keys(harness.prefix).stats, Keys(harness.prefix).metrics
    harness.wait_until(lambda: len(harness.dead_letters()) == 3 and harness.redis.hget(stats, Stat.TRIMMED) == b"1"
                       and harness.redis.hget(stats, Stat.DROPPED) == b"1"
                       and harness.redis.zcard(Keys(harness.prefix).delayed) == 1
                       and harness.redis.hget(Keys(harness.prefix).breaker_kept_total, f"{q}\x1fproj.noop") == b"1"
                       and harness.redis.hget(metrics, field(Metric.SNOOZED, queue=q, task="proj.snoozes"))
                       and len(harness.deliveries(snoozed.id)) == 2,
                       timeout=90, message="3 dead letters (1 trimmed), 1 dropped, 1 parked, 1 held, 1 snoozed")
    left = [letter["headers"]["id"] for letter in harness.dead_letters()]
    assert set(left) < {r.id for r in failing}
    for args in (["purge", q, left[0], "--force"], ["replay", q, left[1], "--to", f"{q}.hold"]):
        done = dlq_cli(env, *args)
        assert done.returncode == 0, done.stdout + done.stderr

    exporter = ExporterProcess(env, tmp_path / "exporter.log").start()
    prometheus = None
    try:
        prometheus = Prometheus(tmp_path, f"127.0.0.1:{exporter.port}", RULES)
        shown = {}
        for title, expr in targets():   # variables as the dashboard's defaults ("All") fill them in
            expr = filled(expr)
            result = wait_for(lambda e=expr: prometheus.query(e), 60, f"{title!r}: {expr}", prometheus.log_path)
            shown[expr] = {tuple(sorted(series["metric"].items())): float(series["value"][1]) for series in result}
        expected = panels(q, f"127.0.0.1:{exporter.port}")
        assert shown.keys() == expected.keys()
        for expr, series in expected.items():
            assert shown[expr].keys() == series.keys(), expr
            for labels, value in series.items():
                got = shown[expr][labels]
                if value is RATE:      # what the counters below did in the last minute: not the test's to fix
                    assert got >= 0, (expr, labels)
                elif value is AGE:     # the one dead letter left, dead-lettered since the test began
                    assert 0 < got < time.time() - began, (expr, labels)
                elif value is DURATION:
                    assert 0 < got < 5, (expr, labels)
                else:
                    assert got == value, (expr, labels, got)
        # The counters behind the rate panels, exactly as the test made them (a worker flushes its counts a
        # moment after the fact: waited for, then compared).
        def counted() -> dict:
            return {name: {series["metric"].get("task") or series["metric"].get("dlq"): float(series["value"][1])
                           for series in prometheus.query(f"celery_dlq_{name}")} for name in COUNTERS}
        deadline = time.monotonic() + 30
        while counted() != counters(q) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert counted() == counters(q)
    finally:
        if prometheus is not None:
            prometheus.stop()
        exporter.stop()
