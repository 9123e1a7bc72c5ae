"""One dead-letter queue as an operator works it: list, replay, purge.

Dead letters live on the broker, in the Redis lists kombu uses for the queue
``DLQ.<queue>`` (one per priority step, see :class:`celery_dlq.storage.keys.QueueLists`),
as kombu's JSON. They are read a page at a time from the oldest end
(:class:`celery_dlq.storage.lists.OldestFirst`), and each page is offered to
the selection (:mod:`celery_dlq.ops.letters`) once, so an
operation is one pass over the DLQ whatever it selects. A replay rewrites
each message and moves a page of them with one Lua script (for each: remove
this exact element from the DLQ, push the copy onto the target queue, take it
off its failure group's count), so a replay interrupted anywhere and run
again delivers every message once. A purge removes a page per script the
same way.
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kombu.utils.json import JSONEncoder

from celery_dlq import headers as H
from celery_dlq.errors import ForceRequired
from celery_dlq.message import delivery_tags
from celery_dlq.ops.groups import read_groups
from celery_dlq.ops.letters import DeadLetter, Filter, IdPass, Selector, one_pass
from celery_dlq.ops.removal import Removal
from celery_dlq.storage import totals
from celery_dlq.storage.chords import require_backend
from celery_dlq.storage.dlq import Batch, count
from celery_dlq.storage.events import EventType
from celery_dlq.storage.keys import Stat
from celery_dlq.storage.lists import OldestFirst

if TYPE_CHECKING:
    from celery_dlq.ops.backend import Backend

#: A replay's edit of each message it delivers: (letter, message) -> message.
Rewrite = Callable[[DeadLetter, dict], dict]
#: Dead letters read per LRANGE (and moved per pipeline).
PAGE = 500
#: kombu's ``json.dumps`` without building an encoder per call (the same encoder, the same text).
_dumps = JSONEncoder().encode


@dataclass
class Outcome:
    """What a replay or purge did; ``missing`` ones were gone (moved by someone else) when reached."""

    matched: int = 0
    done: int = 0
    missing: int = 0
    failed: list[str] = field(default_factory=list)
    targets: Counter = field(default_factory=Counter)
    dry_run: bool = False
    #: Task ids asked for (:class:`~celery_dlq.ops.letters.TaskIds`) that the pass did not find, in the order given.
    not_found: list[str] = field(default_factory=list)


class ReplayIntoItself(ValueError):
    """A replay whose target is the DLQ it reads: each moved letter would come round again, without end."""


def refuse_self_replay(name: str, to: str | None) -> None:
    """Raise :class:`ReplayIntoItself` when replaying DLQ ``name`` to ``to`` would never end (the one check)."""
    if to is not None and to == name:
        raise ReplayIntoItself(f"cannot replay {name} into itself (to={to})")


def _take(letters: list[DeadLetter], where: Selector | None, left: int | None) -> list[DeadLetter]:
    """The ``letters`` ``where`` selects, at most ``left``; none is offered to ``where`` past the limit.

    A pass's matcher (:func:`~celery_dlq.ops.letters.one_pass`) counts
    what it matched as taken, so it must not be asked about letters that
    the limit then leaves behind.
    """
    taken: list[DeadLetter] = []
    for letter in letters:
        if left is not None and len(taken) >= left:
            break
        if where is None or where.matches(letter):
            taken.append(letter)
    return taken


class DeadLetterQueue:
    """One DLQ (Sidekiq's ``DeadSet``): iterate, show, replay, purge.

    ``where`` is any :class:`~celery_dlq.ops.letters.Selector`: a
    :class:`~celery_dlq.ops.letters.Filter`, or
    :class:`~celery_dlq.ops.letters.TaskIds` for a set of task ids.
    """

    def __init__(self, operator: Backend, name: str) -> None:
        self.op, self.name = operator, name
        self.sleep: Callable[[float], None] = time.sleep
        self._edit: Rewrite | None = None
        self.monotonic: Callable[[], float] = time.monotonic

    def __repr__(self) -> str:
        return f"DeadLetterQueue({self.name!r})"

    def depth(self) -> int:
        return self.op.depth(self.name)

    def _pages(self, batch: int) -> OldestFirst:
        return self.op.dlqs.oldest_first(self.op.list_keys(self.name), batch)

    def _letters(self, key: str, raws: list[bytes], where: Selector | None, left: int | None) -> list[DeadLetter]:
        """The letters of a page ``where`` selects, at most ``left`` (:func:`_take`).

        A :class:`Filter` with a needle (:meth:`Filter.needle`: text each
        letter it selects holds, such as its group id) passes over the
        elements without it undecoded: a group's replay decodes its own letters only.
        """
        needle = where.needle() if isinstance(where, Filter) else None
        if needle is not None:
            encoded = needle.encode()
            raws = [raw for raw in raws if (encoded if isinstance(raw, bytes) else needle) in raw]
        return _take([DeadLetter.parse(self.name, key, raw, self.op.accept) for raw in raws], where, left)

    def _selected(self, pages: OldestFirst, where: Selector | None, limit: int | None) -> Iterator[list[DeadLetter]]:
        left = limit
        for key, raws in pages:
            letters = self._letters(key, raws, where, left)
            if left is not None:
                left -= len(letters)
            if letters:
                yield letters
            if left == 0:
                return

    def entries(self, where: Selector | None = None, limit: int | None = None,
                batch: int = PAGE) -> Iterator[DeadLetter]:
        """Matching dead letters, oldest first (priority 0 first), ``batch`` per round trip. Not a snapshot."""
        for letters in self._selected(self._pages(batch), one_pass(where), limit):
            yield from letters

    def count(self, where: Selector | None = None) -> int:
        """How many dead letters ``where`` selects now (what a confirmation states before a replay or purge).

        The whole DLQ: its depth. A :class:`Filter` on a failure group alone:
        the group's count from its index (exact, no pass). Else one pass.
        """
        if where is None:
            return self.depth()
        if isinstance(where, Filter) and where.group is not None and where == Filter(group=where.group):
            rows = read_groups(self.op, [self.name]).per_dlq.get(self.name, [])
            return next((row.count for row in rows if row.group_id == where.group), 0)
        return sum(1 for _ in self.entries(where))

    def get(self, task_id: str) -> DeadLetter | None:
        return next(self.entries(Filter(task_id=task_id), limit=1), None)

    def replay(self, where: Selector | None = None, *, to: str | None = None, limit: int | None = None,
               rate: float | None = None, dry_run: bool = False, edit: Rewrite | None = None,
               progress: Callable[[int], None] | None = None, batch: int = PAGE) -> Outcome:
        """Move matching dead letters back to their original queue (or ``to``), oldest first, in one pass.

        ``rate`` caps messages per second over the whole pass. Each message
        moves atomically (see ``lua/replay_batch.lua``); run it again after an
        interruption. ``edit`` rewrites each message delivered (``ops/edit.py``).
        """
        self._edit = edit
        if rate is not None and not rate > 0:
            raise ValueError(f"rate must be > 0 messages/s, got {rate!r}")
        refuse_self_replay(self.name, to)
        out, started = Outcome(dry_run=dry_run), self.monotonic()
        pages, matcher = self._pages(batch), one_pass(where)
        if rate is None and not dry_run:
            self._replay_overlapped(pages, matcher, limit, to, out, progress)
            return _not_found(out, matcher)
        for letters in self._selected(pages, matcher, limit):
            out.matched += len(letters)
            for chunk in ([[letter] for letter in letters] if rate else [letters]):
                if rate:
                    self.sleep(max(0.0, started + (out.done + out.missing) / rate - self.monotonic()))
                pages.removed += self._move(chunk, to, out)
                if progress:
                    progress(len(chunk))
        return _not_found(out, matcher)

    def _replay_overlapped(self, pages: OldestFirst, where: Selector | None, limit: int | None, to: str | None,
                           out: Outcome, progress: Callable[[int], None] | None) -> None:
        """The unthrottled pass: each batch's script runs (a thread) while the next page is decoded and planned.

        Redis runs one batch's ``replay_batch.lua`` while Python prepares the
        next. The thread only waits on that one call (everything it sends is
        built here; forgetting the counters before and recording after stay
        here): a thread with more round trips waited on the GIL at each, and
        was slower than no thread. Each page is read after the batch before
        last has moved and before the last one starts, so the list is as the
        page's offset from the old end assumes (``OldestFirst``); a batch moved
        off the list being read is then counted in ``pages.removed``.
        """
        left, pending = limit, None
        with ThreadPoolExecutor(1, thread_name_prefix="celery-dlq-replay") as writer:
            for key, raws in pages:
                writing = None
                if pending:
                    self.op.forget_keys(pending.counters)   # before its move starts
                    writing = writer.submit(self._run, pending)
                letters = self._letters(key, raws, where, left)
                out.matched += len(letters)
                batch = self._plan(letters, to, out)
                if writing and pending:
                    moved = writing.result()
                    self._record(pending, moved)
                    removed = self._account(pending, moved, out)
                    pages.removed += removed if pending.key == key else 0
                    if progress:
                        progress(pending.read)
                pending = batch if batch.letters else None
                if not batch.letters and letters and progress:
                    progress(len(letters))
                if left is not None:
                    left -= len(letters)
                    if left == 0:
                        break
            if pending:
                self._account(pending, self._write(pending), out)
                if progress:
                    progress(pending.read)

    def _move(self, letters: list[DeadLetter], to: str | None, out: Outcome) -> int:
        """Move ``letters``; returns how many left the list (moved here, or gone already)."""
        batch = self._plan(letters, to, out)
        if out.dry_run or not batch.letters:
            out.targets.update(batch.queues)
            return 0
        return self._account(batch, self._write(batch), out)

    def _plan(self, letters: list[DeadLetter], to: str | None, out: Outcome) -> _Batch:
        """The batch that moves each of ``letters`` with a target (each without one is in ``out.failed``). No Redis."""
        now, list_key = self.op.clock(), self.op.lists.key
        batch = _Batch(now=now, key=letters[0].key if letters else "", read=len(letters),
                       script=Batch(self.op.lists.groups(self.name)))
        for letter, tag in zip(letters, delivery_tags(len(letters))):
            target = letter.target(to) if letter.message and not letter.header(H.RAW) else None
            if target is None:
                why = ("not a kombu message" if not letter.message else
                       "a raw element that was not a message: nothing to replay (purge it when read)"
                       if letter.header(H.RAW) else "no x-dlq-original-queue header; use to=")
                out.failed.append(f"{letter.task_id or '<unknown id>'}: {why}")
                continue
            queue, exchange, routing_key = target
            batch.letters.append(letter)
            batch.queues.append(queue)
            batch.script.move(letter.key, list_key(queue, letter.properties.get("priority")), letter.raw,
                              _dumps(self._rewrite(letter, letter.replayed(exchange, routing_key, now, tag))),
                              letter.headers)
        if batch.letters and not out.dry_run:
            batch.counters = self.op.counter_keys(batch.letters)
            batch.entries = self.op.archive.replayed_entries(batch.letters, dlq=self.name, now=now)
        return batch

    def _rewrite(self, letter: DeadLetter, message: dict) -> dict:
        return message if self._edit is None else self._edit(letter, message)

    def _write(self, batch: _Batch) -> list[int]:
        """Move a planned batch, count and archive it; 1 (moved) or 0 (gone) per letter.

        The delivery counters go first (``Backend.forget``), so an interruption anywhere loses nothing.
        """
        self.op.forget_keys(batch.counters)
        moved = self._run(batch)
        self._record(batch, moved)
        return moved

    def _run(self, batch: _Batch) -> list[int]:
        """The batch's one ``replay_batch.lua``: each letter moved (1), or gone already (0). The writer thread's job."""
        return self.op.dlqs.replay(batch.script)

    def _record(self, batch: _Batch, moved: list[int]) -> None:
        """Count and archive what :meth:`_run` moved."""
        count(self.op.client, self.op.keys, Stat.REPLAYED, totals.Metric.REPLAYED, sum(moved), dlq=self.name)
        if batch.entries is not None:
            self.op.archive.append_entries([entry for entry, ok in zip(batch.entries, moved) if ok],
                                           EventType.REPLAYED)

    @staticmethod
    def _account(batch: _Batch, moved: list[int], out: Outcome) -> int:
        """``out`` updated with what :meth:`_write` did; returns how many left the list (moved, or gone already)."""
        for queue, ok in zip(batch.queues, moved):
            out.targets[queue] += 1 if ok else 0
        out.done += sum(moved)
        out.missing += len(batch.letters) - sum(moved)
        return len(batch.letters)

    def purge(self, where: Selector | None = None, *, force: bool = False, limit: int | None = None,
              progress: Callable[[int], None] | None = None, batch: int = PAGE) -> Outcome:
        """Delete matching dead letters for good, in one pass; without ``force=True`` nothing is deleted."""
        if not force:
            raise ForceRequired(f"purging {self.name} deletes dead letters for good: pass force=True")
        waiting = self.op.chords.waiting_in(self.name)
        if waiting:
            require_backend(self.op.app, f"purging {self.name} fails the chords of {waiting} letter(s) "
                                         "their chords wait for")
        removal = Removal(self.op.side, self.name)
        if where is None and limit is None and not self.op.archive.enabled and not waiting:
            # Nothing to archive: delete the lists whole. With the archive on,
            # each letter is read and removed (below) so its `purged` event is
            # written and a letter arriving meanwhile is never deleted unseen.
            out = Outcome()
            out.matched = out.done = removal.delete_all(self.op.list_keys(self.name))
        else:
            matcher = one_pass(where)
            out = _not_found(self._remove(removal, matcher, limit, progress, batch), matcher)
        removal.count()
        return out

    def _remove(self, removal: Removal, where: Selector | None, limit: int | None,
                progress: Callable[[int], None] | None, batch: int) -> Outcome:
        """Each selected dead letter removed by its exact value (:class:`~celery_dlq.ops.removal.Removal`)."""
        out, pages = Outcome(), self._pages(batch)
        for letters in self._selected(pages, where, limit):
            removed = sum(removal.remove(letters))
            out.matched += len(letters)
            out.done += removed
            out.missing += len(letters) - removed
            pages.removed += len(letters)
            if progress:
                progress(len(letters))
        return out


def _not_found(out: Outcome, matcher: Selector | None) -> Outcome:
    """``out`` with the task ids a :class:`TaskIds` pass did not find."""
    if isinstance(matcher, IdPass):
        out.not_found = matcher.missing
    return out


@dataclass
class _Batch:
    """One batch of a replay as :meth:`DeadLetterQueue._plan` prepares it: all :meth:`~DeadLetterQueue._write` sends.

    ``letters`` are those with a target, ``queues`` their targets;
    ``script`` the ``replay_batch.lua`` call; ``counters`` the keys
    ``Backend.forget`` deletes; ``entries`` their ``replayed`` events (None:
    no archive). ``key`` is the list they were read from, ``read`` how many
    letters of the page the batch stands for.
    """

    now: float
    key: str
    read: int
    script: Batch
    letters: list[DeadLetter] = field(default_factory=list)
    queues: list[str] = field(default_factory=list)
    counters: list[list[str]] = field(default_factory=list)
    entries: list[list[str]] | None = None

