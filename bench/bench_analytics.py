"""Analytics benchmark: export throughput, Spark report wall time (local[2]), and pandas on the same data.

1. Generates N synthetic archive events (default 1,000,000; seeded) as the
   engine would: message lifecycles of parked / redelivered events ending in
   success, a dead letter (about 1 kB record each), a drop, or still pending;
   some dead letters replayed; a pool of recurring poison payloads. They go
   into the events stream of a throwaway redis-server on a free port.
2. Times ``export_events`` (stream -> partitioned Parquet): events/s.
3. Times the Spark report (``run_report``) on ``local[2]``: JVM start, a cold
   run and a warm one in the same session, each writing everything (JSON,
   HTML, tables, plan); wall time and CPU time (the JVM's and Python's:
   less disturbed than wall time by other load on the machine).
4. Times the same aggregations in pandas (read the same Parquet, compute,
   write the plan) and checks both agree on the headline numbers; left out
   when the machine has not the memory free (2 GB per million events).

Steps 2-4 run ``--runs`` times (3), each with a fresh archive exported from
the same stream and a fresh JVM; the medians are printed with every run.

Run: ``.venv/bin/python bench/bench_analytics.py [--records N] [--runs N] [--no-pandas] [--json OUT]``
(needs the spark extra and pandas: ``pip install -e '.[spark]' 'pandas<3'``).
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import psutil  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.dataset as ds  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import redis  # noqa: E402

from bench import results as results_file  # noqa: E402
from celery_dlq.analytics.export import export_events  # noqa: E402
from celery_dlq.storage.archive import Event, EventLog  # noqa: E402
from celery_dlq.storage.keys import Keys  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402

AS_OF = datetime(2024, 6, 1, tzinfo=timezone.utc)
AS_OF_US = int(AS_OF.timestamp()) * 1_000_000
DAY_US = 86_400_000_000
QUEUES = [f"queue-{i:02d}" for i in range(20)]
TASKS = [(f"app.tasks.task_{i:02d}", QUEUES[i % len(QUEUES)]) for i in range(50)]
EXCEPTIONS = ["ValueError", "KeyError", "TimeoutError", "ConnectionError", "requests.exceptions.HTTPError",
              "psycopg2.OperationalError", "smtplib.SMTPException", "json.JSONDecodeError", "OSError",
              "billiard.exceptions.WorkerLostError", "celery.exceptions.TimeLimitExceeded", "RuntimeError"]


# -- synthetic archive ---------------------------------------------------------------

def message_events(rng: random.Random, n: int, poison: list[str]) -> list[Event]:
    """The events of one failing message, in order."""
    task, queue = TASKS[min(int(rng.paretovariate(1.2)) - 1, len(TASKS) - 1)]
    exc = EXCEPTIONS[min(int(rng.expovariate(0.5)), len(EXCEPTIONS) - 1)]
    t = AS_OF_US - rng.randrange(28 * DAY_US)
    first, failures = t, rng.choice((1, 1, 2, 2, 3, 4, 5))
    fate = rng.random()
    dead = fate < 0.35
    digest = rng.choice(poison) if dead and rng.random() < 0.1 else f"{rng.getrandbits(128):032x}"
    common = dict(task_id=f"m{n:08d}", task_name=task, queue=queue, payload_size=180, payload_hash=digest)
    out: list[Event] = []
    retried = failures - 1 if dead else failures
    for delivery in range(1, retried + 1):
        out.append(Event("parked", t, delivery=delivery, exception_type=exc, exception_message=f"{exc} #{n}",
                         first_failure_us=first, due_us=t + 2_000_000, **common))
        if fate > 0.97 and delivery == retried:
            return out  # still waiting for its next delivery
        t += rng.randrange(1_000_000, 600_000_000)
        out.append(Event("redelivered", t, delivery=delivery + 1, first_failure_us=first, **common))
        t += rng.randrange(100_000, 5_000_000)
    if dead:
        record = json.dumps({"body": base64.b64encode(rng.randbytes(240)).decode(), "headers": {
            "task": task, "id": common["task_id"], "x-dlq-exception-type": exc,
            "x-dlq-traceback": f"Traceback (most recent call last):\n  File \"app/tasks.py\", line {n % 400}\n{exc}"}})
        out.append(Event("dead_lettered", t, dlq=f"DLQ.{queue}", delivery=failures,
                         reason="non_retryable" if failures == 1 else "max_delivery_attempts", exception_type=exc,
                         exception_message=f"{exc} #{n}", first_failure_us=first, worker="w1@host",
                         record=record, **common))
        if rng.random() < 0.05:
            out.append(Event("replayed", t + rng.randrange(DAY_US), dlq=f"DLQ.{queue}", delivery=failures, **common))
    return out


def load_stream(client: redis.Redis, keys: Keys, records: int, seed: int = 7) -> int:
    rng = random.Random(seed)
    poison = [f"{rng.getrandbits(128):032x}" for _ in range(200)]
    log = EventLog(client, keys, max_length=records * 2)
    batch: list[Event] = []
    total = n = 0
    while total < records:
        events = message_events(rng, n, poison)[: records - total]
        n += 1
        batch += events
        total += len(events)
        if len(batch) >= 5000:
            assert log.append(batch) == len(batch)
            batch = []
    if batch:
        assert log.append(batch) == len(batch)
    return total


# -- pandas: the same numbers ------------------------------------------------------------

def pandas_report(archive: str, out: Path) -> dict:
    cols = ["event_id", "event_type", "ts", "task_id", "task_name", "dlq", "delivery", "exception_type",
            "first_failure_at", "payload_hash", "queue"]
    df = ds.dataset(f"{archive}/events", format="parquet", partitioning="hive").to_table(columns=cols).to_pandas()
    df = df.drop_duplicates("event_id")
    parts = df["event_id"].str.split("-", n=1, expand=True)
    df["_ms"], df["_seq"] = parts[0].astype("int64"), parts[1].astype("int64")
    dead = df[df.event_type == "dead_lettered"]
    per_day = dead.groupby([dead.ts.dt.floor("D"), "queue", "task_name", "exception_type"], dropna=False).size()
    attempts = dead.groupby("delivery").size()
    lat = dead[dead.first_failure_at.notna()]
    seconds = (lat.ts - lat.first_failure_at).dt.total_seconds()
    p50, p90, p99 = np.percentile(seconds.to_numpy(), [50, 90, 99])  # numpy "linear" = Spark percentile()
    by_queue = seconds.groupby(lat.queue).quantile([0.5, 0.9, 0.99])
    histogram = pd.cut(seconds, [-np.inf, 1, 10, 60, 600, 3600, 21600, 86400, np.inf], right=False).value_counts()
    life = df[df.event_type.isin(["parked", "redelivered", "dead_lettered", "dropped"]) & df.task_id.notna()]
    life = life.sort_values(["_ms", "_seq"])
    per_msg = life.groupby("task_id").agg(last_type=("event_type", "last"), task_name=("task_name", "last"),
                                          redeliveries=("event_type", lambda s: int((s == "redelivered").sum())))
    redelivered = per_msg.redeliveries > 0
    per_msg["succeeded"] = redelivered & (per_msg.last_type == "redelivered")
    per_msg["dead_after"] = redelivered & per_msg.last_type.isin(["dead_lettered", "dropped"])
    per_task = per_msg.groupby("task_name")[["succeeded", "dead_after"]].sum()
    per_task["rate"] = per_task.succeeded / (per_task.succeeded + per_task.dead_after)
    hashes = dead.groupby("payload_hash").agg(dead_letters=("task_id", "size"), messages=("task_id", "nunique"),
                                              first_seen=("ts", "min"), last_seen=("ts", "max"))
    poison = hashes[hashes.dead_letters >= 2]
    top = poison.sort_values(["dead_letters", "messages"], ascending=False).head(10)
    t = (dead.ts - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(microseconds=1)
    last7 = (t >= AS_OF_US - 7 * DAY_US) & (t < AS_OF_US)
    prev7 = (t >= AS_OF_US - 14 * DAY_US) & (t < AS_OF_US - 7 * DAY_US)
    trend = pd.DataFrame({"queue": dead.queue, "last": last7, "prev": prev7}).groupby("queue").sum()
    moves = df[df.event_type.isin(["dead_lettered", "replayed", "trimmed", "purged"]) & df.task_id.notna()]
    latest = moves.sort_values(["_ms", "_seq"]).groupby("task_id").tail(1)
    candidates = latest[latest.event_type == "dead_lettered"]
    plan = candidates[~candidates.payload_hash.isin(poison.index)].sort_values(["ts", "task_id"])
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pandas(plan[["task_id", "task_name", "queue", "dlq", "exception_type", "ts"]],
                                        preserve_index=False), out / "plan.parquet")
    return {"events": len(df), "dead_letters": len(dead), "per_day_rows": len(per_day),
            "attempts": {int(k): int(v) for k, v in attempts.items()}, "p50": p50, "p90": p90, "p99": p99,
            "succeeded_after_redelivery": int(per_task.succeeded.sum()), "poison": len(poison),
            "top_poison": len(top), "last_7d": int(trend["last"].sum()), "previous_7d": int(trend["prev"].sum()),
            "in_dlq": len(candidates), "selected": len(plan), "_by_queue": len(by_queue), "_hist": len(histogram)}


def spark_numbers(report: dict) -> dict:
    return {"events": report["events"]["total"], "dead_letters": report["dead_letters"]["total"],
            "per_day_rows": len(report["dead_letters"]["per_day"]),
            "attempts": {r["attempts"]: r["dead_letters"] for r in report["attempts_before_death"]},
            "p50": report["time_to_dead_letter"]["p50"], "p90": report["time_to_dead_letter"]["p90"],
            "p99": report["time_to_dead_letter"]["p99"],
            "succeeded_after_redelivery": sum(r["succeeded_after_redelivery"] for r in report["redelivery"]),
            "poison": report["poison_payloads"]["count"], "top_poison": len(report["poison_payloads"]["top"]),
            "last_7d": report["trend"]["last_7d"]["dead_letters"],
            "previous_7d": report["trend"]["previous_7d"]["dead_letters"],
            "in_dlq": report["replay_plan"]["counts"]["in_dlq"], "selected": report["replay_plan"]["counts"]["selected"]}


def agree(spark: dict, pandas: dict) -> list[str]:
    diffs = []
    for key, value in spark.items():
        other = pandas[key]
        same = abs(value - other) <= 1e-6 * max(1.0, abs(value)) if isinstance(value, float) else value == other
        if not same:
            diffs.append(f"{key}: spark {value!r} pandas {other!r}")
    return diffs


def du(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and its children so far: the JVM is a child."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            continue
    return total


def median(values: list[float]) -> float:
    return round(statistics.median(values), 1)


def spark_run(archive: str, out: str) -> dict:
    """In a fresh process (``--spark-run``): start Spark, report cold then warm in the same session, stop."""
    from celery_dlq.analytics.options import ReportOptions
    from celery_dlq.analytics.report import run_report
    from celery_dlq.analytics.session import build_session

    run: dict = {}
    t, cpu = time.perf_counter(), cpu_seconds()
    spark = build_session("local[2]")
    run["spark_session_start_s"] = round(time.perf_counter() - t, 1)
    run["spark_session_start_cpu_s"] = round(cpu_seconds() - cpu, 1)
    options = ReportOptions(archive, out, as_of=AS_OF)
    for kind in ("cold", "warm"):
        run[f"load_average_before_{kind}"] = round(os.getloadavg()[0], 2)
        t, cpu = time.perf_counter(), cpu_seconds()
        report = run_report(spark, options)
        run[f"spark_report_{kind}_s"] = round(time.perf_counter() - t, 1)
        run[f"spark_report_{kind}_cpu_s"] = round(cpu_seconds() - cpu, 1)
    spark.stop()
    run["spark_start_plus_cold_s"] = round(run["spark_session_start_s"] + run["spark_report_cold_s"], 1)
    return {**run, "numbers": spark_numbers(report)}


def one_run(client: redis.Redis, keys: Keys, records: int, work: str, n: int, pandas: bool) -> tuple[dict, dict]:
    """Export into a fresh archive; Spark in a fresh process (a new JVM: cold is cold); pandas on the same archive."""
    archive, out = f"{work}/archive-{n}", f"{work}/report-{n}"
    run: dict = {"load_average_at_start": round(os.getloadavg()[0], 2)}
    result = export_events(client, keys, archive)
    assert result.rows == records and result.events_lost == 0
    run.update(export_s=round(result.seconds, 2), export_events_per_s=round(result.rows / result.seconds),
               export_files=len(result.files), archive_mb=round(du(archive) / 2**20, 1))
    child = subprocess.run([sys.executable, __file__, "--spark-run", archive, out], capture_output=True, text=True)
    if child.returncode != 0:
        sys.exit(f"the Spark run failed:\n{child.stdout}\n{child.stderr[-4000:]}")
    spark = json.loads(child.stdout.strip().splitlines()[-1])
    numbers = {"spark": spark.pop("numbers"), "pandas": {}}
    numbers["spark"]["attempts"] = {int(k): v for k, v in numbers["spark"]["attempts"].items()}  # JSON made them text
    run.update(spark)
    if pandas:
        t = time.perf_counter()
        numbers["pandas"] = pandas_report(archive, Path(work) / f"pandas-{n}")
        run["pandas_s"] = round(time.perf_counter() - t, 1)
        run["pandas_peak_rss_gb"] = round(peak_rss_gb(), 2)
    run["load_average_at_end"] = round(os.getloadavg()[0], 2)
    shutil.rmtree(out, ignore_errors=True)
    return run, numbers


def peak_rss_gb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20   # kB on Linux


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--runs", type=int, default=3,
                   help="export, Spark (start, cold, warm) and pandas this many times; medians (3)")
    p.add_argument("--no-pandas", action="store_true", help="leave pandas out (it holds every event in memory)")
    p.add_argument("--json", help="write the results here too")
    p.add_argument("--keep", action="store_true", help="keep the archives")
    results_file.add_argument(p)
    p.add_argument("--spark-run", nargs=2, metavar=("ARCHIVE", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.spark_run:
        print(json.dumps(spark_run(*args.spark_run)))
        return

    work = tempfile.mkdtemp(prefix="bench-analytics-")
    results: dict = {"records": args.records, "machine": f"{os.cpu_count()} cores, Python {platform.python_version()}",
                     "load_average_at_start": round(os.getloadavg()[0], 2)}
    # pandas peaked at 1.6-1.8 GB of RSS per million events; leave it out unless 2 GB per million (+ 2) are free.
    need_gb = 2.0 * args.records / 1e6 + 2
    free_gb = psutil.virtual_memory().available / 2**30
    pandas = not args.no_pandas and free_gb > need_gb
    if not pandas:
        results["pandas_left_out"] = f"--no-pandas or {free_gb:.1f} GB available < {need_gb:.1f} GB needed"
    server = RedisServer().start()
    runs, checks = [], []
    try:
        client, keys = redis.Redis.from_url(server.url), Keys("bench")
        t = time.perf_counter()
        results["generated"] = load_stream(client, keys, args.records)
        results["generate_and_xadd_s"] = round(time.perf_counter() - t, 1)
        results["redis_used_memory_mb"] = round(client.info("memory")["used_memory"] / 2**20)
        print(json.dumps(results, indent=1), flush=True)
        for n in range(args.runs):
            run, numbers = one_run(client, keys, args.records, work, n, pandas)
            runs.append(run)
            checks.append(numbers)
            print(json.dumps({"run": n + 1, **run}), flush=True)
        client.close()
    finally:
        server.stop()
    results["runs"] = runs
    results["median"] = {key: median([r[key] for r in runs]) for key in runs[0]
                         if key.endswith("_s") or key == "export_events_per_s"}
    m = results["median"]
    if pandas:
        results["spark_warm_over_pandas"] = round(m["spark_report_warm_s"] / m["pandas_s"], 1)
        results["spark_start_plus_cold_over_pandas"] = round(m["spark_start_plus_cold_s"] / m["pandas_s"], 1)
        results["disagreements"] = [d for c in checks for d in agree(c["spark"], c["pandas"])]
    results["headline"] = checks[-1]["spark"]
    results["load_average_at_end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(results, indent=1, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    figures = {"records": args.records, **{f"median.{k}": round(v, 2) for k, v in m.items()}}
    figures.update({k: results[k] for k in ("spark_warm_over_pandas", "spark_start_plus_cold_over_pandas")
                    if k in results})
    results_file.write(args.results, "analytics", figures, ["celery_dlq/analytics/", "celery_dlq/storage/events.py"])
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"kept {work}")
    if results.get("disagreements"):
        sys.exit("spark and pandas disagree: " + "; ".join(results["disagreements"]))


if __name__ == "__main__":
    main()
