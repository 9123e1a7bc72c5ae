"""One screenful of a DLQ, read from either end of its lists: what the web dashboard shows.

A DLQ of 100,000 dead letters is never read whole for a page. Its lists
(kombu's priority sub-lists, in :meth:`Operator.list_keys` order) are taken
as one sequence, oldest first (the order of :meth:`DeadLetterQueue.entries`)
or its exact reverse, newest first. A page starts at a position in that
sequence and reads ``LRANGE`` batches from there: without a selection one
``LRANGE`` of exactly the page, with one at most ``scan`` dead letters, so a
filter that matches rarely costs a bounded amount per page and the next page
carries on from where this one stopped (``next_start``).

Positions are counted from the end the page reads from, so dead letters
pushed meanwhile never shift an oldest-first page; a newest-first page
shifts by what was pushed since (as Sidekiq's Dead tab does).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from celery_dlq.ops.letters import DeadLetter, Selector
from celery_dlq.redis.lists import tail_range

if TYPE_CHECKING:
    from celery_dlq.ops.queue import DeadLetterQueue

#: Dead letters read per LRANGE while a selection is applied.
BATCH = 500


@dataclass(frozen=True)
class Window:
    """Dead letters shown, with the position of each, and where the next page starts (None: at the end)."""

    letters: list[tuple[int, DeadLetter]]
    start: int
    next_start: int | None
    total: int
    scanned: int


def _segments(lengths: list[int], newest_first: bool) -> list[tuple[int, int, bool]]:
    """``(list index, length, from_head)`` in reading order: the exact reverse for newest first."""
    order = list(enumerate(lengths))
    return [(n, length, newest_first) for n, length in (reversed(order) if newest_first else order)]


def _locate(segments: list[tuple[int, int, bool]], position: int) -> tuple[int, int] | None:
    """``(segment index, offset in it)`` of a position in the whole sequence; None past the end."""
    for s, (_, length, _) in enumerate(segments):
        if position < length:
            return s, position
        position -= length
    return None


def read_window(dead: DeadLetterQueue, start: int = 0, count: int = 50, *, newest_first: bool = False,
                where: Selector | None = None, scan: int = 10_000) -> Window:
    """``count`` dead letters of ``dead`` that ``where`` selects, from ``start``, reading at most ``scan``."""
    if start < 0 or count < 1:
        raise ValueError(f"a page starts at 0 or later and shows at least 1 (got start={start}, count={count})")
    broker, keys = dead.op.broker, dead.op.list_keys(dead.name)
    pipe = broker.pipeline(transaction=False)
    for key in keys:
        pipe.llen(key)
    segments = _segments(pipe.execute(), newest_first)
    total = sum(length for _, length, _ in segments)
    shown: list[tuple[int, DeadLetter]] = []
    position, scanned = start, 0
    while len(shown) < count and position < total and (where is None or scanned < scan):
        located = _locate(segments, position)
        if located is None:
            break
        s, offset = located
        index, length, from_head = segments[s]
        batch = min(count - len(shown) if where is None else min(BATCH, scan - scanned), length - offset)
        bounds = (offset, offset + batch - 1) if from_head else tail_range(offset, batch)
        raws = broker.lrange(keys[index], *bounds)
        if not raws:  # the list shrank under us: nothing more to read here
            break
        if not from_head:
            raws = raws[::-1]
        for raw in raws:
            letter = DeadLetter.parse(dead.name, keys[index], raw, dead.op.accept)
            position, scanned = position + 1, scanned + 1
            if where is None or where.matches(letter):
                shown.append((position - 1, letter))
                if len(shown) == count:
                    break
    return Window(shown, start, position if position < total else None, total, scanned)


def letter_at(dead: DeadLetterQueue, position: int, task_id: str, *, newest_first: bool = False) -> DeadLetter | None:
    """The dead letter at ``position`` if it is ``task_id``'s, else the oldest of ``task_id`` (a full read)."""
    window = read_window(dead, position, 1, newest_first=newest_first) if position >= 0 else None
    if window and window.letters and window.letters[0][1].task_id == task_id:
        return window.letters[0][1]
    return dead.get(task_id)
