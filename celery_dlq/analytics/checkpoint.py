"""The export's checkpoints: how far each archive stream was exported, and what a stream holds now.

One checkpoint file per stream under the export's ``PATH``:
``_checkpoint.json`` for the (home) stream of an unsharded store, and
``_checkpoint.shard-<s>.json`` for shard ``s``'s stream of a sharded one
(``dlq_store_shards``). See :mod:`celery_dlq.analytics.export` for how
they make an export exactly-once and tell what was trimmed before export.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pyarrow.fs as pafs

from celery_dlq.analytics.fs import read_bytes, write_bytes
from celery_dlq.errors import ExportError
from celery_dlq.message import as_text
from celery_dlq.storage.archive import parse_id

logger = logging.getLogger(__name__)

CHECKPOINT = "_checkpoint.json"


def checkpoint_name(shard: str | None) -> str:
    """The checkpoint file of a stream: the home stream's, or shard ``shard``'s."""
    return CHECKPOINT if shard is None else f"_checkpoint.shard-{shard}.json"


@dataclass
class Checkpoint:
    """``PATH/_checkpoint.json`` (``name``): how far the stream ``stream`` was exported."""

    stream: str
    last_id: str | None = None
    rows: int = 0
    added: int | None = None        # the stream's entries-added when last_id was its last id
    pending: str | None = None      # basename prefix of a flush being written
    updated_at: str | None = None
    name: str = CHECKPOINT          # the file under PATH: one per stream of a sharded store

    @classmethod
    def load(cls, fs: pafs.FileSystem, root: str, stream: str, name: str = CHECKPOINT) -> Checkpoint:
        raw = read_bytes(fs, f"{root}/{name}")
        if raw is None:
            return cls(stream, name=name)
        try:
            doc = json.loads(raw)
            checkpoint = cls(doc["stream"], doc.get("last_id"), int(doc.get("rows", 0)), doc.get("added"),
                             doc.get("pending"), doc.get("updated_at"), name)
        except (ValueError, KeyError, TypeError) as exc:
            raise ExportError(f"unreadable checkpoint {root}/{name}: {exc}") from None
        if checkpoint.stream != stream:
            raise ExportError(f"{root} holds the archive of stream {checkpoint.stream!r}, not {stream!r}: "
                              "export each key prefix to its own PATH")
        return checkpoint

    def save(self, fs: pafs.FileSystem, root: str) -> None:
        self.updated_at = datetime.now(timezone.utc).isoformat()
        doc = {"version": 1, "stream": self.stream, "last_id": self.last_id, "rows": self.rows,
               "added": self.added, "pending": self.pending, "updated_at": self.updated_at}
        write_bytes(fs, f"{root}/{self.name}", json.dumps(doc, indent=1).encode("utf-8"))


def delete_pending(fs: pafs.FileSystem, base: str, prefix: str) -> int:
    """Delete the files of a flush that died before its checkpoint (their rows come again)."""
    if fs.get_file_info(base).type == pafs.FileType.NotFound:
        return 0
    doomed = [info.path for info in fs.get_file_info(pafs.FileSelector(base, recursive=True))
              if info.type == pafs.FileType.File and info.base_name.startswith(prefix)]
    for path in doomed:
        fs.delete_file(path)
    if doomed:
        logger.warning("celery-dlq export: removed %d file(s) of an interrupted export", len(doomed))
    return len(doomed)


@dataclass(frozen=True)
class StreamState:
    """The stream at one instant: last id, length, first id, and entries ever added (None: unknown)."""

    last_id: str
    length: int
    first_id: str | None
    added: int | None

    @classmethod
    def of(cls, info: Mapping[str, Any] | None) -> StreamState | None:
        """The state a stream's ``XINFO STREAM`` reply gives (``EventLog.info``), or None if there is no stream."""
        if info is None:
            return None
        first = info.get("first-entry")
        return cls(last_id=as_text(info["last-generated-id"]), length=int(info["length"]),
                   first_id=as_text(first[0]) if first else None,
                   added=int(info["entries-added"]) if info.get("entries-added") is not None else None)

    def lost_after(self, checkpoint: Checkpoint) -> int | None:
        """Events added after the checkpoint that the stream no longer holds; None: cannot tell."""
        if self.added is None:
            return None
        if checkpoint.last_id is None:
            return self.added - self.length          # trimmed before the first export
        if self.first_id is not None and parse_id(self.first_id) <= parse_id(checkpoint.last_id):
            return 0                                  # the stream still reaches back to the checkpoint
        if checkpoint.added is None:
            return None
        return max(0, self.added - checkpoint.added - self.length)
