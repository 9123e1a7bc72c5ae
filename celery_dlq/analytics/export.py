"""``celery dlq export``: the event archive (a Redis Stream) to Parquet, incrementally; no JVM.

Layout under ``PATH`` (a local path or any pyarrow filesystem URI, ``s3://``)::

    PATH/_checkpoint.json                          the last exported stream id, and the stream's name
    PATH/_checkpoint.shard-<s>.json                the same for shard s's stream (dlq_store_shards > 1)
    PATH/events/dt=YYYY-MM-DD/queue=Q/part-<first id>-<n>.parquet
    PATH/events/dt=YYYY-MM-DD/queue=Q/part-<s>-<first id>-<n>.parquet   shard s's events
    PATH/snapshots/snapshot-<UTC time>.parquet     with --snapshot: what the DLQs hold right now

``dt`` is the event's UTC date and ``queue`` its original queue (URI-escaped,
``__HIVE_DEFAULT_PARTITION__`` when unknown), Hive style, as Spark and
pyarrow read them. Timestamps are Parquet ``TIMESTAMP(MICROS, UTC)``.

**No duplicates, nothing skipped.** Each flush writes its files and then
moves the checkpoint past the last stream id it wrote. Before writing, the
checkpoint names the files about to be written (``pending``); a run that
finds a pending flush (the last one died midway) deletes those files first
and exports from the checkpoint again. Run one export per ``PATH`` at a time.

**Nothing lost unnoticed.** The stream is capped (``dlq_events_max_length``).
An export reads up to the stream's last id as of its start, and the
checkpoint keeps that id with the stream's ``entries-added`` counter then
(Redis >= 7, read atomically with it). The next export compares: events
added since, minus events still in the stream after the checkpoint, is the
number trimmed before anyone exported them. A loss is logged as a warning and
returned (``events_lost``): export more often or raise the cap.

**Every shard.** A sharded store (``dlq_store_shards`` > 1) has a stream per
shard, and the home stream of what belongs to no task. Each is exported
with its own checkpoint into the one dataset; a shard's event ids carry its
name (``s``: its hash tag after the prefix, :func:`shard_name`) after the
stream id, ``<ms>-<seq>-<s>``, so ids stay unique across streams.
"""
from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from celery_dlq import headers as H
from celery_dlq.analytics.checkpoint import Checkpoint, StreamState, checkpoint_name, delete_pending
from celery_dlq.analytics.fs import filesystem
from celery_dlq.message import Envelope, decode_raw
from celery_dlq.ops.operator import Operator
from celery_dlq.storage.archive import DATE_PARTITION, ID_COLUMN, SCHEMA, EventLog, Field, event_of, parse_id
from celery_dlq.storage.shards import ShardedStore

logger = logging.getLogger(__name__)

EVENTS_DIR = "events"
SNAPSHOTS_DIR = "snapshots"
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
SNAPSHOT_TYPE = "in_dlq"
US_PER_DAY = 86_400_000_000

TIMESTAMP = pa.timestamp("us", tz="UTC")
#: Field kind (``celery_dlq.storage.archive.Field.kind``) -> Arrow type.
ARROW_TYPES = {"string": pa.string(), "int": pa.int32(), "bigint": pa.int64(), "timestamp": TIMESTAMP}


def event_schema(schema: Iterable[Field] = SCHEMA) -> pa.Schema:
    """The columns of an event file: the stream id, then the non-partition fields in schema order."""
    return pa.schema([(ID_COLUMN, pa.string())] + [(f.column, ARROW_TYPES[f.kind]) for f in schema if not f.partition])


def partition_schema(schema: Iterable[Field] = SCHEMA) -> pa.Schema:
    """The Hive directories of the event files: the UTC date, then the partition fields."""
    return pa.schema([(DATE_PARTITION, pa.string())] + [(f.column, ARROW_TYPES[f.kind]) for f in schema if f.partition])


def stream_fields(schema: Iterable[Field] = SCHEMA) -> tuple[tuple[str, str], ...]:
    """Stream field -> column: the non-partition fields in schema order, then the partition ones."""
    return tuple((f.name, f.column) for f in sorted(schema, key=lambda f: f.partition))  # sorted() is stable


#: The columns of every event file (the partitions are in the path), derived from ``archive.SCHEMA``.
EVENT_SCHEMA = event_schema()
PARTITION_SCHEMA = partition_schema()
#: A snapshot file: the event columns, the partitions but the date, and when it was taken.
SNAPSHOT_SCHEMA = pa.schema([*EVENT_SCHEMA, *(f for f in PARTITION_SCHEMA if f.name != DATE_PARTITION),
                             pa.field("snapshot_at", TIMESTAMP)])
#: Stream field -> column, in EVENT_SCHEMA's order after event_id, then the partitions (``Event.to_fields``).
STREAM_FIELDS = stream_fields()
_KEYS = tuple(name.encode() for name, _ in STREAM_FIELDS)
#: The partition columns event_table computes from stream fields (the date comes from ``ts``).
_PARTITIONS = tuple(f for f in PARTITION_SCHEMA if f.name != DATE_PARTITION)


@dataclass(frozen=True)
class ExportResult:
    """What one export wrote."""

    rows: int = 0
    files: tuple[str, ...] = ()
    last_id: str | None = None
    events_lost: int | None = 0     # trimmed from the stream before export; None: cannot tell
    snapshot_rows: int = 0
    snapshot_file: str | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "files": len(self.files), "last_id": self.last_id,
                "events_lost": self.events_lost,
                "snapshot_rows": self.snapshot_rows, "snapshot_file": self.snapshot_file,
                "seconds": round(self.seconds, 3)}


# -- events -> Arrow ------------------------------------------------------------

def _column(values: tuple, field: pa.Field) -> pa.Array:
    """Raw stream values (bytes or None) as a column of ``field``'s type, vectorized by Arrow."""
    raw = pa.array(values, pa.binary())
    try:
        text = raw.cast(pa.string())
    except pa.ArrowInvalid:  # not UTF-8: decode with replacement, value by value
        text = pa.array([None if v is None else bytes(v).decode("utf-8", "replace") for v in values], pa.string())
    if pa.types.is_string(field.type):
        return pc.if_else(pc.equal(text, ""), pa.scalar(None, pa.string()), text)
    try:
        number = text.cast(pa.int64())
    except pa.ArrowInvalid:
        number = pa.array([_int_or_none(v) for v in text.to_pylist()], pa.int64())
    return number.cast(field.type)


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None


def event_table(entries: list[tuple[str, Mapping[Any, Any]]]) -> pa.Table:
    """Stream entries ``(id, fields)`` as an Arrow table of ``EVENT_SCHEMA`` plus the partitions (dt, queue)."""
    rows = [_values(f) for _, f in entries]
    columns = list(zip(*rows)) if rows else [()] * len(_KEYS)
    names = [column for _, column in STREAM_FIELDS]
    arrays = {ID_COLUMN: pa.array([entry_id for entry_id, _ in entries], pa.string())}
    schema = pa.schema([*EVENT_SCHEMA, *_PARTITIONS])
    for name, values in zip(names, columns):
        arrays[name] = _column(values, schema.field(name))
    arrays["event_type"] = pc.fill_null(arrays["event_type"], "")
    arrays["ts"] = pc.fill_null(arrays["ts"].cast(pa.int64()), 0).cast(TIMESTAMP)
    days = pc.divide(arrays["ts"].cast(pa.int64()), US_PER_DAY).cast(pa.int32()).cast(pa.date32())
    table = pa.table([arrays[name] for name in EVENT_SCHEMA.names], schema=EVENT_SCHEMA)
    table = table.append_column(DATE_PARTITION, days.cast(pa.string()))
    for field in _PARTITIONS:
        table = table.append_column(field, arrays[field.name])
    return table


def _values(fields: Mapping[Any, Any]) -> list:
    """One entry's values in STREAM_FIELDS order, as bytes (redis-py gives bytes; a text mapping is encoded)."""
    if not fields or isinstance(next(iter(fields)), bytes):
        return [fields.get(k) for k in _KEYS]
    return [_bytes(fields.get(k.decode())) for k in _KEYS]


def _bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return str(value).encode("utf-8")


def _write_partitioned(table: pa.Table, fs: pafs.FileSystem, base: str, basename: str) -> list[str]:
    # No file_visitor: Arrow can release a Python callback on its I/O thread after write_dataset returns, and
    # taking the GIL at interpreter exit aborts the process (apache/arrow#34314, python/cpython#87135).
    ds.write_dataset(
        table, base, filesystem=fs, format="parquet",
        partitioning=ds.partitioning(PARTITION_SCHEMA, flavor="hive"),
        basename_template=basename + "{i}.parquet",
        existing_data_behavior="overwrite_or_ignore",
        file_options=ds.ParquetFileFormat().make_write_options(compression="zstd"),
        max_partitions=1_000_000, max_open_files=1024, use_threads=True,
    )
    return _written(fs, base, basename, pc.unique(table.column(DATE_PARTITION)).to_pylist())


def _written(fs: pafs.FileSystem, base: str, basename: str, days: list[str]) -> list[str]:
    """The files ``<basename><i>.parquet`` under the ``dt`` directories of ``days``."""
    name = re.compile(re.escape(basename) + r"\d+\.parquet")
    return [info.path for day in days
            for info in fs.get_file_info(pafs.FileSelector(f"{base}/{DATE_PARTITION}={day}", recursive=True))
            if info.type == pafs.FileType.File and name.fullmatch(info.base_name)]


def export_events(client: Any, keys: Any, out: str, *, read_count: int = 10_000,
                  flush_rows: int = 500_000, shard: str | None = None) -> ExportResult:
    """Export every event after ``out``'s checkpoint; ``read_count`` per XRANGE, ``flush_rows`` per flush.

    ``shard``: the stream is shard ``shard``'s of a sharded store (its own
    checkpoint file, file names and event id suffix); None: the home stream.
    """
    started = time.perf_counter()
    fs, root = filesystem(out)
    base = f"{root}/{EVENTS_DIR}"
    log = EventLog(client, keys, max_length=0)
    checkpoint = Checkpoint.load(fs, root, log.key, checkpoint_name(shard))
    if checkpoint.pending:
        delete_pending(fs, base, checkpoint.pending)
        checkpoint.pending = None
        checkpoint.save(fs, root)
    state = StreamState.of(log.info())
    if state is None or (checkpoint.last_id and parse_id(state.last_id) <= parse_id(checkpoint.last_id)):
        return ExportResult(last_id=checkpoint.last_id, seconds=time.perf_counter() - started)
    lost = state.lost_after(checkpoint)
    if lost:
        logger.warning("celery-dlq export: %d events after %s were trimmed from %s before any export; "
                       "export more often or raise dlq_events_max_length", lost, checkpoint.last_id, log.key)
    rows, files = 0, []
    buffer: list[tuple[str, Mapping]] = []
    after = checkpoint.last_id
    while True:
        entries = log.read(after, read_count, until=state.last_id)
        buffer.extend(entries)
        after = entries[-1][0] if entries else after
        done = len(entries) < read_count
        if buffer and (done or len(buffer) >= flush_rows):
            files += _flush(fs, root, base, checkpoint, buffer, shard)
            rows += len(buffer)
            buffer = []
        if done:
            break
    # Everything up to the stream's last id at the start is exported (or was gone already).
    checkpoint.last_id, checkpoint.added = state.last_id, state.added
    checkpoint.save(fs, root)
    return ExportResult(rows=rows, files=tuple(files), last_id=checkpoint.last_id, events_lost=lost,
                        seconds=time.perf_counter() - started)


def _flush(fs: pafs.FileSystem, root: str, base: str, checkpoint: Checkpoint,
           buffer: list[tuple[str, Mapping]], shard: str | None) -> list[str]:
    prefix = f"part-{buffer[0][0]}-" if shard is None else f"part-{shard}-{buffer[0][0]}-"
    checkpoint.pending = prefix
    checkpoint.save(fs, root)
    table = event_table([(f"{entry_id}-{shard}", fields) for entry_id, fields in buffer] if shard else buffer)
    files = _write_partitioned(table, fs, base, prefix)
    checkpoint.pending = None
    checkpoint.last_id, checkpoint.added = buffer[-1][0], None
    checkpoint.rows += len(buffer)
    checkpoint.save(fs, root)
    return files


def export_store(client: Any, store: ShardedStore, out: str) -> ExportResult:
    """Export every stream of the store: the home stream, then each shard's (an earlier shard count's
    included), into one dataset; the result adds them up (``last_id``: the newest event exported)."""
    home = store.shards.home
    results = [export_events(client, shard.keys, out,
                             shard=None if shard.keys is home else shard_name(home.prefix, shard.keys.prefix))
               for shard in store.all]
    ids = [r.last_id for r in results if r.last_id]
    lost = [r.events_lost for r in results]
    return ExportResult(rows=sum(r.rows for r in results), files=tuple(f for r in results for f in r.files),
                        last_id=max(ids, key=parse_id) if ids else None,
                        events_lost=None if None in lost else sum(n or 0 for n in lost),
                        seconds=sum(r.seconds for r in results))


def shard_name(prefix: str, tag: str) -> str:
    """A shard's name in file names and event ids: its hash tag after ``<prefix>:``, dots for colons (``0.3``)."""
    return tag[len(prefix) + 1:].replace(":", ".")


# -- snapshot of the DLQs --------------------------------------------------------

def snapshot_table(letters: Iterable[tuple[str, bytes]], snapshot_at_us: int) -> pa.Table:
    """``(dlq name, raw DLQ element)`` pairs as rows of ``SNAPSHOT_SCHEMA`` (type ``in_dlq``)."""
    rows: list[tuple[str, Mapping]] = []
    for n, (dlq, raw) in enumerate(letters):
        envelope = _readable(raw)
        if envelope is None:
            logger.warning("celery-dlq export: skipping an unreadable message in %s", dlq)
            continue
        at = envelope.headers.get(H.DEAD_LETTERED_AT)
        event = event_of(SNAPSHOT_TYPE, envelope, ts=at if at is not None else snapshot_at_us / 1e6,
                         dlq=dlq, with_record=True)
        rows.append((f"snapshot:{dlq}:{n}", event.to_fields()))
    table = event_table(rows).drop_columns([DATE_PARTITION])
    at = pa.array([snapshot_at_us] * table.num_rows, TIMESTAMP)
    return table.append_column("snapshot_at", at)


def _readable(raw: bytes | str) -> Envelope | None:
    """A DLQ element as an Envelope; None when it is not a kombu message (not a JSON object, a bad body)."""
    message = decode_raw(raw)
    if not message.doc:
        return None
    try:
        return message.as_envelope()
    except (ValueError, TypeError):  # e.g. a body that is neither text nor bytes
        return None


def export_snapshot(letters: Iterable[tuple[str, bytes]], out: str, *, now: float | None = None,
                    batch: int = 10_000) -> tuple[int, str]:
    """Write what the DLQs hold now to ``PATH/snapshots/``; returns (rows, file)."""
    fs, root = filesystem(out)
    now = time.time() if now is None else now
    at_us = int(round(now * 1_000_000))
    stamp = datetime.fromtimestamp(now, timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    folder = f"{root}/{SNAPSHOTS_DIR}"
    fs.create_dir(folder, recursive=True)
    final, tmp = f"{folder}/snapshot-{stamp}.parquet", f"{folder}/_tmp-snapshot-{stamp}.parquet"
    rows, chunk = 0, []
    with pq.ParquetWriter(tmp, SNAPSHOT_SCHEMA, filesystem=fs, compression="zstd") as writer:
        for item in letters:
            chunk.append(item)
            if len(chunk) >= batch:
                rows += _write_snapshot_chunk(writer, chunk, at_us)
                chunk = []
        rows += _write_snapshot_chunk(writer, chunk, at_us)
    fs.move(tmp, final)
    return rows, final


def _write_snapshot_chunk(writer: pq.ParquetWriter, chunk: list, at_us: int) -> int:
    table = snapshot_table(chunk, at_us)
    writer.write_table(table)
    return table.num_rows


def dlq_contents(operator: Any) -> Iterable[tuple[str, bytes]]:
    """Every dead letter in every DLQ the operator tools know (:class:`celery_dlq.ops.operator.Operator`)."""
    for name in sorted(operator.known(operator.parked.counts_by_queue())):
        for letter in operator.queue(name).entries():
            yield name, letter.raw


def export_app(app: Any, out: str, *, snapshot: bool = False, now: float | None = None) -> ExportResult:
    """``celery dlq export``: the app's event stream, and with ``snapshot`` its DLQs' contents.

    Reads the app's settings and connects to Redis as the operator tools do;
    installs nothing on the app.
    """
    operator = Operator(app)
    result = export_store(operator.client, operator.sharded, out)
    if not snapshot:
        return result
    rows, path = export_snapshot(dlq_contents(operator), out, now=now)
    return ExportResult(rows=result.rows, files=result.files, last_id=result.last_id,
                        events_lost=result.events_lost,
                        snapshot_rows=rows, snapshot_file=path, seconds=result.seconds)
