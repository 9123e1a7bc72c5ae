"""The commands celery-dlq sends to Celery's Redis result backend: on the backend's own client, to a chord's
keys as :func:`celery_dlq.internals.celery_backend.chord_keys` names them (that module checks the names)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def keep_chord_keys(backend: Any, keys: Sequence[str]) -> None:
    """PERSIST a chord's ``keys`` on the Redis result ``backend`` (their expiry is set again when the chord moves
    on); nothing for no keys (another backend)."""
    if keys:
        pipe = backend.client.pipeline(transaction=False)
        for key in keys:
            pipe.persist(key)
        pipe.execute()


def chord_progress(backend: Any, keys: Sequence[str]) -> tuple[int | None, int | None]:
    """``(size, done)`` of a chord from its ``keys`` on the Redis result ``backend``; ``(None, None)`` for no keys
    (another backend) or once it moved on.

    The size is Celery's ``.s`` (plus ``.t``, what replaced members added),
    done is how many parts ``.j`` holds (a sorted set when
    ``result_chord_ordered``, else a list): three reads, whatever the chord's size.
    """
    if not keys:
        return None, None
    _, joined, diff, size, _ = keys
    client = backend.client
    pipe = client.pipeline(transaction=False)
    pipe.type(joined).get(diff).get(size)
    kind, added, total = pipe.execute()
    if total is None:
        return None, None
    kind = kind.decode() if isinstance(kind, bytes) else kind
    done = client.zcard(joined) if kind == "zset" else client.llen(joined) if kind == "list" else 0
    return int(total) + int(added or 0), int(done)
