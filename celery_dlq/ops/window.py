"""One screenful of a DLQ, read from either end of its lists: what the web dashboard shows.

A DLQ of 100,000 dead letters is never read whole for a page. Its lists
(kombu's priority sub-lists, in :meth:`Backend.list_keys <celery_dlq.ops.backend.Backend.list_keys>` order) are taken
as one sequence, oldest first (the order of :meth:`DeadLetterQueue.entries`)
or its exact reverse, newest first. A page starts at a position in that
sequence and reads ``LRANGE`` batches from there: without a selection one
``LRANGE`` of exactly the page, with one at most ``scan`` dead letters, so a
filter that matches rarely costs a bounded amount per page and the next page
carries on from where this one stopped (``next_start``).

Positions are counted from the end the page reads from, so dead letters
pushed meanwhile never shift an oldest-first page; a newest-first page
shifts by what was pushed since (as Sidekiq's Dead tab does).

A letter's link carries an *anchor* instead (``"<list>:<n>"``: the ``n``-th
from the old end of the DLQ's ``list``-th list), which new dead letters
(pushed at the other end) never shift. :func:`find_letter` looks there
first, then around it inside Redis (``lua/find_letter.lua``, a widening
window: letters replayed or trimmed from the old end shift it a little), and
only then through the whole DLQ, still inside Redis, returning candidates
rather than every letter.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from celery_dlq.ops.letters import DeadLetter, Filter, Selector, one_pass
from celery_dlq.storage.lists import tail_range

if TYPE_CHECKING:
    from celery_dlq.ops.queue import DeadLetterQueue

#: Dead letters read per LRANGE while a selection is applied.
BATCH = 500
#: Letters searched per find_letter.lua call when a filter has a needle (inside Redis: no decode per letter).
NEEDLE_BATCH = 2000
#: Letters searched per find_letter.lua call around an anchor, first; each further call twice as many.
SEARCH_FIRST = 256
#: At most this many letters searched per call (each call blocks Redis for its length).
SEARCH_MOST = 8192


@dataclass(frozen=True)
class Window:
    """Dead letters shown, with the position of each, and where the next page starts (None: at the end)."""

    letters: list[tuple[int, DeadLetter]]
    start: int
    next_start: int | None
    total: int
    scanned: int
    #: Each shown letter's anchor (``"<list>:<n from the old end>"``), in the order of ``letters``.
    anchors: tuple[str, ...] = ()


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
    dlqs, keys = dead.op.dlqs, dead.op.list_keys(dead.name)
    segments = _segments(dlqs.lengths(keys), newest_first)
    total = sum(length for _, length, _ in segments)
    shown: list[tuple[int, DeadLetter]] = []
    anchors: list[str] = []
    position, scanned = start, 0
    needle = where.needle() if isinstance(where, Filter) else None
    where = one_pass(where)
    while len(shown) < count and position < total and (where is None or scanned < scan):
        located = _locate(segments, position)
        if located is None:
            break
        s, offset = located
        index, length, from_head = segments[s]
        per_call = NEEDLE_BATCH if needle is not None else BATCH
        batch = min(count - len(shown) if where is None else min(per_call, scan - scanned), length - offset)
        bounds = (offset, offset + batch - 1) if from_head else tail_range(offset, batch)
        if needle is not None:   # only the letters holding the needle come back, with their offsets
            read = sorted(((at if from_head else -at - 1) - offset, raw)
                          for at, raw in dlqs.find(keys[index], needle, *bounds))
        else:
            raws = dlqs.read(keys[index], *bounds)
            if not raws:  # the list shrank under us: nothing more to read here
                break
            read = list(enumerate(raws if from_head else raws[::-1]))
        base = position
        position, scanned = base + batch, scanned + batch
        for n, raw in read:
            letter = DeadLetter.parse(dead.name, keys[index], raw, dead.op.accept)
            if where is None or where.matches(letter):
                shown.append((base + n, letter))
                from_tail = length - 1 - (offset + n) if from_head else offset + n
                anchors.append(f"{index}:{from_tail}")
                if len(shown) == count:
                    position = base + n + 1
                    break
    return Window(shown, start, position if position < total else None, total, scanned, tuple(anchors))


def letter_at(dead: DeadLetterQueue, position: int, task_id: str, *, newest_first: bool = False) -> DeadLetter | None:
    """The dead letter at ``position`` (a page position) if it is ``task_id``'s, else :func:`find_letter`'s."""
    window = read_window(dead, position, 1, newest_first=newest_first) if position >= 0 else None
    if window and window.letters and window.letters[0][1].task_id == task_id:
        return window.letters[0][1]
    # Stale (letters arrived or left since the link was made): search around where that position lies now.
    anchor = parse_anchor(window.anchors[0]) if window and window.anchors else None
    return find_letter(dead, task_id, anchor)


def parse_anchor(text: str | None) -> tuple[int, int] | None:
    """``"<list>:<n>"`` as a pair of integers; None when it is not one."""
    left, sep, right = (text or "").partition(":")
    if not (sep and left.isdigit() and right.isdigit()):
        return None
    return int(left), int(right)


def find_letter(dead: DeadLetterQueue, task_id: str, anchor: tuple[int, int] | None = None) -> DeadLetter | None:
    """``task_id``'s dead letter: at ``anchor`` or the nearest to it; without one, the oldest of that id.

    Searched inside Redis (``lua/find_letter.lua``: the letters whose text
    holds the id come back, each then decoded and checked), around the anchor
    in widening windows, then list by list from the old end.
    """
    keys = dead.op.list_keys(dead.name)
    if not task_id:
        return None
    if anchor is not None and 0 <= anchor[0] < len(keys):
        index, from_tail = anchor
        found = _search(dead, keys[index], task_id, -(from_tail + 1), around=True)
        if found is not None:
            return found
    for key in keys:  # the oldest first: what `dlq show` and a replay by id take
        found = _search(dead, key, task_id, -1, around=False)
        if found is not None:
            return found
    return None


def _search(dead: DeadLetterQueue, key: str, task_id: str, at: int, *, around: bool) -> DeadLetter | None:
    """Search list ``key`` from index ``at`` (negative: from the old end): outward when ``around``, else toward
    the new end; the candidate nearest ``at`` that really is ``task_id``'s."""
    dlqs = dead.op.dlqs
    length = dlqs.length(key)
    if not length:
        return None
    center = min(max(length + at if at < 0 else at, 0), length - 1)
    lo, hi, size = center, center, SEARCH_FIRST   # [lo, hi) searched so far
    if not around:  # from the old end (the highest index) toward the new end
        lo = hi = length
    while lo > 0 or (around and hi < length):
        ranges = []
        if around and hi < length:
            ranges.append((hi, min(length, hi + size) - 1))
            hi = min(length, hi + size)
        if lo > 0:
            ranges.append((max(0, lo - size), lo - 1))
            lo = max(0, lo - size)
        for first, last in ranges:
            parsed = [(at, DeadLetter.parse(dead.name, key, raw, dead.op.accept))
                      for at, raw in dlqs.find(key, task_id, first, last)]
            hits = [(at, letter) for at, letter in parsed if letter.task_id == task_id]
            if hits:  # around: the nearest to the anchor; else the oldest (the highest index)
                return (min(hits, key=lambda h: abs(h[0] - center)) if around else max(hits, key=lambda h: h[0]))[1]
        size = min(size * 2, SEARCH_MOST)
    return None
