"""The report's Spark schema comes from the archive's one schema (``celery_dlq.storage.archive.SCHEMA``)."""
from __future__ import annotations

import pytest

from celery_dlq.analytics import figures as M
from celery_dlq.analytics.export import EVENT_SCHEMA, PARTITION_SCHEMA
from celery_dlq.storage.archive import SCHEMA, EventType, Field

SPARK_KINDS = {"string": "STRING", "int": "INT", "bigint": "BIGINT", "timestamp": "TIMESTAMP"}


def ddl_columns(ddl: str) -> list[tuple[str, str]]:
    return [tuple(column.split(" ")) for column in ddl.split(", ")]  # type: ignore[misc]


def test_the_spark_ddl_is_derived_from_the_archive_schema():
    columns = [f for f in SCHEMA if not f.partition]
    partitions = [f for f in SCHEMA if f.partition]
    assert ddl_columns(M.EVENTS_DDL) == [("event_id", "STRING"), *((f.column, SPARK_KINDS[f.kind]) for f in columns),
                                         ("dt", "STRING"), *((f.column, SPARK_KINDS[f.kind]) for f in partitions)]
    # Spark reads the columns export writes, in the same order.
    assert [name for name, _ in ddl_columns(M.EVENTS_DDL)] == [*EVENT_SCHEMA.names, *PARTITION_SCHEMA.names]
    assert {M.DEAD, M.DROPPED, M.PARKED, M.REDELIVERED, M.REPLAYED, M.TRIMMED, M.PURGED,
            M.OPERATOR_ACTION, M.BREAKER} == set(EventType.ALL)


def test_a_field_added_to_the_archive_schema_reaches_the_spark_ddl():
    grown = (*SCHEMA, Field("attempt_ms", "attempt_ms", "bigint"),
             Field("region", "region_name", "string", partition=True))
    columns = ddl_columns(M.events_ddl(grown))
    assert columns == [*ddl_columns(M.EVENTS_DDL)[:-2], ("attempt_ms", "BIGINT"), ("dt", "STRING"),
                       ("queue", "STRING"), ("region_name", "STRING")]


@pytest.mark.spark
@pytest.mark.xdist_group("spark")
def test_spark_reads_the_exported_files_with_the_declared_types(spark, hand_archive):
    base = f"{hand_archive}/events"
    written = spark.read.option("basePath", base).parquet(base).schema
    declared = spark.createDataFrame([], M.EVENTS_DDL).schema
    files = [(f.name, f.dataType) for f in written if f.name not in PARTITION_SCHEMA.names]
    assert files == [(f.name, f.dataType) for f in declared][:len(EVENT_SCHEMA)]
    assert [f.name for f in written] == [f.name for f in declared]
