"""Export of the archive to Parquet: layout, UTC, incremental checkpoint, no duplicates, snapshots."""
from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone

import fakeredis
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from celery_dlq.analytics import export as X
from celery_dlq.cli import analytics as cli_analytics
from celery_dlq.errors import ExportError
from celery_dlq.storage.archive import SCHEMA, Event, EventLog, Field
from celery_dlq.storage.keys import Keys

DAY_US = 86_400_000_000
MIDNIGHT = 1_710_460_800_000_000  # 2024-03-15T00:00:00Z


def ev(i: int, ts_us: int, queue: str | None = "orders", **kw) -> Event:
    return Event("dead_lettered", ts_us, task_id=f"t{i}", task_name="shop.charge", queue=queue or "",
                 dlq=f"DLQ.{queue}" if queue else "", delivery=2, payload_hash=f"h{i}", **kw)


@pytest.fixture
def log():
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    return EventLog(client, Keys("exp"), max_length=10_000)


def read(path) -> pa.Table:
    return ds.dataset(str(path / "events"), format="parquet", partitioning="hive").to_table()


def test_layout_types_and_utc_dates_under_a_non_utc_local_zone(log, tmp_path, monkeypatch):
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        log.append([ev(1, MIDNIGHT - 1), ev(2, MIDNIGHT), ev(3, MIDNIGHT + 5, queue="a/b c"), ev(4, MIDNIGHT, None)])
        result = X.export_events(log.client, Keys("exp"), str(tmp_path))
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert result.rows == 4 and len(result.files) == 4
    dirs = sorted(os.path.relpath(os.path.dirname(f), tmp_path / "events") for f in result.files)
    assert dirs == ["dt=2024-03-14/queue=orders", "dt=2024-03-15/queue=__HIVE_DEFAULT_PARTITION__",
                    "dt=2024-03-15/queue=a%2Fb%20c", "dt=2024-03-15/queue=orders"]
    table = read(tmp_path).sort_by("task_id")
    assert table.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert table.column("queue").to_pylist() == ["orders", "orders", "a/b c", None]
    assert table.column("dt").to_pylist() == ["2024-03-14", "2024-03-15", "2024-03-15", "2024-03-15"]
    assert table.column("ts").cast(pa.int64()).to_pylist() == [MIDNIGHT - 1, MIDNIGHT, MIDNIGHT + 5, MIDNIGHT]
    file_schema = pq.read_schema(result.files[0])
    assert "dt" not in file_schema.names and file_schema.field("ts").type.unit == "us"


def test_rerun_exports_only_what_is_new_never_a_row_twice(log, tmp_path):
    keys = Keys("exp")
    log.append([ev(i, MIDNIGHT + i) for i in range(5)])
    first = X.export_events(log.client, keys, str(tmp_path))
    assert first.rows == 5
    assert X.export_events(log.client, keys, str(tmp_path)).rows == 0
    log.append([ev(i, MIDNIGHT + DAY_US + i) for i in range(5, 8)])
    second = X.export_events(log.client, keys, str(tmp_path))
    assert second.rows == 3 and second.last_id != first.last_id
    ids = read(tmp_path).column("event_id").to_pylist()
    assert len(ids) == len(set(ids)) == 8
    checkpoint = json.loads((tmp_path / "_checkpoint.json").read_text())
    assert checkpoint["stream"] == keys.events and checkpoint["rows"] == 8
    assert checkpoint["last_id"] == second.last_id and checkpoint["pending"] is None


def test_small_reads_and_flushes_still_export_each_row_once(log, tmp_path):
    log.append([ev(i, MIDNIGHT + i * 3_600_000_000) for i in range(50)])
    result = X.export_events(log.client, Keys("exp"), str(tmp_path), read_count=7, flush_rows=20)
    assert result.rows == 50
    assert sorted(read(tmp_path).column("task_id").to_pylist()) == sorted(f"t{i}" for i in range(50))


def test_no_python_callback_goes_to_arrow_and_each_flush_lists_only_its_own_files(log, tmp_path, monkeypatch):
    """A file_visitor can be released on Arrow's I/O thread at interpreter exit: SIGABRT (apache/arrow#34314)."""
    calls, real = [], ds.write_dataset
    monkeypatch.setattr(ds, "write_dataset", lambda *args, **kwargs: calls.append(kwargs) or real(*args, **kwargs))
    log.append([ev(1, MIDNIGHT), ev(2, MIDNIGHT + DAY_US, queue="q2")])
    first = X.export_events(log.client, Keys("exp"), str(tmp_path))
    log.append([ev(3, MIDNIGHT + 1)])
    second = X.export_events(log.client, Keys("exp"), str(tmp_path))
    assert len(calls) == 2 and not any(callable(value) for kwargs in calls for value in kwargs.values())
    assert len(first.files) == 2 and len(second.files) == 1 and not set(first.files) & set(second.files)
    assert sorted([*first.files, *second.files]) == sorted(str(p) for p in (tmp_path / "events").rglob("*.parquet"))


def test_an_export_that_died_midway_is_redone_without_duplicates(log, tmp_path, monkeypatch):
    keys = Keys("exp")
    log.append([ev(i, MIDNIGHT + i) for i in range(10)])
    real = X._write_partitioned

    def dies_after_writing(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt("killed after the files, before the checkpoint")

    monkeypatch.setattr(X, "_write_partitioned", dies_after_writing)
    with pytest.raises(KeyboardInterrupt):
        X.export_events(log.client, keys, str(tmp_path))
    assert json.loads((tmp_path / "_checkpoint.json").read_text())["pending"]
    monkeypatch.setattr(X, "_write_partitioned", real)
    log.append([ev(10, MIDNIGHT + 10)])  # the retry reads a longer batch than the one that died
    assert X.export_events(log.client, keys, str(tmp_path)).rows == 11
    ids = read(tmp_path).column("task_id").to_pylist()
    assert sorted(ids) == sorted(f"t{i}" for i in range(11))


def test_a_path_holding_another_stream_is_refused(log, tmp_path):
    log.append([ev(1, MIDNIGHT)])
    X.export_events(log.client, Keys("exp"), str(tmp_path))
    with pytest.raises(ExportError, match="export each key prefix to its own PATH"):
        X.export_events(log.client, Keys("other"), str(tmp_path))


def test_uri_destination(log, tmp_path):
    log.append([ev(1, MIDNIGHT)])
    assert X.export_events(log.client, Keys("exp"), f"file://{tmp_path}/arch").rows == 1
    assert read(tmp_path / "arch").num_rows == 1


def test_report_command_refuses_bad_options_before_starting_spark():
    runner = CliRunner()
    for args, text in ((["--conf", "novalue"], "--conf takes key=value"),
                       (["--replay-max-age", "soon"], "bad duration"),
                       (["--as-of", "yesterday"], "bad time"),
                       (["--poison-min", "1"], "--poison-min must be >= 2")):
        out = runner.invoke(cli_analytics.report, ["--in", "x", "--out", "y", *args])
        assert out.exit_code == 2 and text in out.output, (args, out.output)


def test_report_options_as_of_is_utc():
    from celery_dlq.analytics.options import ReportOptions

    options = ReportOptions("in", "out", as_of="2024-03-15T12:00:00", replay_max_age="6h")
    assert options.as_of == datetime(2024, 3, 15, 12, tzinfo=timezone.utc)
    assert options.as_of_us == 1_710_504_000_000_000 and options.replay_max_age == 21600.0
    assert ReportOptions("in", "out", as_of="1710504000").as_of == options.as_of


ARROW_KINDS = {"string": pa.string(), "int": pa.int32(), "bigint": pa.int64(),
               "timestamp": pa.timestamp("us", tz="UTC")}


def test_the_arrow_schemas_are_derived_from_the_archive_schema():
    columns = [f for f in SCHEMA if not f.partition]
    partitions = [f for f in SCHEMA if f.partition]
    assert [f.name for f in partitions] == ["queue"]
    assert X.EVENT_SCHEMA.names == ["event_id", *(f.column for f in columns)]
    assert X.EVENT_SCHEMA.types == [pa.string(), *(ARROW_KINDS[f.kind] for f in columns)]
    assert X.PARTITION_SCHEMA.names == ["dt", *(f.column for f in partitions)]
    assert X.PARTITION_SCHEMA.types == [pa.string(), *(ARROW_KINDS[f.kind] for f in partitions)]
    assert X.SNAPSHOT_SCHEMA.names == [*X.EVENT_SCHEMA.names, *(f.column for f in partitions), "snapshot_at"]
    assert X.STREAM_FIELDS == tuple((f.name, f.column) for f in columns + partitions)
    assert {name for name, _ in X.STREAM_FIELDS} == set(Event.__dataclass_fields__)  # every event field is exported


def test_a_field_added_to_the_archive_schema_reaches_every_arrow_derivation():
    grown = (*SCHEMA, Field("attempt_ms", "attempt_ms", "bigint"),
             Field("region", "region_name", "string", partition=True))
    events, partitions = X.event_schema(grown), X.partition_schema(grown)
    assert events.names == [*X.EVENT_SCHEMA.names, "attempt_ms"]
    assert events.field("attempt_ms").type == pa.int64()
    assert partitions.names == [*X.PARTITION_SCHEMA.names, "region_name"]
    assert X.stream_fields(grown) == (*X.STREAM_FIELDS[:-1], ("attempt_ms", "attempt_ms"), X.STREAM_FIELDS[-1],
                                      ("region", "region_name"))
    with pytest.raises(KeyError):  # a kind without an Arrow type is refused, not guessed
        X.event_schema((*SCHEMA, Field("blob", "blob", "bytes")))


def test_exported_files_hold_exactly_the_derived_columns(log, tmp_path):
    log.append([ev(1, MIDNIGHT, exception_type="ValueError", first_failure_us=MIDNIGHT - 5)])
    result = X.export_events(log.client, Keys("exp"), str(tmp_path))
    assert pq.read_schema(result.files[0]).remove_metadata().equals(X.EVENT_SCHEMA)
    assert read(tmp_path).schema.names == [*X.EVENT_SCHEMA.names, *X.PARTITION_SCHEMA.names]
