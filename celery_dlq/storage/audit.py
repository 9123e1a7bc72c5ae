"""The audit trail of operator actions: a capped Redis stream (``Keys.operator_log``), and the archive.

Each action (replay, purge, edit, pause, resume, cancel, ...) is one entry whose one field ``record``
is the JSON :mod:`celery_dlq.ops.audit` builds (who, when, why, the selection, the counts). The
same record goes to the event archive as an ``operator_action`` event
(:func:`celery_dlq.storage.events.action_event`), so an export and the Spark report see operator
actions beside failures. Writing the trail never stops the action it records: an error is logged.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from celery_dlq.message import as_text
from celery_dlq.storage.archive import EventLog
from celery_dlq.storage.events import action_event
from celery_dlq.storage.keys import Keys

logger = logging.getLogger(__name__)

#: Entries the trail keeps (approximately: ``XADD MAXLEN ~``).
MAX_LENGTH = 10_000


class AuditTrail:
    """One app's trail: append a record (to the stream and the archive), read the newest back."""

    def __init__(self, client: Any, keys: Keys, archive: EventLog | None = None, max_length: int = MAX_LENGTH):
        self.client, self.key, self.archive, self.max_length = client, keys.operator_log, archive, max_length

    def append(self, record: Mapping[str, Any]) -> str | None:
        """Append ``record``; its stream id, or None when it could not be written (logged)."""
        text = json.dumps(record, sort_keys=True, default=str, ensure_ascii=False)
        try:
            entry_id = as_text(self.client.xadd(self.key, {"record": text}, maxlen=self.max_length,
                                                approximate=True))
        except Exception:
            logger.exception("celery-dlq: could not write the audit record of %s; carrying on",
                             record.get("action"))
            return None
        if self.archive is not None:
            self.archive.append([action_event(record, text)])
        return entry_id

    def read(self, count: int = 100, before: str | None = None) -> list[dict]:
        """The newest ``count`` records (before stream id ``before``, exclusive), newest first, each with its ``id``."""
        top = "+" if before is None else f"({before}"
        out = []
        for entry_id, fields in self.client.xrevrange(self.key, max=top, min="-", count=count):
            try:
                record = json.loads(as_text(fields.get(b"record", fields.get("record", b"{}"))))
            except ValueError:
                record = {}
            out.append({**(record if isinstance(record, dict) else {}), "id": as_text(entry_id)})
        return out
