"""Dead-letter queues on the broker: every command and script sent to a DLQ's lists (push, read, move, remove).

A DLQ is kombu's lists for its name (:class:`~celery_dlq.storage.keys.QueueLists`,
one per priority step) plus its failure-group index; a queue's quarantine is
one list (:meth:`Keys.quarantine <celery_dlq.storage.keys.Keys.quarantine>`).
Callers name the lists (``keys``, in the order they read them); each method
here is one operation and says its round trips. The batch scripts
(``replay_batch.lua``, ``remove_letters.lua``) take the group index first
and then each list once: :class:`Batch` builds those ``KEYS`` and the
``ARGV`` with them, with no Redis, so a replay can plan a batch while the
one before is being moved.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from celery_dlq import headers as H
from celery_dlq.storage import groups, totals
from celery_dlq.storage.keys import Keys, QueueLists
from celery_dlq.storage.lists import OldestFirst, oldest_pages


class Batch:
    """One call of a batch script on a DLQ: ``KEYS`` (its group index, then each list once) and ``ARGV``."""

    def __init__(self, index: str) -> None:
        self.keys = [index]
        self.args: list[Any] = []
        self._at: dict[str, int] = {}

    def index(self, key: str) -> int:
        """``key``'s place in ``KEYS`` (1-based, as Lua's), added on first use."""
        at = self._at.get(key)
        if at is None:
            self.keys.append(key)
            at = self._at[key] = len(self.keys)
        return at

    def move(self, key: str, target: str, raw: bytes, message: str, headers: Mapping[str, Any]) -> None:
        """``replay_batch.lua``: move ``raw`` from list ``key`` to list ``target`` as ``message``."""
        self.args += [self.index(key), self.index(target), raw, message, *groups.membership(headers)]

    def remove(self, key: str, raw: bytes, headers: Mapping[str, Any]) -> None:
        """``remove_letters.lua``: remove ``raw`` from list ``key``."""
        self.args += [self.index(key), raw, *groups.membership(headers)]


class DeadLetterLists:
    """The DLQs' lists on the broker's Redis (``client``, ``scripts`` on it), named by ``lists``: the worker
    pushes letters onto them (it names each list itself: no ``lists``), operators and retention read, move and
    remove them."""

    def __init__(self, client: Any, scripts: Any, lists: QueueLists | None = None) -> None:
        self.client, self.scripts, self.lists = client, scripts, lists

    def push(self, dlq_list: str, groups_key: str, element: bytes | str, headers: Mapping[str, Any],
             task_id: str | None) -> int:
        """``lua/dead_letter.lua``: push a dead letter (kombu's element) onto ``dlq_list`` and count it in the
        DLQ's failure groups (``groups_key``), in one step; its group, reason and time from its ``headers``.
        The list's length."""
        at = float(headers.get(H.DEAD_LETTERED_AT) or 0)
        gid, reason = groups.membership(headers)
        return int(self.scripts.run("dead_letter", [dlq_list, groups_key],
                                    [element, gid, reason, repr(at), groups.hour_of(at),
                                     groups.describe(headers, task_id)]))

    def reject_invalid(self, in_flight: Sequence[str], target: str, tag: str, letter: bytes) -> bool:
        """``lua/reject_invalid.lua``: a fetched element out of flight (``in_flight``: the consumer's hash) onto
        ``target`` as ``letter``; False when ``tag`` was no longer in flight."""
        return bool(self.scripts.run("reject_invalid", [*in_flight, target], [tag, letter]))

    def release_quarantine(self, quarantine: str, target: str, element: bytes, letter: bytes) -> bool:
        """``lua/release_quarantine.lua``: a raw ``element`` out of ``quarantine`` onto ``target`` as ``letter``;
        False when it was no longer there."""
        return bool(self.scripts.run("release_quarantine", [quarantine, target], [element, letter]))

    def _groups(self, dlq: str) -> str:
        """``dlq``'s failure-group index (an operator's lists know it; the worker names its keys itself)."""
        if self.lists is None:
            raise TypeError("these DeadLetterLists were made without the DLQs' list names")
        return self.lists.groups(dlq)

    def batch(self, dlq: str) -> Batch:
        """An empty batch of ``dlq`` (its group index first), to :meth:`replay` or :meth:`remove`."""
        return Batch(self._groups(dlq))

    def lengths(self, keys: list[str]) -> list[int]:
        """Each list's length, in one pipeline."""
        pipe = self.client.pipeline(transaction=False)
        for key in keys:
            pipe.llen(key)
        return [int(n) for n in pipe.execute()]

    def depths(self, lists: Mapping[str, list[str]]) -> dict[str, int]:
        """Name -> the summed length of its lists, for every name, in one pipeline."""
        lengths = iter(self.lengths([key for keys in lists.values() for key in keys]))
        return {name: sum(next(lengths) for _ in keys) for name, keys in lists.items()}

    def tails(self, lists: Mapping[str, list[str]]) -> dict[str, list[tuple[int, bytes | None]]]:
        """Name -> each of its lists' length and oldest element (``LLEN``, ``LINDEX -1``), in one pipeline."""
        pipe = self.client.pipeline(transaction=False)
        for keys in lists.values():
            for key in keys:
                pipe.llen(key)
                pipe.lindex(key, -1)   # kombu pushes on the left: the oldest is last
        replies = iter(pipe.execute())
        return {name: [(int(next(replies)), next(replies)) for _ in keys] for name, keys in lists.items()}

    def groups(self, dlqs: Iterable[str], now: float) -> dict[str, list[groups.GroupStats]]:
        """DLQ -> its failure groups from its index (:func:`celery_dlq.storage.groups.read`), in one pipeline."""
        return groups.read(self.client, {dlq: self._groups(dlq) for dlq in dlqs}, now)

    def length(self, key: str) -> int:
        return int(self.client.llen(key))

    def read(self, key: str, first: int, last: int) -> list[bytes]:
        """``LRANGE key first last``."""
        return self.client.lrange(key, first, last)

    def find(self, key: str, needle: str, first: int, last: int) -> list[tuple[int, bytes]]:
        """The elements of ``key[first..last]`` whose text holds ``needle``, with their index (``find_letter.lua``)."""
        found = self.scripts.run("find_letter", [key], [needle, first, last])
        return [(int(found[i]), found[i + 1]) for i in range(0, len(found), 2)]

    def oldest_first(self, keys: list[str], batch: int) -> OldestFirst:
        """Oldest-first pages of ``keys`` (:class:`~celery_dlq.storage.lists.OldestFirst`), one ``LRANGE`` each."""
        return OldestFirst(self.client, keys, batch)

    def oldest(self, keys: list[str], batch: int) -> dict[str, tuple[int, list[bytes]]]:
        """Each list's length and ``batch`` oldest elements, in one pipeline
        (:func:`~celery_dlq.storage.lists.oldest_pages`)."""
        return oldest_pages(self.client, keys, batch)

    def replay(self, batch: Batch) -> list[int]:
        """Run a replay batch (``replay_batch.lua``): 1 per letter moved, 0 per letter gone already."""
        return self.scripts.run("replay_batch", batch.keys, batch.args)

    def remove(self, batch: Batch) -> list[int]:
        """Run a removal batch (``remove_letters.lua``): 1 per letter removed, 0 per letter gone already."""
        return self.scripts.run("remove_letters", batch.keys, batch.args)

    def delete(self, dlq: str, keys: list[str]) -> int:
        """Delete the lists ``keys`` of ``dlq`` and its group index in one transaction; how many letters they held."""
        pipe = self.client.pipeline(transaction=True)
        for key in keys:
            pipe.llen(key)
        pipe.delete(*keys, self._groups(dlq))   # the groups go with their letters
        return sum(pipe.execute()[:-1])

    def scan(self, match: str) -> Iterator[str]:
        """The names of the lists ``match`` (a SCAN glob) matches, decoded."""
        for key in self.client.scan_iter(match=match, count=1000, _type="list"):
            yield key.decode("utf-8", "replace")


def forget(client: Any, by_shard: list[list[str]]) -> None:
    """Delete delivery counters and dead-letter audits (one list of keys per shard) in one round trip."""
    pipe = client.pipeline(transaction=False)
    for keys in by_shard:   # one DEL per shard: its keys share a hash tag, so one slot on a cluster
        for start in range(0, len(keys), 1000):
            pipe.delete(*keys[start:start + 1000])
    pipe.execute()


def count(client: Any, keys: Keys, stat: str, metric: str, n: int, **labels: Any) -> None:
    """Count ``n`` in the ``stats`` hash (``stat``) and the exporter's ``metric{labels}``: one round trip (none
    for 0)."""
    if not n:
        return
    pipe = client.pipeline(transaction=False)
    pipe.hincrby(keys.stats, stat, n)
    totals.incr(pipe, keys, metric, n, **labels)
    pipe.execute()
