"""The operator's view of one app: its DLQs, parked retries and counters (what ``celery dlq`` runs).

Small objects addressed by name and id, as Sidekiq's ``DeadSet``/``RetrySet``:
:class:`Operator` (one app) finds its DLQs and gives
:class:`~celery_dlq.ops.queue.DeadLetterQueue` (one DLQ: list, show,
replay, purge) and :class:`~celery_dlq.ops.parked.ParkedRetries` (the delayed
store: list, redeliver now, delete). Only a Redis broker is supported.

Building an operator reads settings and connects to Redis; it never
installs worker bootsteps, so a CLI process is not a worker.
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kombu.serialization import prepare_accept_content

from celery_dlq.errors import UnknownQueue
from celery_dlq.ops.groups import GroupReport, read_groups
from celery_dlq.ops.letters import DeadLetter
from celery_dlq.ops.parked import ParkedRetries
from celery_dlq.ops.queue import DeadLetterQueue
from celery_dlq.policy import RedeliveryPolicy
from celery_dlq.settings import DLQSettings
from celery_dlq.storage import trends
from celery_dlq.storage.chords import ChordLedger
from celery_dlq.storage.client import broker_client, connect
from celery_dlq.storage.keys import QueueLists
from celery_dlq.storage.scripts import Scripts
from celery_dlq.storage.shards import ShardedStore, shards_of


@dataclass(frozen=True)
class QueueInfo:
    """One DLQ (``name``; None for a queue whose dead letters are dropped) and its queue."""

    name: str | None
    queue: str | None
    dead_letters: int
    parked: int

    def as_dict(self) -> dict:
        return {"name": self.name, "queue": self.queue, "dead_letters": self.dead_letters, "parked": self.parked}


class Operator:
    """The operator's view of one app: its DLQs, parked retries and counters.

    ``broker`` (the broker's Redis) and ``client`` (``dlq_redis_url``) may be
    given, as tests do; by default they are connected on first use, so the
    parked-retry half works even when the broker is not Redis.
    """

    def __init__(self, app: Any, *, broker: Any = None, client: Any = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.app, self.clock, self._broker, self._scripts = app, clock, broker, None
        self.settings = DLQSettings.from_conf(app.conf)
        self.lists = QueueLists.of(app.conf.broker_transport_options)
        self.client = client if client is not None else connect(self.settings.redis_url, self.settings.redis_cluster)
        #: Every shard of the store (``dlq_store_shards``); ``keys``/``archive`` are the home set's,
        #: where what the operator does (replays, purges) is counted and archived.
        self.store = ShardedStore(self.client, shards_of(self.settings),
                                  events_max_length=self.settings.events_max_length, clock=clock)
        self.keys = self.store.home.keys
        self.archive = self.store.home.archive
        self.parked = ParkedRetries(self.store)
        #: Dead-lettered chord members and the chords waiting for them (docs/workflows.md).
        self.chords = ChordLedger(self.client, self.keys)
        self.accept = frozenset(prepare_accept_content(app.conf.accept_content))

    @property
    def broker(self) -> Any:
        """The broker's Redis, where DLQs are lists; :class:`BrokerNotSupported` on another broker."""
        if self._broker is None:
            self._broker = broker_client(self.app.conf, self.client, self.settings.redis_url)
        return self._broker

    @property
    def scripts(self) -> Scripts:
        if self._scripts is None:
            self._scripts = Scripts(self.broker)
        return self._scripts

    def list_keys(self, name: str) -> list[str]:
        """The Redis lists of ``name``: a DLQ's priority sub-lists, or a quarantine's one list."""
        queue = quarantined_queue(name)
        return [self.keys.quarantine(queue)] if queue is not None else self.lists.keys(name)

    def depth(self, name: str) -> int:
        """Dead letters in ``name``, every priority sub-list counted."""
        pipe = self.broker.pipeline(transaction=False)
        for key in self.list_keys(name):
            pipe.llen(key)
        return sum(pipe.execute())

    def quarantines(self) -> dict[str, str]:
        """``quarantine:<queue>`` -> queue, for every non-empty quarantine list (SCAN)."""
        found = {}
        prefix = self.keys.quarantine("")
        for key in self.broker.scan_iter(match=_glob(prefix) + "*", count=1000, _type="list"):
            queue = key.decode("utf-8", "replace")[len(prefix):]
            found[QUARANTINE + queue] = queue
        return found

    def dlq_of(self, queue: str) -> str | None:
        """The DLQ of ``queue`` under its queue-level policy; None when dead letters are dropped."""
        return self.settings.policy_for("", queue).dead_letter_queue(queue)

    def queue(self, name: str) -> DeadLetterQueue:
        """The DLQ ``name``, or the DLQ of queue ``name``; :class:`UnknownQueue` if neither exists.

        A name counts when it is configured, or shaped like a DLQ and present
        in Redis: never a live queue, and no SCAN unless it is unknown.
        """
        if quarantined_queue(name) is not None:
            if self.depth(name):
                return DeadLetterQueue(self, name)
            raise UnknownQueue(f"{name!r} is empty: nothing was quarantined from that queue")
        shapes, configured = self._configured(self.parked.store.counts_by_queue())
        for candidate in (name, self.dlq_of(name)):
            if candidate in configured or (_shaped(candidate, shapes) and self.depth(candidate)):
                return DeadLetterQueue(self, candidate)
        known = self.known()
        raise UnknownQueue(f"unknown dead-letter queue {name!r}"
                           + (f" (known: {', '.join(sorted(known))})" if known else " (there are none)"))

    def queues(self) -> list[QueueInfo]:
        """Every DLQ found or configured, with its depth and the parked retries of its queues."""
        by_queue = self.parked.store.counts_by_queue()
        parked = Counter()
        for queue, n in by_queue.items():
            parked[self.dlq_of(queue)] += n
        rows = [QueueInfo(name, origin, self.depth(name), parked[name])
                for name, origin in sorted(self.known(by_queue).items())]
        rows += [QueueInfo(None, queue, 0, n) for queue, n in sorted(by_queue.items()) if self.dlq_of(queue) is None]
        rows += [QueueInfo(name, queue, self.depth(name), 0) for name, queue in sorted(self.quarantines().items())]
        return rows

    def known(self, queues: Any = ()) -> dict[str, str | None]:
        """DLQ name -> its queue (None when shared), named in the configuration or found by SCAN."""
        shapes, known = self._configured(queues)
        for prefix, suffix in shapes:
            match = self.lists.global_keyprefix + _glob(prefix) + "*" + _glob(suffix)
            for key in self.broker.scan_iter(match=match, count=1000, _type="list"):
                name = self.lists.queue_of(key.decode("utf-8", "replace"))
                if _shaped(name, [(prefix, suffix)]):
                    known.setdefault(name, name[len(prefix):len(name) - len(suffix)])
        return known

    def _configured(self, queues: Any = ()) -> tuple[set[tuple[str, str]], dict[str, str | None]]:
        """DLQ shapes, and the DLQs named by policies or serving declared or parked-for queues."""
        shapes, known = self._dlq_shapes()
        for queue in [*self.app.amqp.queues, *queues]:
            dlq = self.dlq_of(queue)
            if dlq:
                known.setdefault(dlq, queue)
        return shapes, known

    def _dlq_shapes(self) -> tuple[set[tuple[str, str]], dict[str, str | None]]:
        """(prefix, suffix) pairs and named DLQs from every configured policy layer."""
        base = RedeliveryPolicy()
        layers = [self.settings.default_policy]
        layers += [fields for _, fields in self.settings.task_policies.items + self.settings.queue_policies.items]
        layers += [getattr(task, "redelivery_policy", None) or {} for task in list(self.app.tasks.values())]
        shapes, named = {(base.dead_letter_queue_prefix, base.dead_letter_queue_suffix)}, {}
        for fields in layers:
            fields = fields.as_fields() if isinstance(fields, RedeliveryPolicy) else fields
            if isinstance(fields.get("dead_letter"), str):
                named[fields["dead_letter"]] = None
            shapes.add((fields.get("dead_letter_queue_prefix", base.dead_letter_queue_prefix),
                        fields.get("dead_letter_queue_suffix", base.dead_letter_queue_suffix)))
        return {s for s in shapes if s[0] or s[1]}, named

    def groups(self, name: str | None = None, *, names: list[str] | None = None) -> GroupReport:
        """Failure groups of DLQ ``name`` (or the DLQ of queue ``name``), of the DLQs ``names``, or of every DLQ."""
        if names is None:
            names = [self.queue(name).name] if name else sorted(self.known())
        return read_groups(self, names)

    def trends(self) -> trends.Trends:
        """Dead-lettered, parked and redelivered per minute (last hour) and per hour (last week), every shard."""
        return trends.read(self.client, [shard.keys for shard in self.store.all], self.clock())

    def stats(self, rows: list[QueueInfo] | None = None) -> dict[str, int]:
        """The ``stats`` counters, plus what is parked and dead-lettered now (``rows``: :meth:`queues`, if read)."""
        counters = self.store.stats()
        counters["parked_now"] = self.parked.store.count()
        counters["dead_letters_now"] = sum(info.dead_letters for info in (self.queues() if rows is None else rows))
        return dict(sorted(counters.items()))

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
                keys = self.store.of(task_id).keys
                by_shard.setdefault(keys.base, []).extend((
                    keys.delivery_count(task_id), keys.delivery_count(f"{task_id}:{tag}"),
                    keys.audit(task_id, letter.delivery_count or 1)))
        return list(by_shard.values())

    def forget_keys(self, by_shard: list[list[str]]) -> None:
        """Delete :meth:`counter_keys`' keys in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for keys in by_shard:   # one DEL per shard: its keys share a hash tag, so one slot on a cluster
            for start in range(0, len(keys), 1000):
                pipe.delete(*keys[start:start + 1000])
        pipe.execute()

    def details(self, letter: DeadLetter) -> dict:
        """A letter's :meth:`~DeadLetter.as_dict`, its workflow with what the chord ledger knows.

        ``workflow["chord"]`` gains ``state`` (``waiting``: the chord waits for
        this letter's replay; ``failed``, ``continued``: settled by its rule;
        None: never held) and ``waiting`` (the chord's members in DLQs).
        """
        out = letter.as_dict()
        chord = (out.get("workflow") or {}).get("chord")
        if chord is not None and letter.task_id:
            chord["state"] = self.chords.state(letter.task_id)
            chord["waiting"] = self.chords.waiting(chord["group"]) if chord.get("group") else 0
        return out

    def count(self, stat: str, n: int) -> None:
        if n:
            self.client.hincrby(self.keys.stats, stat, n)


#: The operator's name of a queue's raw quarantine (``celery dlq list quarantine:orders``).
QUARANTINE = "quarantine:"


def quarantined_queue(name: str | None) -> str | None:
    """The queue whose quarantine ``name`` is, or None when it is not a quarantine's name."""
    return name[len(QUARANTINE):] if name and name.startswith(QUARANTINE) and len(name) > len(QUARANTINE) else None


def _shaped(name: str | None, shapes: Any) -> bool:
    """Whether ``name`` is ``prefix + queue + suffix`` for one of ``shapes``."""
    return bool(name) and any(name.startswith(p) and name.endswith(s) and len(name) > len(p) + len(s)
                              for p, s in shapes)


def _glob(text: str) -> str:
    """``text`` with Redis glob characters escaped, for SCAN MATCH."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
