"""Shards of the store: which hash tag and key set each of ``dlq_store_shards`` shards uses, and a task's shard.

Pure and deterministic, so every process agrees on where a task's parked
entries, counters and archive events live (``storage/shards.py`` serves them).
"""
from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from zlib import crc32

from redis.crc import REDIS_CLUSTER_HASH_SLOTS as SLOTS
from redis.crc import key_slot

from celery_dlq.errors import ConfigurationError
from celery_dlq.storage.keys import Keys


@lru_cache(maxsize=4096)
def shard_tag(prefix: str, index: int, count: int) -> str:
    """The hash tag of shard ``index`` of ``count``: its slot lies in the ``index``-th of ``count`` equal slot ranges.

    ``<prefix>:<index>`` when its slot falls there, else ``<prefix>:<index>:<j>``
    with the smallest ``j`` whose does. A Redis Cluster whose masters own
    equal contiguous slot ranges (what ``redis-cli --cluster create`` makes)
    then holds the same number of shards on each master, where plain
    ``{prefix:i}`` tags would leave one of three masters without any of six
    shards one time in four. Pure and deterministic: every process agrees.
    """
    low, high = index * SLOTS // count, (index + 1) * SLOTS // count
    for j in range(64 * SLOTS):
        tag = f"{prefix}:{index}" if j == 0 else f"{prefix}:{index}:{j}"
        if low <= key_slot(tag.encode("utf-8")) < high:
            return tag
    raise ConfigurationError(f"no hash tag for shard {index} of {count}")  # unreachable for count <= SLOTS


def shard_index(task_id: str | None, shards: int) -> int:
    """The shard (0 .. ``shards`` - 1) of a task id: CRC-32 of its UTF-8, modulo the count (stable everywhere)."""
    return crc32((task_id or "").encode("utf-8", "surrogatepass")) % shards if shards > 1 else 0


#: At most one shard per 16 cluster slots: more would only cost the movers round trips.
MAX_SHARDS = 1024


class Shards:
    """The store's key sets: the home set ``{<prefix>}`` and, with ``count > 1``, ``{<prefix>:0}`` ... .

    Shard ``i``'s hash tag is ``<prefix>:<i>`` or, to spread the shards
    evenly over a cluster's slots, ``<prefix>:<i>:<j>`` (:func:`shard_tag`).
    ``count == 1`` is the unsharded layout, exactly the home set, so a
    deployment that never sets ``dlq_store_shards`` keeps its keys. With
    more, a task's entries, counters, audit markers and archive events go to
    the shard its id picks (:func:`shard_index`); readers read :attr:`all`,
    the home set included, where entries parked before sharding was turned
    on stay until the movers drain them.
    """

    def __init__(self, prefix: str = "celery_dlq", global_keyprefix: str = "", count: int = 1,
                 earlier: Iterable[str] = ()) -> None:
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_SHARDS:
            raise ConfigurationError(f"dlq_store_shards must be an integer from 1 to {MAX_SHARDS}, got {count!r}")
        self.prefix, self.global_keyprefix = prefix, global_keyprefix
        self.home = Keys(prefix, global_keyprefix)
        self.shards: tuple[Keys, ...] = (self.home,) if count == 1 else tuple(
            Keys(shard_tag(prefix, i, count), global_keyprefix) for i in range(count))
        current = {keys.prefix for keys in (self.home, *self.shards)}
        #: Shards of an earlier shard count (``Keys.layout``): read and drained, never written to.
        self.earlier: tuple[Keys, ...] = tuple(Keys(tag, global_keyprefix) for tag in sorted(set(earlier) - current))

    def __repr__(self) -> str:
        return f"Shards(home={self.home.base!r}, count={len(self.shards)}, earlier={len(self.earlier)})"

    def __len__(self) -> int:
        return len(self.shards)

    def with_earlier(self, tags: Iterable[str]) -> Shards:
        """These shards, plus the shards of ``tags`` (an earlier layout's) to read and drain.

        Only tags of this prefix (``<prefix>:...``, no braces) count: the
        layout set is data in Redis, and a stray member must not stop a reader.
        """
        ours = [tag for tag in tags if tag.startswith(self.prefix + ":") and not set(tag) & set("{}")]
        return Shards(self.prefix, self.global_keyprefix, len(self.shards), ours)

    @property
    def tags(self) -> list[str]:
        """The hash tags of this layout's shards, as :attr:`Keys.layout` records them (none when unsharded)."""
        return [keys.prefix for keys in self.shards] if len(self.shards) > 1 else []

    @property
    def all(self) -> tuple[Keys, ...]:
        """Every key set readers read: the home set first, the shards, then an earlier layout's shards."""
        current = self.shards if self.shards[0] is self.home else (self.home, *self.shards)
        return current + self.earlier

    def index(self, task_id: str | None) -> int:
        return shard_index(task_id, len(self.shards))

    def of(self, task_id: str | None) -> Keys:
        """The key set of ``task_id``'s entries, counters and events."""
        return self.shards[self.index(task_id)]
