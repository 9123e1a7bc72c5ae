"""The audit trail of operator actions: two capped Redis streams, and the archive.

Each action (replay, purge, edit, pause, resume, cancel, delete, revoke, ...) is one entry whose one
field ``record`` is the JSON :mod:`celery_dlq.ops.audit` builds (who, when, why, the selection, the
counts). Privileged actions (:func:`privileged`: purges, a purge's job, parked deletes, session
revokes, pauses and resumes) are also kept in a stream of their own
(:attr:`~celery_dlq.storage.keys.Keys.operator_log_privileged`) under the id the main stream
(:attr:`~celery_dlq.storage.keys.Keys.operator_log`, every record) gave them, capped apart, so a
flood of replays cannot evict the record of a purge; reading merges both, one entry per id, in the
main stream's order. The same record goes to the event archive as an
``operator_action`` event (:func:`celery_dlq.storage.events.action_event`), so an export and the
Spark report see operator actions beside failures.

Writing the trail fails closed: a record that cannot be written raises :class:`AuditNotWritten`
(its JSON logged at ERROR, so it is not lost), and the caller refuses or reports the action
(docs/operating.md).
"""
from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from redis.exceptions import RedisError

from celery_dlq.errors import DLQError
from celery_dlq.message import as_text
from celery_dlq.storage.archive import EventLog
from celery_dlq.storage.events import action_event
from celery_dlq.storage.keys import Keys

logger = logging.getLogger(__name__)

#: Entries each stream keeps (approximately: ``XADD MAXLEN ~``).
MAX_LENGTH = 10_000
#: Actions whose records go to the privileged stream (and any action on a purge's job).
PRIVILEGED = frozenset({"purge", "delete", "revoke", "pause", "resume"})


class AuditNotWritten(DLQError):
    """An audit record could not be written: the action it records must be refused, or reported as unaudited."""


def privileged(record: Mapping[str, Any]) -> bool:
    """Whether ``record`` belongs to the privileged stream."""
    return record.get("action") in PRIVILEGED or record.get("kind") == "purge"


def _order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms or 0), int(seq or 0)


class AuditTrail:
    """One app's trail: append a record (to its stream and the archive), read the newest of both streams back."""

    def __init__(self, client: Any, keys: Keys, archive: EventLog | None = None, max_length: int = MAX_LENGTH):
        self.client, self.archive, self.max_length = client, archive, max_length
        self.key, self.privileged_key = keys.operator_log, keys.operator_log_privileged

    def append(self, record: Mapping[str, Any]) -> str:
        """Append ``record``; its stream id. :class:`AuditNotWritten` when Redis refused it."""
        text = json.dumps(record, sort_keys=True, default=str, ensure_ascii=False)
        try:
            # Every record goes to the main stream, whose ids order them all; a privileged one also to its own
            # stream under the same id, where a flood of cheap actions cannot evict it.
            entry_id = as_text(self.client.xadd(self.key, {"record": text}, maxlen=self.max_length,
                                                approximate=True))
            if privileged(record):
                self.client.xadd(self.privileged_key, {"record": text}, id=entry_id, maxlen=self.max_length,
                                 approximate=True)
        except RedisError as exc:
            logger.error("celery-dlq: could not write the audit record %s: %s", text, exc)
            raise AuditNotWritten(f"the audit record of {record.get('action')} could not be written "
                                  f"({type(exc).__name__}: {exc})") from exc
        if self.archive is not None:
            self.archive.append([action_event(record, text)])
        return entry_id

    def read(self, count: int = 100, before: str | None = None) -> list[dict]:
        """The newest ``count`` records of both streams (before stream id ``before``, exclusive), newest first,
        each with its ``id``."""
        top = "+" if before is None else f"({before}"
        unique = {as_text(entry_id): fields for key in (self.key, self.privileged_key)
                  for entry_id, fields in self.client.xrevrange(key, max=top, min="-", count=count)}
        entries = sorted(unique.items(), key=lambda entry: _order(entry[0]), reverse=True)
        out = []
        for entry_id, fields in entries[:count]:
            try:
                record = json.loads(as_text(fields.get(b"record", fields.get("record", b"{}"))))
            except ValueError:
                record = {}
            out.append({**(record if isinstance(record, dict) else {}), "id": entry_id})
        return out
