"""Removing dead letters from a DLQ for good: the one path of an operator's purge and of retention's trim.

Each letter goes by its exact value (``lua/remove_letters.lua``, which also
takes it off its failure group's count), so a concurrent replay, purge or
trim of the same letter makes one of them find it gone, never both act on
it. What was removed is archived (``purged``, or ``trimmed`` with the limit
that trimmed it), a chord still waiting for one of them fails now, once
(:func:`~celery_dlq.storage.chords.fail_purged`), and the total is counted
once at the end (``stats`` and the exporter's ``purged_total`` /
``trimmed_total{dlq}``, one round trip). A letter that is no kombu message (a
raw element) has no event to write and no chord.
"""
from __future__ import annotations

from collections.abc import Sequence

from celery_dlq.ops.letters import DeadLetter
from celery_dlq.storage import dlq as lists
from celery_dlq.storage.chords import fail_purged
from celery_dlq.storage.factory import RedisSide
from celery_dlq.storage.keys import Stat
from celery_dlq.storage.totals import Metric


class Removal:
    """Letters removed from DLQ ``dlq``, a batch per :meth:`remove`, counted by :meth:`count`.

    ``trim`` (retention) archives ``trimmed`` events and counts
    ``dead_letters_trimmed``; else (a purge) ``purged`` and ``dead_letters_purged``.
    """

    def __init__(self, side: RedisSide, dlq: str, *, trim: bool = False) -> None:
        self.side, self.dlq, self.trim = side, dlq, trim
        #: Letters removed so far (by :meth:`remove` and :meth:`delete_all`).
        self.done = 0

    def remove(self, letters: Sequence[DeadLetter], whys: Sequence[str] = ()) -> list[int]:
        """Remove ``letters`` in one script, archive and settle the removed; 1 (removed) or 0 (gone) per letter.

        ``whys``: a trim's limit per letter (``max_length``, ``ttl``).
        """
        if not letters:
            return []
        batch = self.side.dlqs.batch(self.dlq)
        for letter in letters:
            batch.remove(letter.key, letter.raw, letter.headers)
        removed = [int(n) for n in self.side.dlqs.remove(batch)]
        self.done += sum(removed)
        gone: dict[str, list[DeadLetter]] = {}
        for n, (letter, ok) in enumerate(zip(letters, removed)):
            if ok and letter.message:
                gone.setdefault(whys[n] if self.trim else "", []).append(letter)
        for why, letters_gone in gone.items():
            if self.trim:   # the archive keeps what retention deletes
                self.side.archive.trimmed(letters_gone, dlq=self.dlq, why=why)
            else:
                self.side.archive.purged(letters_gone, dlq=self.dlq)
            members = [(letter.task_id, letter.task_name or "") for letter in letters_gone
                       if letter.task_id and letter.header("group")]
            if members:
                fail_purged(self.side.chords, self.side.app, members, dlq=self.dlq,
                            **({"why": f"dropped by retention ({why})"} if self.trim else {}))
        return removed

    def delete_all(self, keys: list[str]) -> int:
        """Delete the lists ``keys`` whole with the group index (nothing archived: only when the archive is off
        and no chord waits); how many letters they held."""
        n = self.side.dlqs.delete(self.dlq, keys)
        self.done += n
        return n

    def count(self) -> int:
        """Count what was removed, in one round trip; returns it."""
        stat, metric = (Stat.TRIMMED, Metric.TRIMMED) if self.trim else (Stat.PURGED, Metric.PURGED)
        lists.count(self.side.client, self.side.keys, stat, metric, self.done, dlq=self.dlq)
        return self.done
