"""Celery's Redis result backend: where a chord's progress lives, so a waiting chord's keys can be kept.

A chord whose member waits in a DLQ (rule ``wait``, docs/workflows.md) must
outlive ``result_expires``: every part return of its other members sets the
expiry of the chord's keys again. The key names (``<group key>`` and its
``.j``, ``.t``, ``.s``, ``.d`` suffixes) are private to
``RedisBackend.on_chord_part_return``; they are named here only, and checked
(:mod:`celery_dlq.storage.result_backend` sends the commands).
"""
from __future__ import annotations

import inspect
from typing import Any

from celery.backends.redis import RedisBackend

from celery_dlq.internals.base import METHOD, Feature, Internal, usable

_REDIS_BACKEND = "celery.backends.redis:RedisBackend"
#: The chord key suffixes of the Redis result backend (``.d`` from Celery 5.7; ``.c``, the claim, is left alone).
CHORD_SUFFIXES = ("", ".j", ".t", ".s", ".d")


def _suffixes_in_source() -> str | None:
    source = inspect.getsource(RedisBackend.on_chord_part_return)
    missing = [suffix for suffix in (".j", ".t", ".s") if f"'{suffix}'" not in source]
    return f"RedisBackend.on_chord_part_return no longer names the chord keys {missing}" if missing else None


CHORD_KEYS = Feature(
    name="chord keys",
    does="keeping a waiting chord's Redis result keys from expiring while its member is in a DLQ",
    fallback="a waiting chord's keys expire with result_expires: replay the member before then",
    internals=(
        Internal(_REDIS_BACKEND, "on_chord_part_return", METHOD, "records chord progress in the group's keys",
                 ("self", "request", "state", "result")),
        Internal(_REDIS_BACKEND, "get_key_for_group", METHOD, "names a group's keys", ("self", "group_id", "key")),
    ),
    behaves=_suffixes_in_source,
)


def chord_keys(backend: Any, group_id: str) -> list[str]:
    """The Redis result backend's keys of one chord; [] for another backend (or where they moved)."""
    if not isinstance(backend, RedisBackend) or not usable(CHORD_KEYS):
        return []
    return [backend.get_key_for_group(group_id, suffix) for suffix in CHORD_SUFFIXES]
