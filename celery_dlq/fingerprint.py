"""Failure groups: which dead letters are "the same failure", as one pure function.

A group is a (task, exception type, exception message) with what varies from
one occurrence to the next normalised away: quoted values, UUIDs and other
ids, hex addresses, numbers. ``KeyError: 'user_42'`` and ``KeyError:
'user_7'`` raised by ``shop.charge`` are one group; the same ``KeyError`` in
``shop.refund`` is another (Sentry's fingerprint, without the stack).

The dead-letterer stamps the group id on each dead letter it writes
(``x-dlq-group``) and counts it in the DLQ's group index in the same Lua
script that pushes it; replay, purge and retention read the id back from the
letter they remove. So the id of a letter never changes once written, even
if this normalisation does in a later release. Pure; no Redis.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

from celery_dlq.headers import truncate

#: Only this much of an exception message is normalised and kept as the group's title.
TITLE_CHARS = 300

_RULES = (
    # quoted values: 'abc', "abc" (Python reprs of keys, names, paths)
    (re.compile(r"'(?:[^'\\\n]|\\.){0,200}'|\"(?:[^\"\\\n]|\\.){0,200}\""), "<str>"),
    # UUIDs, with or without dashes
    (re.compile(r"\b[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}\b"), "<id>"),
    # hex: 0x7f3a..., and long hex runs holding a digit (hashes, object ids)
    (re.compile(r"\b0x[0-9a-fA-F]+\b|\b(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{12,}\b"), "<hex>"),
    # numbers: 42, -3.5, 1e-3, 10,000, 10.0.0.5:6379 (before a unit too: 3.5s)
    (re.compile(r"(?<![\w.])[-+]?\d+(?:[.,:_]\d+)*(?:[eE][-+]?\d+)?"), "<n>"),
    # numbers glued to words: user_42, order-1001, #7
    (re.compile(r"(?<=[A-Za-z_\-#])\d+"), "<n>"),
)
_SPACE = re.compile(r"\s+")


def normalise(message: str | None) -> str:
    """``message`` with quoted values, ids, hex and numbers replaced by ``<str>``, ``<id>``, ``<hex>``, ``<n>``."""
    text = str(message or "")[:TITLE_CHARS * 4]
    for pattern, placeholder in _RULES:
        text = pattern.sub(placeholder, text)
    return _SPACE.sub(" ", text).strip()[:TITLE_CHARS]


def failure_group(task: str | None, failure: Mapping[str, str]) -> str:
    """The group of ``task``'s dead letter for ``failure``: its ``x-dlq-group`` header, as written on the letter."""
    return group_id(task, failure.get("type", ""), truncate(failure.get("message", "")))


def group_id(task: str | None, exception_type: str | None, message: str | None) -> str:
    """The group of a failure: 16 hex digits of SHA-1 over the task, the exception type and the normalised message."""
    key = "\0".join((task or "", exception_type or "", normalise(message)))
    return hashlib.sha1(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]
