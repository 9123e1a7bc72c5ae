"""The Grafana dashboard's queries against the real stack: a prefork worker's failures, operator commands, the
real exporter and a real Prometheus scraping it. Every panel's query returns data.
(The dashboard's structure and PromQL syntax: tests/unit/test_grafana_dashboard.py.)
"""
from __future__ import annotations

import json

import pytest

from celery_dlq.storage.keys import Keys, Stat
from celery_dlq.storage.totals import Metric, field
from tests.integration.test_exporter import RULES, ExporterProcess, Prometheus, dlq_cli, needs, ops_env, wait_for
from tests.unit.test_grafana_dashboard import filled, targets

pytestmark = pytest.mark.integration


def test_every_panel_shows_data_from_a_real_worker_exporter_and_prometheus(harness, tmp_path):
    needs("prometheus")
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
    harness.send("proj.snoozes", kwargs={"times": 1})                         # snoozed_total
    failing = [harness.send("proj.always_fails", args=(i,)) for i in range(4)]
    harness.send("proj.park_long")
    harness.send("proj.not_retryable")
    stats, metrics = Keys(harness.prefix).stats, Keys(harness.prefix).metrics
    harness.wait_until(lambda: len(harness.dead_letters()) == 3 and harness.redis.hget(stats, Stat.TRIMMED) == b"1"
                       and harness.redis.hget(stats, Stat.DROPPED) == b"1"
                       and harness.redis.zcard(Keys(harness.prefix).schedule) == 1
                       and harness.redis.hget(Keys(harness.prefix).breaker_kept_total, f"{q}\x1fproj.noop") == b"1"
                       and harness.redis.hget(metrics, field(Metric.SNOOZED, queue=q, task="proj.snoozes")),
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
        for title, expr in targets():   # variables as the dashboard's defaults ("All") fill them in
            expr = filled(expr)
            result = wait_for(lambda: prometheus.query(expr), 60, f"{title!r}: {expr}", prometheus.log_path)
            assert all(float(series["value"][1]) >= 0 for series in result)
        by_dlq = {s["metric"]["dlq"]: s["value"][1] for s in prometheus.query("sum by (dlq) (celery_dlq_dead_letters)")}
        assert by_dlq == {f"DLQ.{q}": "1"}
    finally:
        if prometheus is not None:
            prometheus.stop()
        exporter.stop()
