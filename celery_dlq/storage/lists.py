"""Reading kombu's queue lists from the old end, a page at a time: what the operator tools and retention share;
and pushing an element onto one as kombu's publish would (:func:`push_element`).

kombu's Redis transport pushes new messages on the left (``LPUSH``) and
consumers pop from the right, so the oldest message of a list is at index
-1. Pages are counted from that end, so messages pushed meanwhile never
shift them; a reader that removes messages says how many (``removed``) and
the next page is read as if they were still there.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def tail_range(skip: int, batch: int) -> tuple[int, int]:
    """``LRANGE`` bounds of the ``batch`` messages after the ``skip`` oldest ones."""
    return -(skip + batch), -(skip + 1)


class OldestFirst:
    """Oldest-first pages of lists being changed: add to ``removed`` what you took from the last page.

    Iterating yields ``(key, messages)``, each page oldest first, list by
    list in the order given. One ``LRANGE`` per page.
    """

    def __init__(self, client: Any, keys: list[str], batch: int) -> None:
        self.client, self.keys, self.batch, self.removed = client, keys, batch, 0

    def __iter__(self) -> Iterator[tuple[str, list[bytes]]]:
        for key in self.keys:
            seen = self.removed = 0
            while True:
                raw = self.client.lrange(key, *tail_range(seen - self.removed, self.batch))
                if not raw:
                    break
                seen += len(raw)
                yield key, raw[::-1]
                if len(raw) < self.batch:
                    break


def oldest_pages(client: Any, keys: list[str], batch: int) -> dict[str, tuple[int, list[bytes]]]:
    """Each list's length and its ``batch`` oldest messages (oldest first), in one round trip."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.llen(key)
        pipe.lrange(key, *tail_range(0, batch))
    replies = pipe.execute()
    return {key: (replies[2 * n], replies[2 * n + 1][::-1]) for n, key in enumerate(keys)}


def push_element(client: Any, key: str, element: bytes) -> None:
    """Push a kombu list element (a parked retry in the direct format) onto list ``key``, as kombu pushes."""
    client.lpush(key, element)
