"""The report's numbers, each a DataFrame function over the exported events.

Definitions (``docs/analytics.md`` repeats them for readers):

* **dead letters**: events of type ``dead_lettered``; "day" is the UTC date
  of the event time (``ts``, the ``x-dlq-dead-lettered-at`` header).
* **attempts before death**: a dead letter's ``delivery``, the number of
  deliveries it had, the first included.
* **time to dead letter**: ``ts - first_failure_at`` in seconds, per dead
  letter that has ``x-dlq-first-failure-at`` (0 for one dead-lettered at its
  first failure). p50/p90/p99 are Spark's exact ``percentile()``: sort the n
  values, position ``p x (n - 1)``, linear interpolation between the two
  neighbours (numpy's default "linear" method). No approximation.
* **redelivery outcome** of a message (a task id), from its last event of
  type parked, redelivered, dead_lettered or dropped (stream order):
  ``succeeded_after_redelivery`` if it was redelivered at least once and the
  last is ``redelivered`` (no failure was recorded after its last
  redelivery: inferred, since success is not an event); ``dead_after_redelivery``
  if redelivered and the last is dead_lettered/dropped; ``pending`` if the
  last is ``parked``; ``dead`` counts every message whose last event is
  dead_lettered or dropped, redelivered or not. Success rate per task = succeeded / (succeeded +
  dead_after_redelivery), null when both are 0. Replays are not part of it.
* **poison payload**: a payload hash with at least ``poison_min`` dead letters
  (the same arguments dying again, as new messages or replayed ones).
* **trend**: dead letters in [as_of - 7 d, as_of) against [as_of - 14 d, as_of - 7 d).
* **in the DLQ** (replay candidates): a task id whose last event among
  dead_lettered, replayed, trimmed and purged is ``dead_lettered``.
"""
from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from celery_dlq.matching import Pattern
from celery_dlq.storage.archive import DATE_PARTITION, ID_COLUMN, SCHEMA, EventType, Field

#: Field kind (``celery_dlq.storage.archive.Field.kind``) -> Spark SQL type.
SPARK_TYPES = {"string": "STRING", "int": "INT", "bigint": "BIGINT", "timestamp": "TIMESTAMP"}


def events_ddl(schema: Iterable[Field] = SCHEMA) -> str:
    """The exported events as Spark reads them: event id, the non-partition fields, ``dt``, the partition fields."""
    fields = tuple(schema)
    columns = [f"{ID_COLUMN} STRING"]
    columns += [f"{f.column} {SPARK_TYPES[f.kind]}" for f in fields if not f.partition]
    columns += [f"{DATE_PARTITION} STRING"]
    columns += [f"{f.column} {SPARK_TYPES[f.kind]}" for f in fields if f.partition]
    return ", ".join(columns)


#: The schema of ``IN/events``, derived from ``archive.SCHEMA`` as export's Arrow schema is.
EVENTS_DDL = events_ddl()
#: What the report reads (Parquet column pruning skips the records and messages).
REPORT_COLUMNS = ("event_id", "event_type", "ts", "task_id", "task_name", "dlq", "delivery", "reason",
                  "exception_type", "first_failure_at", "payload_hash", "queue")
DEAD, DROPPED, PARKED, REDELIVERED = EventType.DEAD_LETTERED, EventType.DROPPED, EventType.PARKED, EventType.REDELIVERED
REPLAYED, TRIMMED, PURGED = EventType.REPLAYED, EventType.TRIMMED, EventType.PURGED
#: An operator's replay, purge, edit or job action (the audit trail's record): counted by type, read lean.
OPERATOR_ACTION = EventType.OPERATOR_ACTION
BREAKER = EventType.BREAKER   # a circuit breaker changed state (no message of its own: in no figure yet)
#: The events the report reads whole: dead letters and what moves them out of their DLQ. Of the others
#: (parked, redelivered, dropped: nine in ten) it reads LEAN_COLUMNS only, and the rest is left null.
DETAILED = (DEAD, REPLAYED, TRIMMED, PURGED)
LEAN_COLUMNS = ("event_id", "event_type", "task_id", "task_name")
US_PER_DAY = 86_400_000_000
PERCENTILES = (0.5, 0.9, 0.99)
#: Upper bounds (seconds) of the time-to-dead-letter histogram's buckets; the last is open.
LATENCY_BUCKETS: tuple[tuple[int | None, str], ...] = (
    (1, "< 1 s"), (10, "1-10 s"), (60, "10 s-1 min"), (600, "1-10 min"),
    (3600, "10 min-1 h"), (6 * 3600, "1-6 h"), (86400, "6 h-1 d"), (None, ">= 1 d"))


def read_events(spark: SparkSession, path: str) -> DataFrame:
    """The exported events under ``path`` (``path/events``), one row per stream id, partitioned by task id.

    Dead letters and DLQ moves (:data:`DETAILED`) keep every report column;
    the other events only :data:`LEAN_COLUMNS` (their ``event_id`` only until
    ``_order`` is taken from it), the rest null: what the report reads of
    them, nine events in ten, and so what it shuffles and caches.
    """
    base = path.rstrip("/") + "/events"
    try:
        df = spark.read.schema(EVENTS_DDL).option("basePath", base).parquet(base)
    except Exception as exc:  # AnalysisException: nothing exported yet
        if "PATH_NOT_FOUND" not in str(exc) and "Path does not exist" not in str(exc):
            raise
        df = spark.createDataFrame([], EVENTS_DDL)
    parts = F.split("event_id", "-")
    order = F.struct(parts.getItem(0).cast("long").alias("ms"), parts.getItem(1).cast("long").alias("seq"))
    # One row per stream id. Copies of a stream entry (an export written twice) are the same row, task id included,
    # so partitioned by task id and sorted within the partitions, the dedup streams: one shuffle and one sort, which
    # the per-message aggregations (outcomes, in_dlq) reuse instead of shuffling and sorting again.
    detailed = F.col("event_type").isin(*DETAILED)
    columns = [c if c in LEAN_COLUMNS else F.when(detailed, F.col(c)).alias(c) for c in REPORT_COLUMNS]
    unique = (df.select(*columns).repartition("task_id").sortWithinPartitions("task_id", "event_id")
              .dropDuplicates(["task_id", "event_id"]))
    # Once ordered, a lean event's id is not read again: left null, the cache need not hold it.
    return unique.select(F.when(detailed, F.col("event_id")).alias("event_id"), *REPORT_COLUMNS[1:],
                         order.alias("_order"))


def iso(column: str | Column) -> Column:
    """A timestamp as ISO 8601 text in UTC (the session time zone is UTC)."""
    return F.date_format(column, "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'")


def dead_letters(events: DataFrame) -> DataFrame:
    return events.where(F.col("event_type") == DEAD)


def counts_by_type(events: DataFrame) -> DataFrame:
    return events.groupBy("event_type").count().orderBy("event_type")


def per_day(dead: DataFrame) -> DataFrame:
    """Dead letters per UTC day, queue, task and exception type."""
    return (dead.groupBy(F.date_format(F.to_date("ts"), "yyyy-MM-dd").alias("day"), "queue", "task_name",
                         "exception_type")
            .agg(F.count("*").alias("dead_letters"))
            .orderBy("day", "queue", "task_name", "exception_type"))


def attempts(dead: DataFrame) -> DataFrame:
    """How many dead letters had 1, 2, ... deliveries."""
    return (dead.groupBy(F.col("delivery").alias("attempts"))
            .agg(F.count("*").alias("dead_letters")).orderBy("attempts"))


def latencies(dead: DataFrame) -> DataFrame:
    """Seconds from first failure to dead letter, per dead letter that knows its first failure."""
    seconds = (F.unix_micros("ts") - F.unix_micros("first_failure_at")) / F.lit(1_000_000.0)
    return (dead.where(F.col("first_failure_at").isNotNull())
            .select("event_id", "task_id", "task_name", "queue", iso("ts").alias("dead_lettered_at"),
                    seconds.alias("seconds")))


def latency_percentiles(latency: DataFrame) -> DataFrame:
    """Count, exact p50/p90/p99 and max of ``seconds``, per queue and overall (``total`` = 1), in one pass."""
    ps = ", ".join(str(p) for p in PERCENTILES)
    grouped = latency.rollup("queue").agg(
        F.grouping("queue").alias("total"), F.count("*").alias("count"),
        F.expr(f"percentile(seconds, array({ps}))").alias("_p"), F.max("seconds").alias("max"))
    return grouped.select("total", "queue", "count", *[F.col("_p")[i].alias(f"p{round(p * 100)}")
                                                       for i, p in enumerate(PERCENTILES)], "max"
                          ).orderBy("total", "queue")


def latency_histogram(latency: DataFrame) -> DataFrame:
    bucket: Column = F.lit(len(LATENCY_BUCKETS) - 1)
    for index in reversed(range(len(LATENCY_BUCKETS) - 1)):
        bound = LATENCY_BUCKETS[index][0]   # only the last bucket is open-ended
        bucket = F.when(F.col("seconds") < (bound or 0), index).otherwise(bucket)
    return latency.groupBy(bucket.alias("bucket")).agg(F.count("*").alias("dead_letters")).orderBy("bucket")


def outcomes(events: DataFrame) -> DataFrame:
    """One row per message (task id): its redeliveries and its inferred outcome."""
    life = events.where(F.col("event_type").isin(PARKED, REDELIVERED, DEAD, DROPPED)
                        & F.col("task_id").isNotNull())
    per_msg = life.groupBy("task_id").agg(
        F.max_by("event_type", "_order").alias("last_type"),
        F.max_by("task_name", "_order").alias("task_name"),
        F.sum(F.when(F.col("event_type") == REDELIVERED, 1).otherwise(0)).alias("redeliveries"))
    redelivered, last = F.col("redeliveries") > 0, F.col("last_type")
    outcome = (F.when(redelivered & (last == REDELIVERED), "succeeded_after_redelivery")
               .when(redelivered & last.isin(DEAD, DROPPED), "dead_after_redelivery")
               .when(last == PARKED, "pending")
               .when(last.isin(DEAD, DROPPED), "dead_without_redelivery")
               .otherwise("other"))
    return per_msg.withColumn("outcome", outcome)


def redelivery_by_task(outcome: DataFrame) -> DataFrame:
    """Per task: messages redelivered, how they ended, and the success rate (see the module docstring)."""
    def n(condition: Column) -> Column:
        return F.sum(F.when(condition, 1).otherwise(0))

    o = F.col("outcome")
    table = outcome.groupBy("task_name").agg(
        n(F.col("redeliveries") > 0).alias("redelivered"),
        n(o == "succeeded_after_redelivery").alias("succeeded_after_redelivery"),
        n(o == "dead_after_redelivery").alias("dead_after_redelivery"),
        n(o == "pending").alias("pending"),
        n(o.isin("dead_after_redelivery", "dead_without_redelivery")).alias("dead"))
    settled = F.col("succeeded_after_redelivery") + F.col("dead_after_redelivery")
    rate = F.when(settled > 0, F.col("succeeded_after_redelivery") / settled)
    return table.withColumn("success_rate", rate).orderBy("task_name")


def payload_hashes(dead: DataFrame) -> DataFrame:
    """Per payload hash: dead letters, distinct messages, exception types, first and last seen."""
    return (dead.where(F.col("payload_hash").isNotNull()).groupBy("payload_hash").agg(
        F.count("*").alias("dead_letters"), F.countDistinct("task_id").alias("messages"),
        F.min("task_name").alias("task_name"),
        F.array_sort(F.collect_set("exception_type")).alias("exception_types"),
        iso(F.min("ts")).alias("first_seen"), iso(F.max("ts")).alias("last_seen")))


def poison(hashes: DataFrame, min_dead_letters: int) -> DataFrame:
    """Poison payload hashes (unordered)."""
    return hashes.where(F.col("dead_letters") >= min_dead_letters)


def top_poison(poison_hashes: DataFrame, top: int) -> DataFrame:
    return poison_hashes.orderBy(F.desc("dead_letters"), F.desc("messages"), "payload_hash").limit(top)


def _window(as_of_us: int, start_days: int, end_days: int) -> Column:
    t = F.unix_micros("ts")
    return (t >= F.lit(as_of_us - start_days * US_PER_DAY)) & (t < F.lit(as_of_us - end_days * US_PER_DAY))


def trend_by_queue(dead: DataFrame, as_of_us: int) -> DataFrame:
    """Dead letters per queue in the last 7 days and the 7 before (queues with any)."""
    last, previous = _window(as_of_us, 7, 0), _window(as_of_us, 14, 7)
    return (dead.where(last | previous).groupBy("queue").agg(
        F.sum(F.when(last, 1).otherwise(0)).alias("last_7d"),
        F.sum(F.when(previous, 1).otherwise(0)).alias("previous_7d")).orderBy("queue"))


def in_dlq(events: DataFrame) -> DataFrame:
    """Dead letters still in their DLQ by the archive: latest dead_lettered, not replayed/trimmed/purged since."""
    moves = events.where(F.col("event_type").isin(DEAD, REPLAYED, TRIMMED, PURGED) & F.col("task_id").isNotNull())
    latest = moves.groupBy("task_id").agg(F.max_by(F.struct(*[c for c in moves.columns if c != "task_id"]),
                                                   "_order").alias("e"))
    return latest.select("task_id", "e.*").where(F.col("event_type") == DEAD)


def matching_names(names: Iterable[str | None], wanted: Iterable[str], kind: str) -> list[str]:
    """The names among ``names`` that a predicate selects (exact/suffix for exceptions, patterns for tasks)."""
    present = [n for n in names if n]
    wanted = list(wanted)
    if kind == "exception":
        return sorted({n for n in present for w in wanted if n == w or n.endswith("." + w)})
    patterns = [Pattern.parse(w, "--replay-task") for w in wanted]
    return sorted({n for n in present if any(p.matches(n) for p in patterns)})


def replay_flags(candidates: DataFrame, poison_hashes: DataFrame, *, exceptions: list[str] | None,
                 tasks: list[str] | None, min_ts_us: int | None, exclude_poison: bool) -> DataFrame:
    """Candidates with ``_matched`` (every given predicate holds; None: not given), ``_poison``, ``_selected``."""
    matched = F.lit(True)
    if exceptions is not None:
        matched = matched & F.coalesce(F.col("exception_type").isin(exceptions), F.lit(False))
    if tasks is not None:
        matched = matched & F.coalesce(F.col("task_name").isin(tasks), F.lit(False))
    if min_ts_us is not None:
        matched = matched & (F.unix_micros("ts") >= F.lit(min_ts_us))
    bad = poison_hashes.select("payload_hash", F.lit(True).alias("_poison"))
    flagged = (candidates.join(F.broadcast(bad), "payload_hash", "left")
               .withColumn("_poison", F.coalesce("_poison", F.lit(False)))
               .withColumn("_matched", matched))
    selected = F.col("_matched") & ~F.col("_poison") if exclude_poison else F.col("_matched")
    return flagged.withColumn("_selected", selected)


def replay_counts(flagged: DataFrame) -> DataFrame:
    """Per DLQ: dead letters in it, matched by the predicates, and selected."""
    def n(column: str) -> Column:
        return F.sum(F.col(column).cast("int"))

    return flagged.groupBy("dlq").agg(F.count("*").alias("in_dlq"), n("_matched").alias("matched"),
                                      n("_selected").alias("selected")).orderBy("dlq")


def plan_rows(flagged: DataFrame) -> DataFrame:
    """The replay plan's rows and columns, oldest dead letter first."""
    return flagged.where(F.col("_selected")).select(
        "task_id", "task_name", "queue", "dlq", "exception_type", "reason", "delivery",
        F.col("ts").alias("dead_lettered_at"), "payload_hash", "event_id",
    ).orderBy("dead_lettered_at", "task_id")
