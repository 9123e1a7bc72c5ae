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

import logging
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from celery.exceptions import ImproperlyConfigured

from celery_dlq.errors import BrokerNotSupported, UnknownQueue
from celery_dlq.ops.backend import QUARANTINE, Backend, quarantined_queue
from celery_dlq.ops.breakers import BreakerControls
from celery_dlq.ops.groups import GroupReport, read_groups
from celery_dlq.ops.letters import DeadLetter
from celery_dlq.ops.queue import DeadLetterQueue
from celery_dlq.ops.workflows import describe
from celery_dlq.policy import RedeliveryPolicy
from celery_dlq.settings import DLQSettings
from celery_dlq.storage import totals, trends
from celery_dlq.storage.client import broker_url, open_client
from celery_dlq.storage.sessions import SessionStore
from celery_dlq.storage.throttle import ThrottleStore

logger = logging.getLogger(__name__)

#: The trend series (``Operator.trends``), in the order pages show them.
TREND_KINDS = trends.KINDS
#: The exporter's counters: names, help texts and label names (``Operator.totals``).
Metric = totals.Metric

__all__ = ["QUARANTINE", "Metric", "Operator", "QueueInfo", "TREND_KINDS", "quarantined_queue"]


@dataclass(frozen=True)
class QueueInfo:
    """One DLQ (``name``; None for a queue whose dead letters are dropped) and its queue."""

    name: str | None
    queue: str | None
    dead_letters: int
    parked: int

    def as_dict(self) -> dict:
        return {"name": self.name, "queue": self.queue, "dead_letters": self.dead_letters, "parked": self.parked}


class Operator(Backend):
    """The operator's view of one app: its DLQs, parked retries and counters.

    ``broker`` (the broker's Redis) and ``client`` (``dlq_redis_url``) may be
    given, as tests do; by default they are connected on first use, so the
    parked-retry half works even when the broker is not Redis.
    """

    @classmethod
    def with_timeout(cls, app: Any, timeout: float, **kw: Any) -> Operator:
        """An operator whose clients give up after ``timeout`` seconds (connect, then each reply): the exporter's,
        so a hung Redis fails a scrape fast. On a broker that is not Redis it has no broker client."""
        settings = DLQSettings.from_conf(app.conf)

        def client(url: str, cluster: bool = False) -> Any:
            return open_client(url, cluster, socket_connect_timeout=timeout, socket_timeout=timeout)

        home = client(settings.redis_url, settings.redis_cluster)
        url = broker_url_of(app)
        broker = None if url is None else home if url == settings.redis_url else client(url)
        return cls(app, client=home, broker=broker, **kw)

    @cached_property
    def web_sessions(self) -> SessionStore:
        """The dashboard's sessions (``storage/sessions.py``), in the home key set of ``dlq_redis_url``."""
        return SessionStore(self.client, self.keys)

    @cached_property
    def login_failures(self) -> ThrottleStore:
        """The dashboard's failed-login counters (``storage/throttle.py``), shared by its processes."""
        return ThrottleStore(self.client, self.keys)

    @property
    def breakers(self) -> BreakerControls:
        """The circuit breakers: list, pause, resume (``ops/breakers.py``)."""
        return BreakerControls(self)

    def quarantines(self, *, max_age: float = 0.0) -> dict[str, str]:
        """``quarantine:<queue>`` -> queue, for every non-empty quarantine list (SCAN; ``max_age``: as
        :meth:`known`)."""
        return dict(self._recent_scan("quarantines", max_age, self._scan_quarantines))

    def _scan_quarantines(self) -> dict[str, str]:
        found = {}
        prefix = self.keys.quarantine("")
        for key in self.dlqs.scan(_glob(prefix) + "*"):
            queue = key[len(prefix):]
            found[QUARANTINE + queue] = queue
        return found

    def _recent_scan(self, what: Any, max_age: float, scan: Any) -> dict[str, str]:
        """``scan()``, or what it gave for ``what`` less than ``max_age`` seconds ago (``max_age`` 0: always scan)."""
        now, memo = self.clock(), self.__dict__.setdefault("_scans", {})
        last = memo.get(what)
        if max_age > 0 and last is not None and 0 <= now - last[0] < max_age:
            return last[1]
        found = scan()
        memo[what] = (now, found)
        return found

    def dlq_of(self, queue: str) -> str | None:
        """The DLQ of ``queue`` under its queue-level policy; None when dead letters are dropped."""
        return self.settings.policy_for("", queue).dead_letter_queue(queue)

    def queue(self, name: str, *, scan: bool = True) -> DeadLetterQueue:
        """The DLQ ``name``, or the DLQ of queue ``name``; :class:`UnknownQueue` if neither exists.

        A name counts when it is configured, or shaped like a DLQ and present
        in Redis: never a live queue, and no SCAN unless it is unknown (then
        the error lists the DLQs found, unless ``scan`` is False: the
        dashboard, where anyone who may read could otherwise make it SCAN
        the keyspace with a made-up name).
        """
        if quarantined_queue(name) is not None:
            if self.depth(name):
                return DeadLetterQueue(self, name)
            raise UnknownQueue(f"{name!r} is empty: nothing was quarantined from that queue")
        shapes, configured = self._configured(self.parked.sharded.counts_by_queue())
        for candidate in (name, self.dlq_of(name)):
            if candidate is None:
                continue
            if candidate in configured or (_shaped(candidate, shapes) and self.depth(candidate)):
                return DeadLetterQueue(self, candidate)
        if not scan:
            raise UnknownQueue(f"unknown dead-letter queue {name!r}")
        known = self.known()
        raise UnknownQueue(f"unknown dead-letter queue {name!r}"
                           + (f" (known: {', '.join(sorted(known))})" if known else " (there are none)"))

    def queues(self, *, max_age: float = 0.0) -> list[QueueInfo]:
        """Every DLQ found or configured, with its depth and the parked retries of its queues. ``max_age``: reuse
        the DLQs a SCAN found that many seconds ago (:meth:`known`)."""
        by_queue = self.parked.sharded.counts_by_queue()
        parked: Counter[str | None] = Counter()
        for queue, n in by_queue.items():
            parked[self.dlq_of(queue)] += n
        rows = [QueueInfo(name, origin, self.depth(name), parked[name])
                for name, origin in sorted(self.known(by_queue, max_age=max_age).items())]
        rows += [QueueInfo(None, queue, 0, n) for queue, n in sorted(by_queue.items()) if self.dlq_of(queue) is None]
        rows += [QueueInfo(name, queue, self.depth(name), 0)
                 for name, queue in sorted(self.quarantines(max_age=max_age).items())]
        return rows

    def known(self, queues: Any = (), *, max_age: float = 0.0) -> dict[str, str | None]:
        """DLQ name -> its queue (None when shared), named in the configuration or found by SCAN.

        ``max_age`` > 0: the DLQs the last SCAN found, when it ran less than that many seconds ago (the
        dashboard's overview, refreshed by every open page, scans the keyspace once per ``max_age``).
        """
        shapes, known = self._configured(queues)
        for name, queue in self._scanned(frozenset(shapes), max_age).items():
            known.setdefault(name, queue)
        return known

    def _scanned(self, shapes: frozenset[tuple[str, str]], max_age: float) -> dict[str, str]:
        """The lists shaped like a DLQ (``shapes``), by SCAN, or as the last SCAN found them within ``max_age``."""
        return self._recent_scan(shapes, max_age, lambda: self._scan_dlqs(shapes))

    def _scan_dlqs(self, shapes: frozenset[tuple[str, str]]) -> dict[str, str]:
        found: dict[str, str] = {}
        for prefix, suffix in sorted(shapes):
            match = self.lists.global_keyprefix + _glob(prefix) + "*" + _glob(suffix)
            for key in self.dlqs.scan(match):
                name = self.lists.queue_of(key)
                if _shaped(name, [(prefix, suffix)]):
                    found.setdefault(name, name[len(prefix):len(name) - len(suffix)])
        return found

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
        shapes = {(base.dead_letter_queue_prefix, base.dead_letter_queue_suffix)}
        named: dict[str, str | None] = {}
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
        return trends.read(self.client, [shard.keys for shard in self.sharded.all], self.clock())

    def stats(self, rows: list[QueueInfo] | None = None) -> dict[str, int]:
        """The ``stats`` counters, plus what is parked and dead-lettered now (``rows``: :meth:`queues`, if read)."""
        counters = self.sharded.stats()
        counters["parked_now"] = self.parked.sharded.count()
        counters["dead_letters_now"] = sum(info.dead_letters for info in (self.queues() if rows is None else rows))
        return dict(sorted(counters.items()))

    def totals(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], int]:
        """The exporter's counters (:data:`Metric`), every shard summed: ``(metric, labels) -> value``."""
        return totals.read(self.client, self.sharded.shards.all)

    def details(self, letter: DeadLetter) -> dict:
        """A letter's :meth:`~DeadLetter.as_dict`, its workflow with what the chord ledger and the result
        backend know (:func:`celery_dlq.ops.workflows.describe`).

        ``workflow["chord"]`` gains ``state`` (``waiting``: the chord waits for
        this letter's replay; ``failed``, ``continued``: settled by its rule;
        None: never held), ``waiting`` (the chord's members in DLQs), ``size``
        and ``done``; ``workflow["chain"]`` gains ``step``, ``steps`` and ``exact``.
        """
        out = letter.as_dict()
        if out.get("workflow"):
            try:
                backend = self.app.backend
            except (ImproperlyConfigured, ImportError) as exc:   # a result_backend this process cannot build
                logger.warning("celery-dlq: no result backend for the workflow of %s: %s", letter.task_id, exc)
                backend = None
            describe(out["workflow"], letter.headers, self.chords, backend, letter.task_id)
        return out


def broker_url_of(app: Any) -> str | None:
    """The broker's Redis URL; None when the broker is not Redis (its DLQs cannot be read)."""
    try:
        return broker_url(app.conf)
    except BrokerNotSupported:
        return None


def _shaped(name: str | None, shapes: Any) -> bool:
    """Whether ``name`` is ``prefix + queue + suffix`` for one of ``shapes``."""
    return name is not None and any(name.startswith(p) and name.endswith(s) and len(name) > len(p) + len(s)
                                    for p, s in shapes)


def _glob(text: str) -> str:
    """``text`` with Redis glob characters escaped, for SCAN MATCH."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
