"""The Redis side of one app as the operator reaches it: list keys, the store, the DLQs' lists, counters.

:class:`Backend` is what every part of :mod:`celery_dlq.ops` works through
(a DLQ's :class:`~celery_dlq.ops.queue.DeadLetterQueue`, its failure groups,
a page of it); :class:`~celery_dlq.ops.operator.Operator` adds finding DLQs
on top. Keeping the two apart keeps the imports of ``ops/`` one way:
``operator`` -> ``queue``/``groups`` -> ``backend``, never back.

Building one reads settings and makes its clients through
:func:`~celery_dlq.storage.factory.redis_side` (the worker's builder too);
every command it sends is sent by ``storage/`` (:mod:`celery_dlq.storage.dlq`
for the DLQs' lists). It never installs worker bootsteps, so a CLI process is
not a worker.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kombu.serialization import prepare_accept_content

from celery_dlq.message import decode_raw
from celery_dlq.ops.parked import ParkedRetries
from celery_dlq.settings import DLQSettings
from celery_dlq.storage.dlq import DeadLetterLists, forget
from celery_dlq.storage.factory import redis_side
from celery_dlq.storage.scripts import Scripts

if TYPE_CHECKING:
    from celery_dlq.ops.letters import DeadLetter

#: The operator's name of a queue's raw quarantine (``celery dlq list quarantine:orders``).
QUARANTINE = "quarantine:"


def quarantined_queue(name: str | None) -> str | None:
    """The queue whose quarantine ``name`` is, or None when it is not a quarantine's name."""
    return name[len(QUARANTINE):] if name and name.startswith(QUARANTINE) and len(name) > len(QUARANTINE) else None


@dataclass(frozen=True)
class Size:
    """A DLQ's dead letters now, and when its oldest one was dead-lettered (None: empty, or undated)."""

    dead_letters: int
    oldest_at: float | None

    def age(self, now: float) -> float | None:
        """Seconds since the oldest dead letter was dead-lettered; None when there is none dated."""
        return None if self.oldest_at is None else max(0.0, now - self.oldest_at)


class Backend:
    """One app's Redis as the operator uses it.

    ``broker`` (the broker's Redis) and ``client`` (``dlq_redis_url``) may be
    given, as tests do; by default they are connected on first use, so the
    parked-retry half works even when the broker is not Redis.
    """

    def __init__(self, app: Any, *, broker: Any = None, client: Any = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.app, self.clock = app, clock
        self.settings = DLQSettings.from_conf(app.conf)
        #: The app's Redis side (``storage/factory.py``: the worker's builder too).
        self.side = redis_side(app, self.settings, client=client, broker=broker, clock=clock)
        self.lists = self.side.lists
        self.client = self.side.client
        #: Every shard of the store (``dlq_store_shards``); ``keys``/``archive`` are the home set's,
        #: where what the operator does (replays, purges) is counted and archived.
        self.sharded = self.side.sharded
        self.keys = self.side.keys
        self.archive = self.side.archive
        self.parked = ParkedRetries(self.sharded)
        #: Dead-lettered chord members and the chords waiting for them (docs/workflows.md).
        self.chords = self.side.chords
        self.accept = frozenset(prepare_accept_content(app.conf.accept_content))

    @property
    def broker(self) -> Any:
        """The broker's Redis, where DLQs are lists; :class:`BrokerNotSupported` on another broker."""
        return self.side.broker

    @property
    def scripts(self) -> Scripts:
        return self.side.scripts

    @property
    def dlqs(self) -> DeadLetterLists:
        """The DLQs' lists on the broker: every command an operator sends them (``storage/dlq.py``)."""
        return self.side.dlqs

    def list_keys(self, name: str) -> list[str]:
        """The Redis lists of ``name``: a DLQ's priority sub-lists, or a quarantine's one list."""
        queue = quarantined_queue(name)
        return [self.keys.quarantine(queue)] if queue is not None else self.lists.keys(name)

    def depth(self, name: str) -> int:
        """Dead letters in ``name``, every priority sub-list counted (one pipeline)."""
        return sum(self.dlqs.lengths(self.list_keys(name)))

    def depths(self, names: Iterable[str]) -> dict[str, int]:
        """Each DLQ's depth, in one pipeline."""
        return self.dlqs.depths({name: self.list_keys(name) for name in names})

    def sizes(self, names: Iterable[str]) -> dict[str, Size]:
        """Each DLQ's depth and oldest dead letter, in one pipeline: ``LLEN`` and ``LINDEX -1`` of each sub-list.

        What the dashboard's overview and the exporter show; never O(depth).
        """
        out = {}
        for name, tails in self.dlqs.tails({name: self.list_keys(name) for name in names}).items():
            count, oldest = 0, None
            for length, tail in tails:
                count += length
                at = decode_raw(tail).dead_lettered_at if tail is not None else None
                if at is not None and (oldest is None or at < oldest):
                    oldest = at
            out[name] = Size(count, oldest)
        return out

    def forget(self, letters: list[DeadLetter]) -> None:
        """Delete the delivery counters and dead-letter audit of messages about to be replayed.

        Otherwise the replayed copy would start at the old count, and failing
        again at the same delivery it would meet a ``done`` audit and be
        acknowledged as "already dead-lettered": lost. Idempotent, and done
        before the move, so an interruption in between loses nothing.
        """
        self.forget_keys(self.counter_keys(letters))

    def counter_keys(self, letters: list[DeadLetter]) -> list[list[str]]:
        """What :meth:`forget` deletes for ``letters``, one list per shard (no Redis: a replay builds it ahead)."""
        by_shard: dict[str, list[str]] = {}
        for letter in letters:
            task_id, tag = letter.task_id, letter.properties.get("delivery_tag")
            if task_id:
                keys = self.sharded.of(task_id).keys
                by_shard.setdefault(keys.base, []).extend((
                    keys.delivery_count(task_id), keys.delivery_count(f"{task_id}:{tag}"),
                    keys.audit(task_id, letter.delivery_count or 1)))
        return list(by_shard.values())

    def forget_keys(self, by_shard: list[list[str]]) -> None:
        """Delete :meth:`counter_keys`' keys in one round trip."""
        forget(self.client, by_shard)
