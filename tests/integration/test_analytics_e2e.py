"""End to end: a real worker dead-letters, export, report (a fresh Spark via ``python -m``), replay the plan.

``proj.fixed_by_flag`` fails while ``<prefix>:broken`` exists: 3 orders die,
plus the same order 99 twice (a poison payload), plus a non-retryable
KeyError and a flaky task that succeeds after one redelivery. The plan asks
for RuntimeError dead letters: the 3 orders, not the poison pair (excluded by
default), not the KeyError. The bug is "fixed" (the key deleted), the plan is
replayed with the operator API, and exactly those 3 run again and succeed.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pyarrow.dataset as ds
import pytest
from celery import Celery

from celery_dlq.export import export_app

pytest.importorskip("pyspark")
from celery_dlq.analytics.plan import load_plan  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def ops_app(harness) -> Celery:
    """The operator's side: same broker, key prefix and queue as the workers."""
    app = Celery("ops", broker=harness.broker, set_as_current=False)
    app.conf.update(task_default_queue=harness.queue, dlq_key_prefix=harness.prefix)
    return app


def run_report(archive, out, *args) -> dict:
    cmd = [sys.executable, "-m", "celery_dlq.analytics", "--in", str(archive), "--out", str(out),
           "--master", "local[1]", "--conf", "spark.sql.shuffle.partitions=1", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Quiet: no log4j INFO/WARN lines, no progress bars (the JVM's own "WARNING: Using incubator modules" is allowed).
    noisy = [line for line in proc.stderr.splitlines() if re.search(r"\b(INFO|WARN)\b|Stage \d+", line)]
    assert noisy == [], proc.stderr
    assert "replay plan: 3 selected (2 poison excluded)" in proc.stdout
    return json.loads((out / "report.json").read_text())


@pytest.mark.timeout(600)
def test_dead_letters_exported_reported_and_replayed_by_plan(harness, tmp_path):
    broken = f"{harness.prefix}:broken"
    harness.redis.set(broken, 1)
    worker = harness.worker(concurrency=2)
    orders = [harness.send("proj.fixed_by_flag", kwargs={"order_id": n}).id for n in (1, 2, 3)]
    poison = [harness.send("proj.fixed_by_flag", kwargs={"order_id": 99}).id for _ in range(2)]
    keyerror = harness.send("proj.not_retryable").id
    flaky = harness.send("proj.flaky", args=(1,)).id
    harness.wait_until(lambda: len(harness.dead_letters()) == 6, timeout=60, message="6 dead letters")
    harness.wait_until(lambda: len(harness.deliveries(flaky)) == 2, message="flaky's second delivery")

    app, archive, out = ops_app(harness), tmp_path / "archive", tmp_path / "report"
    exported = export_app(app, str(archive))
    # parked + redelivered: 5 x 1 (fixed_by_flag) + 1 (flaky); dead_lettered: 6
    assert exported.rows == 18 and exported.events_lost == 0
    report = run_report(archive, out, "--replay-exception", "RuntimeError")

    assert report["dead_letters"]["total"] == 6
    assert report["events"]["by_type"] == {"dead_lettered": 6, "parked": 6, "redelivered": 6}
    assert report["attempts_before_death"] == [{"attempts": 1, "dead_letters": 1}, {"attempts": 2, "dead_letters": 5}]
    rates = {r["task_name"]: (r["succeeded_after_redelivery"], r["dead_after_redelivery"], r["success_rate"])
             for r in report["redelivery"]}
    assert rates == {"proj.fixed_by_flag": (0, 5, 0.0), "proj.flaky": (1, 0, 1.0), "proj.not_retryable": (0, 0, None)}
    (top,) = report["poison_payloads"]["top"]
    assert (top["dead_letters"], top["messages"], top["exception_types"]) == (2, 2, ["RuntimeError"])
    dlq = f"DLQ.{harness.queue}"
    assert report["replay_plan"]["counts"] == {"in_dlq": 6, "matched": 5, "excluded_poison": 2, "selected": 3}
    assert report["replay_plan"]["by_dlq"] == {dlq: 3}
    assert report["time_to_dead_letter"]["count"] == 6

    plan = load_plan(str(out))
    assert sorted(plan.task_ids()) == sorted(orders) and set(plan.by_dlq()) == {dlq}

    report_time = time.time()
    harness.redis.delete(broken)  # the fix is deployed
    from celery_dlq.manage import Filter, Operator

    operator = Operator(app)
    for name, task_ids in plan.by_dlq().items():
        for task_id in task_ids:
            assert operator.queue(name).replay(Filter(task_id=task_id)).done == 1
    for task_id in orders:
        harness.wait_until(lambda t=task_id: f"[{t}] succeeded" in worker.log(), message=f"{task_id} succeeds")
        assert [d["delivery"] for d in harness.deliveries(task_id)] == [1, 2, 1]
    left = harness.dead_letters()
    assert sorted(letter["headers"]["id"] for letter in left) == sorted([*poison, keyerror])
    assert all(len(harness.deliveries(t)) == 2 for t in poison)

    export_app(app, str(archive))  # only what is new: no event twice, no new dead letter for the replayed
    events = ds.dataset(str(archive / "events"), format="parquet", partitioning="hive").to_table().to_pylist()
    assert len({e["event_id"] for e in events}) == len(events) >= 18
    assert [e for e in events if e["task_id"] in orders and e["event_type"] in ("dead_lettered", "parked")
            and e["ts"].timestamp() > report_time] == []
