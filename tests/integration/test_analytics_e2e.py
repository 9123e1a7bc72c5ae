"""End to end through the operator's real command line: a worker dead-letters, then
``celery -A tests.integration.ops_app dlq export``, ``dlq report`` (a fresh Spark) and ``dlq replay --plan``.

``proj.fixed_by_flag`` fails while ``<prefix>:broken`` exists: 3 orders die,
plus the same order 99 twice (a poison payload), plus a non-retryable
KeyError and a flaky task that succeeds after one redelivery. The plan asks
for RuntimeError dead letters: the 3 orders, not the poison pair (excluded by
default), not the KeyError. A dry run of the plan moves nothing; the bug is
"fixed" (the key deleted), the plan is replayed, and exactly those 3 run
again and succeed; replaying the same plan again finds them gone (exit 1).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pyarrow.dataset as ds
import pytest

from tests.integration.conftest import ROOT
from tests.services import SPARK_EXTRA

pytest.importorskip("pyspark", reason=SPARK_EXTRA)
from celery_dlq.analytics.plan import load_plan  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def dlq(harness, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``celery -A tests.integration.ops_app dlq ARGS``: the workers' broker, queue and prefix, no tasks."""
    cmd = [sys.executable, "-m", "celery", "-A", "tests.integration.ops_app", "dlq", *args]
    return subprocess.run(cmd, cwd=ROOT, env=harness.env(), capture_output=True, text=True, timeout=timeout)


def export(harness, archive) -> dict:
    proc = dlq(harness, "export", "--out", str(archive), "--json")
    assert proc.returncode == 0, f"exit status {proc.returncode}\n{proc.stdout}{proc.stderr}"
    return json.loads(proc.stdout)


def run_report(harness, archive, out, *args) -> dict:
    proc = dlq(harness, "report", "--in", str(archive), "--out", str(out), "--master", "local[1]",
               "--conf", "spark.sql.shuffle.partitions=1", *args, timeout=420)
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

    archive, out = tmp_path / "archive", tmp_path / "report"
    exported = export(harness, archive)
    # parked + redelivered: 5 x 1 (fixed_by_flag) + 1 (flaky); dead_lettered: 6
    assert exported["rows"] == 18 and exported["events_lost"] == 0
    report = run_report(harness, archive, out, "--replay-exception", "RuntimeError")

    assert report["dead_letters"]["total"] == 6
    assert report["events"]["by_type"] == {"dead_lettered": 6, "parked": 6, "redelivered": 6}
    assert report["attempts_before_death"] == [{"attempts": 1, "dead_letters": 1}, {"attempts": 2, "dead_letters": 5}]
    rates = {r["task_name"]: (r["succeeded_after_redelivery"], r["dead_after_redelivery"], r["success_rate"])
             for r in report["redelivery"]}
    assert rates == {"proj.fixed_by_flag": (0, 5, 0.0), "proj.flaky": (1, 0, 1.0), "proj.not_retryable": (0, 0, None)}
    (top,) = report["poison_payloads"]["top"]
    assert (top["dead_letters"], top["messages"], top["exception_types"]) == (2, 2, ["RuntimeError"])
    dlq_name = f"DLQ.{harness.queue}"
    assert report["replay_plan"]["counts"] == {"in_dlq": 6, "matched": 5, "excluded_poison": 2, "selected": 3}
    assert report["replay_plan"]["by_dlq"] == {dlq_name: 3}
    assert report["time_to_dead_letter"]["count"] == 6

    plan = load_plan(str(out))
    assert sorted(plan.task_ids()) == sorted(orders) and set(plan.by_dlq()) == {dlq_name}

    held = harness.redis.lrange(dlq_name, 0, -1)
    dry = dlq(harness, "replay", "--plan", str(out), "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"Would replay 3 of 3 matching dead letters from {dlq_name}: 3 to {harness.queue} " \
           "(dry run: nothing moved)." in dry.stdout.splitlines()
    assert harness.redis.lrange(dlq_name, 0, -1) == held              # byte for byte: nothing moved

    report_time = time.time()
    harness.redis.delete(broken)  # the fix is deployed
    done = dlq(harness, "replay", "--plan", str(out / "replay_plan"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Replayed 3 of 3 matching dead letters from {dlq_name}: 3 to {harness.queue}." in done.stdout.splitlines()
    for task_id in orders:
        harness.wait_until(lambda t=task_id: f"[{t}] succeeded" in worker.log(), message=f"{task_id} succeeds")
        assert [d["delivery"] for d in harness.deliveries(task_id)] == [1, 2, 1]
    left = harness.dead_letters()
    assert sorted(letter["headers"]["id"] for letter in left) == sorted([*poison, keyerror])
    assert all(len(harness.deliveries(t)) == 2 for t in poison)

    again = dlq(harness, "replay", "--plan", str(out))                  # the plan is spent: partial failure
    assert again.returncode == 1, again.stdout + again.stderr
    assert f"3 of 3 planned dead letters no longer in {dlq_name}" in again.stdout
    assert again.stderr.strip().splitlines()[-1] == "Error: 3 of 3 planned dead letters were not replayed"
    assert sorted(letter["headers"]["id"] for letter in harness.dead_letters()) == sorted([*poison, keyerror])

    export(harness, archive)  # only what is new: no event twice, no new dead letter for the replayed
    events = ds.dataset(str(archive / "events"), format="parquet", partitioning="hive").to_table().to_pylist()
    assert len({e["event_id"] for e in events}) == len(events) >= 18
    assert [e for e in events if e["task_id"] in orders and e["event_type"] in ("dead_lettered", "parked")
            and e["ts"].timestamp() > report_time] == []
