"""A DLQ's failure-group index on the broker: the arguments its Lua scripts take, and reading it back.

Each DLQ has one HASH (:meth:`QueueLists.groups`) counting its dead letters
by failure group (:mod:`celery_dlq.fingerprint`). It is written only inside
the scripts that push or remove dead letters (``dead_letter``,
``replay_batch``, ``remove_letters``; the fields are described in
``lua/lib.lua``), so a count is exactly the number of the DLQ's letters that
carry that group id. Letters without one (raw elements a worker could not
decode, letters from before groups existed) are not counted: readers report
them as the DLQ's depth minus the counted ones.

Reading a DLQ's groups is one ``HGETALL`` whatever its depth: its size
grows with the number of groups (about 30 fields each), not of letters.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery_dlq import headers as H
from celery_dlq.fingerprint import normalise

#: Hours of arrivals each group keeps (the sparkline), one field per hour.
SPARK_HOURS = 24


@dataclass(frozen=True)
class GroupStats:
    """One failure group in one DLQ, as its index holds it."""

    group_id: str
    dlq: str
    count: int
    first: float | None
    last: float | None
    reasons: dict[str, int]
    #: Arrivals per hour, the oldest first, the last one the current hour (:data:`SPARK_HOURS` of them).
    arrivals: tuple[int, ...]
    task: str = ""
    exception_type: str = ""
    title: str = ""
    sample_task_id: str = ""
    sample_message: str = ""
    original_queue: str = ""

    def as_dict(self) -> dict:
        return {"group": self.group_id, "dlq": self.dlq, "count": self.count, "first_dead_lettered_at": self.first,
                "last_dead_lettered_at": self.last, "reasons": dict(self.reasons), "task_name": self.task,
                "exception_type": self.exception_type, "title": self.title, "sample_task_id": self.sample_task_id,
                "sample_message": self.sample_message, "original_queue": self.original_queue,
                "arrivals_per_hour": list(self.arrivals)}


def describe(headers: Mapping[str, Any], task_id: str | None) -> str:
    """The group's description the dead-letterer stores with each arrival (the latest one is the sample)."""
    message = str(headers.get(H.EXCEPTION_MESSAGE) or "")
    return json.dumps({"task": headers.get("task") or "", "type": headers.get(H.EXCEPTION_TYPE) or "",
                       "title": normalise(message), "sample": task_id or "", "message": message[:300],
                       "queue": headers.get(H.ORIGINAL_QUEUE) or ""}, separators=(",", ":"))


def membership(headers: Mapping[str, Any]) -> tuple[str, str]:
    """``(group id, reason)`` of a stored dead letter, as the removing scripts take them ('' when it has none)."""
    gid, reason = headers.get(H.GROUP), headers.get(H.REASON)
    return (gid if isinstance(gid, str) and is_group_id(gid) else "", reason if isinstance(reason, str) else "")


def is_group_id(value: Any) -> bool:
    """Whether ``value`` is a group id as :func:`~celery_dlq.fingerprint.group_id` makes them (16 hex digits)."""
    return isinstance(value, str) and len(value) == 16 and not value.strip(_HEX)


_HEX = "0123456789abcdef"


def hour_of(at: float) -> int:
    return int(at // 3600)


def parse(dlq: str, fields: Mapping[bytes, bytes], now: float) -> list[GroupStats]:
    """The groups of one DLQ from its index's ``HGETALL``, the largest first."""
    by_gid: dict[str, dict[str, Any]] = {}
    for raw_name, raw_value in fields.items():
        name, value = raw_name.decode("utf-8", "replace"), raw_value.decode("utf-8", "replace")
        kind, _, rest = name.partition(":")
        gid, _, tail = rest.partition(":")
        row = by_gid.setdefault(gid, {"reasons": {}, "hours": {}})
        if kind == "r":
            row["reasons"][tail] = _int(value)
        elif kind == "h":
            stamp, _, in_hour = value.partition(":")
            row["hours"][_int(stamp)] = _int(in_hour)
        elif kind in ("n", "first", "last", "m"):
            row[kind] = value
    now_hour = hour_of(now)
    groups = []
    for gid, row in by_gid.items():
        count = _int(row.get("n", "0"))
        if count <= 0:
            continue
        try:
            meta = json.loads(row.get("m") or "{}")
        except ValueError:
            meta = {}
        hours = row["hours"]
        arrivals = tuple(hours.get(h, 0) for h in range(now_hour - SPARK_HOURS + 1, now_hour + 1))
        groups.append(GroupStats(
            gid, dlq, count, _float(row.get("first")), _float(row.get("last")),
            {k: v for k, v in sorted(row["reasons"].items()) if v > 0}, arrivals,
            str(meta.get("task") or ""), str(meta.get("type") or ""), str(meta.get("title") or ""),
            str(meta.get("sample") or ""), str(meta.get("message") or ""), str(meta.get("queue") or "")))
    return sorted(groups, key=lambda g: (-g.count, g.task, g.group_id))


def read(client: Any, indexes: Mapping[str, str], now: float) -> dict[str, list[GroupStats]]:
    """DLQ name -> its groups, for each ``{dlq: index key}``, in one round trip."""
    pipe = client.pipeline(transaction=False)
    for key in indexes.values():
        pipe.hgetall(key)
    return {dlq: parse(dlq, fields, now) for dlq, fields in zip(indexes, pipe.execute())}


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return 0


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
