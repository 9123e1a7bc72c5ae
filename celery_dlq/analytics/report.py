"""``celery dlq report``: the failure report and the replay plan, computed on Spark.

Reads ``IN/events`` (what ``celery dlq export`` wrote) and writes to ``OUT``::

    OUT/report.json            every number of the report (see figures.py for definitions)
    OUT/report.html            the same, self-contained, with charts (PNG, base64-embedded)
    OUT/tables/<name>/         the Parquet tables behind them
    OUT/replay_plan/manifest.json, OUT/replay_plan/entries/   the replay plan (read it with plan.py)

Spark writes the Parquet (any Hadoop URI: ``s3a://``, ``hdfs://``); the driver
writes the JSON and HTML with pyarrow (``s3a://`` is read as ``s3://``).
"""
from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from celery_dlq.analytics import figures as M
from celery_dlq.analytics.fs import filesystem, write_bytes
from celery_dlq.analytics.options import ReportOptions
from celery_dlq.analytics.plan import ENTRIES, MANIFEST, PLAN_DIR, PLAN_VERSION
from celery_dlq.analytics.render import render_html
from celery_dlq.analytics.session import build_session, report_session

#: Spark type name -> Arrow type, for the small tables the driver writes.
ARROW_TYPES = {"string": pa.string(), "bigint": pa.int64(), "int": pa.int32(), "double": pa.float64(),
               "array<string>": pa.list_(pa.string()), "boolean": pa.bool_()}

REPORT_VERSION = 1


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Report:
    """One report run over one archive; :meth:`run` computes and writes everything."""

    def __init__(self, spark: SparkSession, options: ReportOptions) -> None:
        self.spark = report_session(spark)
        self.options = options
        self.out = options.out_dir.rstrip("/")
        self._cached: list[DataFrame] = []

    def _cache(self, df: DataFrame) -> DataFrame:
        self._cached.append(df.cache())
        return df

    def table(self, name: str, df: DataFrame) -> list[dict[str, Any]]:
        """Collect a small aggregate; write it to ``OUT/tables/<name>/`` (pyarrow) and return its rows."""
        rows = [row.asDict(recursive=True) for row in df.collect()]
        write_rows(f"{self.out}/tables/{name}", rows, arrow_schema(df.schema))
        return rows

    def run(self) -> dict[str, Any]:
        started = time.perf_counter()
        try:
            events = self._cache(M.read_events(self.spark, self.options.in_path))
            dead = self._cache(M.dead_letters(events))
            report: dict[str, Any] = {"version": REPORT_VERSION, "generated_at": _iso(datetime.now(timezone.utc)),
                      "as_of": _iso(self.options.moment), "source": self.options.in_path}
            report["events"] = self.event_counts(events)
            report["dead_letters"] = {"total": report["events"]["by_type"].get(M.DEAD, 0),
                                      "dropped": report["events"]["by_type"].get(M.DROPPED, 0),
                                      "per_day": self.table("dead_letters_per_day", M.per_day(dead))}
            report["attempts_before_death"] = self.table("attempts_before_death", M.attempts(dead))
            report["time_to_dead_letter"] = self.time_to_dead_letter(dead)
            report["redelivery"] = self.table("redelivery_by_task", M.redelivery_by_task(M.outcomes(events)))
            hashes = self._cache(M.payload_hashes(dead))
            report["poison_payloads"] = self.poison(hashes)
            report["trend"] = self.trend(dead)
            report["replay_plan"] = self.replay_plan(events, hashes)
            report["seconds"] = round(time.perf_counter() - started, 3)
            self.write_documents(report)
            return report
        finally:
            for df in self._cached:
                df.unpersist()

    def event_counts(self, events: DataFrame) -> dict[str, Any]:
        by_type = {row["event_type"]: row["count"] for row in M.counts_by_type(events).collect()}
        return {"total": sum(by_type.values()), "by_type": by_type}

    def time_to_dead_letter(self, dead: DataFrame) -> dict[str, Any]:
        latency = self._cache(M.latencies(dead))
        latency.coalesce(1).write.mode("overwrite").parquet(f"{self.out}/tables/time_to_dead_letter")
        stats = M.latency_percentiles(latency)
        rows = [row.asDict() for row in stats.collect()]
        by_queue = [{k: v for k, v in row.items() if k != "total"} for row in rows if not row["total"]]
        write_rows(f"{self.out}/tables/time_to_dead_letter_by_queue", by_queue,
                   arrow_schema(stats.drop("total").schema))
        overall = next((r for r in rows if r["total"]), {"count": 0, "p50": None, "p90": None, "p99": None,
                                                         "max": None})
        histogram = {row["bucket"]: row["dead_letters"] for row in M.latency_histogram(latency).collect()}
        return {**{k: overall[k] for k in ("count", "p50", "p90", "p99", "max")},
                "definition": "exact percentile(): linear interpolation at p x (n - 1) "
                              "over the sorted seconds from first failure to dead letter",
                "by_queue": by_queue,
                "histogram": [{"bucket": label, "dead_letters": histogram.get(i, 0)}
                              for i, (_, label) in enumerate(M.LATENCY_BUCKETS)]}

    def poison(self, hashes: DataFrame) -> dict[str, Any]:
        poison = self._cache(M.poison(hashes, self.options.poison_min_dead_letters))
        top = self.table("poison_payloads", M.top_poison(poison, self.options.top))
        return {"min_dead_letters": self.options.poison_min_dead_letters, "count": poison.count(), "top": top}

    def trend(self, dead: DataFrame) -> dict[str, Any]:
        as_of = self.options.moment
        rows = self.table("trend_by_queue", M.trend_by_queue(dead, self.options.as_of_us))
        last, previous = sum(r["last_7d"] for r in rows), sum(r["previous_7d"] for r in rows)
        return {"last_7d": {"start": _iso(as_of - timedelta(days=7)), "end": _iso(as_of), "dead_letters": last},
                "previous_7d": {"start": _iso(as_of - timedelta(days=14)), "end": _iso(as_of - timedelta(days=7)),
                                "dead_letters": previous},
                "change": (last - previous) / previous if previous else None, "by_queue": rows}

    def replay_plan(self, events: DataFrame, hashes: DataFrame) -> dict[str, Any]:
        """Select dead letters to replay, write ``replay_plan/``; returns its manifest."""
        opts = self.options
        fs, root = filesystem(f"{self.out}/{PLAN_DIR}")
        if fs.get_file_info(f"{root}/{MANIFEST}").type != pafs.FileType.NotFound:  # the old plan is void now
            fs.delete_file(f"{root}/{MANIFEST}")
        candidates = self._cache(M.in_dlq(events))

        def names(column: str, wanted: tuple[str, ...], kind: str) -> list[str] | None:
            if not wanted:
                return None
            seen = [row[0] for row in candidates.select(column).distinct().collect()]
            return M.matching_names(seen, wanted, kind)

        min_ts_us = None if opts.replay_max_age is None else opts.as_of_us - round(opts.replay_max_age * 1e6)
        flagged = self._cache(M.replay_flags(
            candidates, M.poison(hashes, opts.poison_min_dead_letters),
            exceptions=names("exception_type", opts.replay_exceptions, "exception"),
            tasks=names("task_name", opts.replay_tasks, "task"), min_ts_us=min_ts_us,
            exclude_poison=not opts.include_poison))
        counts = M.replay_counts(flagged).collect()
        M.plan_rows(flagged).coalesce(1).write.mode("overwrite").parquet(f"{self.out}/{PLAN_DIR}/{ENTRIES}")
        total = {k: sum(row[k] for row in counts) for k in ("in_dlq", "matched", "selected")}
        manifest = {"version": PLAN_VERSION, "created_at": _iso(datetime.now(timezone.utc)),
                    "as_of": _iso(opts.moment), "source": opts.in_path, "predicates": opts.predicates(),
                    "counts": {"in_dlq": total["in_dlq"], "matched": total["matched"],
                               "excluded_poison": total["matched"] - total["selected"], "selected": total["selected"]},
                    "by_dlq": {row["dlq"]: row["selected"] for row in counts if row["selected"]},
                    "entries": ENTRIES}
        write_bytes(fs, f"{root}/{MANIFEST}", json.dumps(manifest, indent=2).encode("utf-8"))
        return manifest

    def write_documents(self, report: dict[str, Any]) -> None:
        fs, root = filesystem(self.out)
        write_bytes(fs, f"{root}/report.json", json.dumps(report, indent=2, default=str).encode("utf-8"))
        write_bytes(fs, f"{root}/report.html", render_html(report).encode("utf-8"))


def arrow_schema(schema: Any) -> pa.Schema:
    return pa.schema([(f.name, ARROW_TYPES[f.dataType.simpleString()]) for f in schema.fields])


def write_rows(uri: str, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
    """``rows`` as ``uri/part-00000.parquet``, replacing what the directory held."""
    fs, path = filesystem(uri)
    if fs.get_file_info(path).type == pafs.FileType.Directory:
        fs.delete_dir_contents(path)
    fs.create_dir(path, recursive=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), f"{path}/part-00000.parquet", filesystem=fs)


def run_report(spark: SparkSession, options: ReportOptions) -> dict[str, Any]:
    """Compute and write the report with an existing session; returns report.json's content."""
    return Report(spark, options).run()


def main(options: ReportOptions) -> dict[str, Any]:
    """The command: a quiet local session (or spark-submit's), the report, then stop what it started."""
    existing = SparkSession.getActiveSession()
    spark = build_session(options.master, options.conf)
    try:
        return run_report(spark, options)
    finally:
        if existing is None:  # ours: stop it; a caller's (a test, a notebook) stays up
            spark.stop()

