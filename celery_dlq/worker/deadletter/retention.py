"""Retention: a DLQ's length and age limits, applied as dead letters arrive.

A queue's policy may set ``dead_letter_max_length`` (messages) and
``dead_letter_ttl`` (seconds since ``x-dlq-dead-lettered-at``); both default
to none, so nothing is ever deleted unless asked (Sidekiq keeps 10,000 dead
jobs for 180 days). Trimming runs right after each dead letter is published,
in the worker that published it, so there is no sweeper to run or forget.

Oldest first: the right end of the DLQ's lists (kombu pushes on the left),
merged across priority sub-lists by dead-lettered time. They are removed by
the one path of removing letters, which a purge takes too
(:class:`~celery_dlq.ops.removal.Removal`): each by its exact value, so a
concurrent replay or purge of the same message makes one of them find it
gone, never both act on it; archived as ``trimmed``; a chord waiting for one
failed; counted (``stats`` hash, ``dead_letters_trimmed``; the exporter's
``trimmed_total{dlq}``). Every trimmed message is logged.
"""
from __future__ import annotations

import heapq
import logging
import time
from collections import Counter
from collections.abc import Iterator

from celery_dlq.ops.letters import DeadLetter
from celery_dlq.ops.removal import Removal
from celery_dlq.policy import RedeliveryPolicy
from celery_dlq.storage.factory import RedisSide

logger = logging.getLogger(__name__)

#: Tail messages read per sub-list and round trip.
PAGE = 200
#: At most this many messages are trimmed after one dead letter, so lowering a
#: limit on a huge DLQ does not stall the worker: the backlog goes over time.
MAX_PER_CALL = 1000


class Retention:
    """Trims DLQs per their policy; one per :class:`~celery_dlq.worker.deadletter.dead_letterer.DeadLetterer`.

    ``side`` is the app's Redis side (:func:`~celery_dlq.storage.factory.redis_side`):
    the DLQ lists on the broker, the ``stats`` hash and the archive in the store.
    """

    def __init__(self, side: RedisSide) -> None:
        self.side = side

    def after_dead_letter(self, dlq: str, policy: RedeliveryPolicy) -> int:
        """Apply ``policy``'s limits to ``dlq``; never raises (the dead letter is safe already)."""
        if policy.dead_letter_max_length is None and policy.dead_letter_ttl is None:
            return 0
        try:
            return self.trim(dlq, max_length=policy.dead_letter_max_length, ttl=policy.dead_letter_ttl)
        except Exception:
            logger.exception("celery-dlq: could not trim %s (max length %s, ttl %s s)",
                             dlq, policy.dead_letter_max_length, policy.dead_letter_ttl)
            return 0

    def trim(self, dlq: str, *, max_length: int | None = None, ttl: float | None = None,
             now: float | None = None) -> int:
        """Delete the oldest dead letters of ``dlq`` beyond ``max_length`` or older than ``ttl``."""
        cutoff = None if ttl is None else (time.time() if now is None else now) - ttl
        keys = self.side.lists.keys(dlq)
        removal = Removal(self.side, dlq, trim=True)
        while removal.done < MAX_PER_CALL:
            victims = self._victims(dlq, keys, max_length, cutoff, MAX_PER_CALL - removal.done)
            if not victims:
                break
            letters = [letter for letter, _ in victims]
            whys = [why for _, why in victims]
            for letter, why, removed in zip(letters, whys, removal.remove(letters, whys)):
                if removed:
                    self._log(dlq, letter, why)
        return removal.count()

    def _victims(self, dlq: str, keys: list[str], max_length: int | None, cutoff: float | None,
                 most: int) -> list[tuple[DeadLetter, str]]:
        """The oldest messages to trim now: ``(letter, why)``, from each sub-list's right end."""
        read = self.side.dlqs.oldest(keys, PAGE)
        lengths = {key: length for key, (length, _) in read.items()}
        pages = {key: page for key, (_, page) in read.items()}
        excess = max(0, sum(lengths.values()) - max_length) if max_length is not None else 0
        taken: Counter = Counter()
        victims: list[tuple[DeadLetter, str]] = []
        for at, letter in heapq.merge(*(_oldest_first(dlq, key, pages[key]) for key in keys), key=lambda v: v[0]):
            if len(victims) >= most:
                break
            if len(victims) < excess:
                why = "max_length"
            elif cutoff is not None and at < cutoff:
                why = "ttl"
            else:
                break
            victims.append((letter, why))
            taken[letter.key] += 1
            if taken[letter.key] == len(pages[letter.key]) < lengths[letter.key]:
                break  # this sub-list's next message is not read yet: read again
        return victims

    def _log(self, dlq: str, letter: DeadLetter, why: str) -> None:
        limit = "over its dead_letter_max_length" if why == "max_length" else "older than its dead_letter_ttl"
        logger.warning("celery-dlq: trimmed dead letter %s[%s] from %s: %s", letter.header("task"),
                       letter.header("id"), dlq, limit)


def _oldest_first(dlq: str, key: str, page: list[bytes]) -> Iterator[tuple[float, DeadLetter]]:
    """A page (oldest first) keyed by ``x-dlq-dead-lettered-at``; a message without one sorts oldest (0)."""
    for raw in page:
        letter = DeadLetter.parse(dlq, key, raw, frozenset())
        yield letter.dead_lettered_at or 0.0, letter
