"""Prometheus metrics of an app's DLQs, parked retries and counters, read from Redis at scrape time.

:class:`DLQCollector` is a prometheus-client collector: ``celery dlq
exporter`` serves it (:func:`serve`), and an app that already serves
``/metrics`` (Django, FastAPI, Flower-style) registers it::

    from prometheus_client import REGISTRY
    from celery_dlq.exporter import DLQCollector
    REGISTRY.register(DLQCollector(app))

Nothing is kept in the exporter: every scrape reads Redis, so one exporter
covers every worker, and its cost is a handful of round trips, O(number of
DLQs and label sets), never O(DLQ depth):

* ``celery_dlq_dead_letters{dlq,queue}``: ``LLEN`` of each priority
  sub-list (``queue`` is "" for a DLQ shared by several queues);
* ``celery_dlq_oldest_dead_letter_age_seconds{dlq}``: ``LINDEX key -1`` (the
  oldest element) of each sub-list and its ``x-dlq-dead-lettered-at``;
  absent while the DLQ holds no dated dead letter;
* ``celery_dlq_parked{queue}``: the store's per-queue count (one ``HGETALL``);
* ``celery_dlq_overdue_parked{queue}``: parked or leased entries more than
  ``overdue_after`` seconds (default 5 mover intervals) past due, which only
  happens when no mover is moving them. ``ZCOUNT`` gives the exact total; the
  store keeps no per-queue index by time, so only :data:`OVERDUE_SAMPLE`
  overdue entries (parked ones first, longest overdue first) are attributed
  to their queue (``ZRANGEBYSCORE ... LIMIT``, ``HMGET``) and the rest are reported with
  ``queue=""``: ``sum(celery_dlq_overdue_parked)`` is always exact, and each
  queue's value is exact while at most that many entries are overdue;
* the ``_total`` counters (``Operator.totals``: one ``HGETALL`` per shard);
* ``celery_dlq_scrape_duration_seconds``: what reading all that took;
* ``celery_dlq_redis_up``: 0 when Redis could not be read. The scrape then
  yields that gauge alone; the collector never raises.

Served in OpenMetrics, the counter ``celery_dlq_parked_total`` and the gauge
``celery_dlq_parked`` would be two families of one name (OpenMetrics drops a
counter family's ``_total``): :func:`serve` always answers in Prometheus'
classic text format, and an app serving the collector should too
(:func:`classic_text` wraps prometheus-client's WSGI app so).

DLQs are found as ``celery dlq queues`` finds them: configured ones at every
scrape, others by a SCAN of the keyspace, which is O(keys in Redis) (0.3 s
at 200,000 keys) and so runs at most once a minute (``discover_every``) and,
after the first scrape, in a thread of its own (:class:`Discovery`): a
scrape never waits for it. A DLQ found once is counted at every scrape after.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import redis
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from celery_dlq.ops import Operator
from celery_dlq.ops.breakers import BREAKER_STATES
from celery_dlq.ops.operator import Metric as Totals
from celery_dlq.ops.operator import broker_url_of
from celery_dlq.urls import sanitize

logger = logging.getLogger(__name__)

PREFIX = "celery_dlq_"
#: A parked entry this many mover intervals past due means no mover is moving it.
OVERDUE_INTERVALS = 5
#: At most this many overdue entries are attributed to their queue per scrape.
OVERDUE_SAMPLE = 1000
#: Seconds a scrape waits for Redis (connect, then each reply): less than Prometheus' 10 s scrape timeout.
REDIS_TIMEOUT = 5.0
DEFAULT_PORT = 9808
#: Seconds between two SCANs for DLQs that are not configured (and quarantines).
DISCOVER_EVERY = 60.0
#: Errors of a Redis that is down or unreachable: logged without a traceback.
EXPECTED = (redis.RedisError, OSError)

GAUGES = {
    "dead_letters": ("Dead letters in a DLQ, every priority sub-list counted.", ("dlq", "queue")),
    "oldest_dead_letter_age_seconds": ("Seconds since the oldest dead letter of a DLQ was dead-lettered.", ("dlq",)),
    "parked": ("Retries parked (or being moved) for a queue.", ("queue",)),
    "overdue_parked": ("Parked retries past due by more than a few mover intervals: no mover is moving them.",
                       ("queue",)),
    "breaker_state": ("A circuit breaker's state: 1 for the state it is in, 0 for the others (closed, open, "
                      "half_open).", ("queue", "task", "group", "state")),
    "scrape_duration_seconds": ("Seconds the last successful scrape of Redis took.", ()),
    "redis_up": ("1 when the exporter could read Redis, 0 when it could not.", ()),
}


def gauge(name: str) -> GaugeMetricFamily:
    """An empty family of the gauge ``name`` (:data:`GAUGES`)."""
    doc, labels = GAUGES[name]
    return GaugeMetricFamily(PREFIX + name, doc, labels=list(labels))


def total(metric: str) -> CounterMetricFamily:
    """An empty family of the counter ``metric`` (``Operator.totals``' :class:`~celery_dlq.ops.operator.Metric`)."""
    return CounterMetricFamily(PREFIX + metric, Totals.HELP[metric], labels=list(Totals.LABELS[metric]))


def scrape_operator(app: Any, timeout: float = REDIS_TIMEOUT) -> Operator:
    """An :class:`Operator` whose clients give up after ``timeout`` seconds (a hung Redis fails the scrape fast).

    On a broker that is not Redis the DLQs cannot be read: the operator has
    no broker client and the DLQ gauges are left out.
    """
    return Operator.with_timeout(app, timeout)


class Discovery:
    """The DLQs and quarantines SCAN finds (:meth:`Operator.known`, :meth:`Operator.quarantines`), kept.

    The first :meth:`found` looks in the caller's thread, so the first
    scrape is complete. Once the result is ``every`` seconds old, the next
    :meth:`found` starts a daemon thread that looks again and returns the
    result it has: no scrape after the first waits for a SCAN (0.3 s at
    200,000 keys), and one SCAN runs at a time. A SCAN that fails (Redis
    down) keeps the last result and is tried again at the next scrape.
    """

    def __init__(self, op: Operator, every: float = DISCOVER_EVERY) -> None:
        self.op, self.every = op, every
        self.monotonic: Callable[[], float] = time.monotonic
        self._found: tuple[float, dict[str, str | None]] | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._failing = False

    def found(self, parked_by_queue: dict[str, int]) -> dict[str, str | None]:
        """DLQ name -> its queue, as the last SCAN found them (a copy)."""
        last = self._found
        if last is None:
            last = self._look(parked_by_queue)
        elif self.monotonic() - last[0] >= self.every:
            with self._lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._look_quietly, args=(dict(parked_by_queue),),
                                                    name="celery-dlq-discovery", daemon=True)
                    self._thread.start()
        return dict(last[1])

    def join(self, timeout: float | None = None) -> None:
        """Wait for a look in progress (tests, shutdown)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _look(self, parked_by_queue: dict[str, int]) -> tuple[float, dict[str, str | None]]:
        self._found = (self.monotonic(), {**self.op.known(parked_by_queue), **self.op.quarantines()})
        return self._found

    def _look_quietly(self, parked_by_queue: dict[str, int]) -> None:
        try:
            self._look(parked_by_queue)
        except Exception as exc:   # keeps what it had; logged once per streak of failures, as the collector does
            if not self._failing:
                logger.warning("celery-dlq exporter: looking for DLQs with SCAN failed (the DLQs found before "
                               "are still reported): %s", exc, exc_info=not isinstance(exc, EXPECTED))
            self._failing = True
        else:
            self._failing = False


class DLQCollector(Collector):
    """The metrics of one app, read from Redis on every :meth:`collect`.

    ``operator`` and ``clock`` may be given, as tests do; ``overdue_after``
    defaults to :data:`OVERDUE_INTERVALS` x ``dlq_mover_interval``; DLQs are
    looked for with SCAN at most every ``discover_every`` seconds, in the
    background after the first scrape (:class:`Discovery`).
    """

    def __init__(self, app: Any = None, *, operator: Operator | None = None, clock: Callable[[], float] = time.time,
                 overdue_after: float | None = None, overdue_sample: int = OVERDUE_SAMPLE,
                 discover_every: float = DISCOVER_EVERY) -> None:
        if operator is None and app is None:
            raise TypeError("DLQCollector needs an app (or an operator)")
        self.op = operator if operator is not None else scrape_operator(app)
        self.clock, self.overdue_sample = clock, overdue_sample
        self.discovery = Discovery(self.op, discover_every)
        interval = self.op.settings.mover_interval
        self.overdue_after = OVERDUE_INTERVALS * interval if overdue_after is None else overdue_after
        #: The Redis URLs read, passwords masked (for logs).
        self.where = self.op.settings.safe_redis_url
        url = broker_url_of(self.op.app)
        #: False on a broker that is not Redis: DLQs are not Redis lists, so parked retries and counters only.
        self.lists_readable = url is not None
        if url is not None and url != self.op.settings.redis_url:
            self.where += f" and the broker's Redis at {sanitize(url)}"
        self._up: bool | None = None

    def describe(self) -> Iterator[Metric]:
        """The families, without samples: registering the collector reads nothing from Redis."""
        for name in GAUGES:
            yield gauge(name)
        for metric in Totals.LABELS:
            yield total(metric)

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        try:
            families = self.read()
        except Exception as exc:   # a scrape never fails: it says Redis is down
            self._went_down(exc)
            up = gauge("redis_up")
            up.add_metric([], 0)
            yield up
            return
        if self._up is False:
            logger.info("celery-dlq exporter: Redis at %s can be read again", self.where)
        self._up = True
        yield from families
        duration = gauge("scrape_duration_seconds")
        duration.add_metric([], time.perf_counter() - started)
        yield duration
        up = gauge("redis_up")
        up.add_metric([], 1)
        yield up

    def _went_down(self, exc: BaseException) -> None:
        """Log the first failure after a success (or at start), not every scrape."""
        if self._up is not False:
            logger.warning("celery-dlq exporter: cannot read Redis at %s: %s", self.where, exc,
                           exc_info=not isinstance(exc, EXPECTED))
        self._up = False

    def read(self) -> list[Metric]:
        """Every family but ``redis_up``, read now; raises what Redis raises."""
        now = self.clock()
        parked_by_queue = self.op.parked.counts_by_queue()
        families = []
        if self.lists_readable:
            families += self.dead_letters(self.dlqs(parked_by_queue), now)
        parked = gauge("parked")
        for queue, n in sorted(parked_by_queue.items()):
            parked.add_metric([queue], n)
        families += [parked, self.overdue(now, parked_by_queue), self.breakers(), *self.totals()]
        return families

    def breakers(self) -> Metric:
        """Each circuit breaker's state, one sample per state (``ops.BreakerControls.rows``)."""
        family = gauge("breaker_state")
        for row in self.op.breakers.rows():
            for state in BREAKER_STATES:
                family.add_metric([row.queue, row.task, row.group, state], int(row.state == state))
        return family

    def dlqs(self, parked_by_queue: dict[str, int]) -> dict[str, str | None]:
        """DLQ name -> its queue: as ``celery dlq queues`` finds them, SCAN's part from :attr:`discovery`.

        The DLQs of declared and parked-for queues are added at every
        scrape, without SCAN.
        """
        dlqs = self.discovery.found(parked_by_queue)
        for queue in [*self.op.app.amqp.queues, *parked_by_queue]:
            dlq = self.op.dlq_of(queue)
            if dlq:
                dlqs.setdefault(dlq, queue)
        return dlqs

    def dead_letters(self, dlqs: dict[str, str | None], now: float) -> list[Metric]:
        """Depth and oldest age of each DLQ (``Operator.sizes``: ``LLEN`` and ``LINDEX -1`` of each sub-list,
        one pipeline)."""
        sizes = self.op.sizes(sorted(dlqs))
        depth, age = gauge("dead_letters"), gauge("oldest_dead_letter_age_seconds")
        for name, size in sizes.items():
            depth.add_metric([name, dlqs[name] or ""], size.dead_letters)
            seconds = size.age(now)
            if seconds is not None:
                age.add_metric([name], seconds)
        return [depth, age]

    def overdue(self, now: float, parked_by_queue: dict[str, int]) -> Metric:
        """Entries past due (or past their lease) by more than ``overdue_after``; see the module's docstring."""
        found = self.op.parked.overdue(now, self.overdue_after, self.overdue_sample)
        family = gauge("overdue_parked")
        by_queue = {queue: 0 for queue in parked_by_queue}
        by_queue.update(found.by_queue)
        for queue, n in sorted(by_queue.items()):
            family.add_metric([queue], n)
        if found.unattributed:
            family.add_metric([""], found.unattributed)
        return family

    def totals(self) -> list[Metric]:
        """The ``_total`` counters, a family per metric (HELP and TYPE even before the first count)."""
        families = {metric: total(metric) for metric in Totals.LABELS}
        for (metric, labels), value in self.op.totals().items():
            families[metric].add_metric([v for _, v in labels], value)
        return list(families.values())


def classic_text(app: Callable) -> Callable:
    """``app`` answering in Prometheus' text format 0.0.4 whatever the scraper accepts.

    In OpenMetrics a counter's family drops ``_total``, so the counter
    ``celery_dlq_parked_total`` and the gauge ``celery_dlq_parked`` would be
    two families of one name (Prometheus then files the gauge as a counter).
    The classic format names the counter's family ``celery_dlq_parked_total``.
    """
    def wsgi(environ: dict, start_response: Callable) -> Any:
        return app({key: value for key, value in environ.items() if key != "HTTP_ACCEPT"}, start_response)
    return wsgi


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:   # no line per scrape on stderr
        pass


@dataclass
class Exporter:
    """A running ``/metrics`` server: prometheus-client's WSGI app on wsgiref, a thread per scrape."""

    collector: DLQCollector
    server: WSGIServer
    thread: threading.Thread

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve(app: Any, port: int = DEFAULT_PORT, bind: str = "127.0.0.1") -> Exporter:
    """Serve ``app``'s metrics on ``http://bind:port/metrics`` until :meth:`Exporter.close`."""
    collector = DLQCollector(app)
    registry = CollectorRegistry()
    registry.register(collector)
    family, _, _, _, address = socket.getaddrinfo(bind, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    server_class = type("Server", (ThreadingWSGIServer,), {"address_family": family})
    server: WSGIServer = make_server(str(address[0]), port, classic_text(make_wsgi_app(registry)), server_class,
                                     handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, name="celery-dlq-exporter", daemon=True)
    thread.start()
    return Exporter(collector, server, thread)
