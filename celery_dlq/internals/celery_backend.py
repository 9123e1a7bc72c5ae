"""Celery's Redis result backend: where a chord's progress lives, so a waiting chord's keys can be kept.

A chord whose member waits in a DLQ (rule ``wait``, docs/workflows.md) must
outlive ``result_expires``: every part return of its other members sets the
expiry of the chord's keys again. The key names (``<group key>`` and its
``.j``, ``.t``, ``.s``, ``.d`` suffixes) are private to
``RedisBackend.on_chord_part_return``; they are named here only, and checked.
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


def keep_chord_keys(backend: Any, group_id: str) -> None:
    """PERSIST a chord's keys on the Redis result backend (their expiry is set again when the chord moves on)."""
    keys = chord_keys(backend, group_id)
    if keys:
        pipe = backend.client.pipeline(transaction=False)
        for key in keys:
            pipe.persist(key)
        pipe.execute()


def chord_progress(backend: Any, group_id: str) -> tuple[int | None, int | None]:
    """``(size, done)`` of a chord on the Redis result backend; ``(None, None)`` elsewhere or once it moved on.

    The size is Celery's ``.s`` (plus ``.t``, what replaced members added),
    done is how many parts ``.j`` holds (a sorted set when
    ``result_chord_ordered``, else a list): three reads, whatever the chord's size.
    """
    keys = chord_keys(backend, group_id)
    if not keys:
        return None, None
    _, joined, diff, size, _ = keys
    pipe = backend.client.pipeline(transaction=False)
    pipe.type(joined).get(diff).get(size)
    kind, added, total = pipe.execute()
    if total is None:
        return None, None
    kind = kind.decode() if isinstance(kind, bytes) else kind
    done = (backend.client.zcard(joined) if kind == "zset" else backend.client.llen(joined) if kind == "list"
            else 0)
    return int(total) + int(added or 0), int(done)
