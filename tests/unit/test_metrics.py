"""The exporter's counters (redis/metrics.py) and collector (metrics.py), on fakeredis and a real redis-server.

Every scrape goes through prometheus-client's text format and its parser,
as Prometheus would read it, so label escaping is tested end to end.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import fakeredis
import pytest
import redis
from celery import Celery
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from celery_dlq import headers as H
from celery_dlq.exporter import DLQCollector, scrape_operator
from celery_dlq.ops.audit import Actor
from celery_dlq.ops.letters import Filter
from celery_dlq.ops.operator import Operator
from celery_dlq.storage.factory import redis_side
from celery_dlq.storage.keys import Keys, QueueLists
from celery_dlq.storage.shards import ShardedStore
from celery_dlq.storage.totals import MAX_VALUE, Metric, field, incr, parse_field, read
from celery_dlq.worker.deadletter.retention import Retention
from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000.0


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# -- the hash fields --------------------------------------------------------------

def test_a_field_reads_like_prometheus_and_parses_back():
    text = field(Metric.DEAD_LETTERED, task="shop.charge", reason="max_delivery_attempts", queue="orders")
    assert text == 'dead_lettered_total{queue="orders",task="shop.charge",reason="max_delivery_attempts"}'
    assert parse_field(text) == (Metric.DEAD_LETTERED, (("queue", "orders"), ("task", "shop.charge"),
                                                        ("reason", "max_delivery_attempts")))
    assert field(Metric.REPLAYED, dlq=None) == 'replayed_total{dlq=""}'


def test_quotes_braces_commas_and_backslashes_are_escaped():
    name = 'evil",queue="x"}\\{a,b}\n'
    text = field(Metric.PARKED, queue="q", task=name)
    assert text == 'parked_total{queue="q",task="evil\\",queue=\\"x\\"}\\\\{a,b}\\n"}'
    assert parse_field(text) == (Metric.PARKED, (("queue", "q"), ("task", name)))


def test_field_refuses_an_unknown_metric_or_the_wrong_labels():
    with pytest.raises(ValueError, match="unknown metric"):
        field("parked", queue="q", task="t")
    with pytest.raises(ValueError, match="takes the labels queue, task"):
        field(Metric.PARKED, queue="q")
    with pytest.raises(ValueError, match="takes the labels dlq"):
        field(Metric.PURGED, dlq="d", queue="q")


def test_a_long_label_value_is_cut():
    assert parse_field(field(Metric.PURGED, dlq="x" * 10_000)) == (Metric.PURGED, (("dlq", "x" * MAX_VALUE),))


ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=MAX_VALUE)


@given(metric=st.sampled_from(sorted(Metric.LABELS)), values=st.lists(ANY_TEXT, min_size=3, max_size=3))
def test_any_label_values_round_trip(metric, values):
    """Every string (quotes, braces, commas, escapes, lone surrogates) parses back to itself."""
    names = Metric.LABELS[metric]
    labels = dict(zip(names, values))
    text = field(metric, **labels)
    assert parse_field(text) == (metric, tuple((name, labels[name]) for name in names))
    text.encode("utf-8")   # what redis-py sends: no lone surrogate left


@given(st.text(alphabet='a_{}",=\\nu0d8', max_size=40))
def test_parse_field_raises_only_value_error_on_junk(text):
    try:
        metric, labels = parse_field(text)
    except ValueError:
        return
    assert isinstance(metric, str) and all(isinstance(v, str) for _, v in labels)


@pytest.mark.parametrize("junk", ["", "parked_total", "parked_total{", 'parked_total{queue="q"', '{queue="q"}',
                                  'parked_total{queue="q"x}', 'parked_total{queue=q}', 'parked_total{"q"}',
                                  'parked_total{queue="\\x"}', 'parked_total{queue="\\u00"}'])
def test_parse_field_rejects(junk):
    with pytest.raises(ValueError):
        parse_field(junk)


# -- incr / read ------------------------------------------------------------------

def test_incr_on_a_client_or_a_pipeline_and_read_back(any_redis, unique):
    keys = Keys(f"m{unique}")
    incr(any_redis, keys, Metric.PARKED, queue="orders", task="shop.charge")
    incr(any_redis, keys, Metric.PARKED, 2, queue="orders", task="shop.charge")
    pipe = any_redis.pipeline(transaction=False)
    incr(pipe, keys, Metric.DEAD_LETTERED, queue="orders", task='we"ird\ud800', reason="non_retryable")
    incr(pipe, keys, Metric.PURGED, 5, dlq="DLQ.orders")
    pipe.execute()
    assert read(any_redis, keys) == {
        (Metric.PARKED, (("queue", "orders"), ("task", "shop.charge"))): 3,
        (Metric.DEAD_LETTERED, (("queue", "orders"), ("task", 'we"ird\ud800'), ("reason", "non_retryable"))): 1,
        (Metric.PURGED, (("dlq", "DLQ.orders"),)): 5,
    }
    assert any_redis.type(keys.metrics) == b"hash" and keys.metrics == "{m" + unique + "}:metrics"


def test_read_skips_fields_it_does_not_know(any_redis, unique):
    keys = Keys(f"m{unique}")
    incr(any_redis, keys, Metric.TRIMMED, 4, dlq="DLQ.a")
    any_redis.hset(keys.metrics, mapping={"junk": 1, 'parked_total{queue="q"}': 2, 'new_total{x="y"}': 3,
                                          'purged_total{dlq="a",dlq="b"}': 4, 'trimmed_total{dlq="b"}': "x"})
    assert read(any_redis, keys) == {(Metric.TRIMMED, (("dlq", "DLQ.a"),)): 4}


# -- the collector ----------------------------------------------------------------

def scrape(collector: DLQCollector) -> dict[tuple[str, tuple], float]:
    """One scrape as Prometheus reads it: ``(sample name, sorted labels) -> value``."""
    registry = CollectorRegistry()
    registry.register(collector)
    samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def scrape_up(collector: DLQCollector) -> dict[tuple[str, tuple], float]:
    """A scrape that read Redis: ``collect()`` turns any exception into ``redis_up 0``, so a test asserting
    what a scrape did NOT do (a command, a DLQ) first checks that it ran at all."""
    samples = scrape(collector)
    assert samples[("celery_dlq_redis_up", ())] == 1, f"the scrape failed (see the log): {samples}"
    return samples


def letter(task_id: str, at: float | None, queue: str, task: str = "shop.charge") -> bytes:
    """A small dead letter as kombu's Redis transport stores it."""
    headers = H.dead_letter_headers({"id": task_id, "task": task, "lang": "py"}, delivery=3, queue=queue,
                                    exchange="", routing_key=queue, reason="max_delivery_attempts",
                                    failure={"type": "ValueError", "message": "boom"}, worker="w1@h", now=at or T0)
    if at is None:
        del headers[H.DEAD_LETTERED_AT]
    return json.dumps({"body": "W1tdLCB7fSwge31d", "content-encoding": "utf-8", "content-type": "application/json",
                       "headers": headers, "properties": {"correlation_id": task_id, "body_encoding": "base64",
                                                          "delivery_tag": str(uuid.uuid4()), "priority": 0,
                                                          "delivery_info": {"exchange": "", "routing_key": queue}}
                       }).encode()


class Setup:
    """An operator's app with its own queues and key prefix, over one client, and its collector."""

    def __init__(self, client, unique: str, **conf) -> None:
        self.client, self.queue, self.clock = client, f"orders{unique}", FakeClock()
        self.app = Celery("exp", broker="redis://127.0.0.1:1/0", set_as_current=False)
        self.app.conf.update(task_default_queue=self.queue, dlq_key_prefix=f"x{unique}", dlq_mover_interval=2.0,
                             **conf)
        self.op = Operator(self.app, broker=client, client=client, clock=self.clock)
        self.collector = DLQCollector(operator=self.op, clock=self.clock)
        self.dlq = f"DLQ.{self.queue}"

    def push(self, n: int, at: float | None, priority: int = 0, dlq: str | None = None) -> None:
        key = QueueLists().key(dlq or self.dlq, priority)
        self.client.lpush(key, *[letter(str(uuid.uuid4()), at, self.queue) for _ in range(n)])

    def park(self, n: int, due: float, queue: str | None = None) -> None:
        for _ in range(n):
            self.op.sharded.home.store.park(str(uuid.uuid4()), b"p", queue or self.queue, due=due)


@pytest.fixture
def setup(any_redis, unique):
    return Setup(any_redis, unique)


def test_a_scrape_reports_exactly_what_redis_holds(setup):
    s = setup
    s.push(3, T0 - 50, priority=0)
    s.push(2, T0 - 500, priority=9)       # older, in another priority sub-list
    s.push(1, None, priority=3)           # no dead-lettered time: counted, never the oldest
    s.push(4, T0 - 10, dlq=s.queue)       # the live queue: not a DLQ
    s.park(2, due=T0 + 60)
    s.park(1, due=T0 + 60, queue="elsewhere")
    incr(s.client, s.op.keys, Metric.DEAD_LETTERED, 6, queue=s.queue, task="shop.charge",
         reason="max_delivery_attempts")
    incr(s.client, s.op.keys, Metric.PARKED, 3, queue=s.queue, task='odd"task{,}')
    got = scrape(s.collector)
    assert got[("celery_dlq_dead_letters", (("dlq", s.dlq), ("queue", s.queue)))] == 6
    assert got[("celery_dlq_oldest_dead_letter_age_seconds", (("dlq", s.dlq),))] == 500
    assert got[("celery_dlq_parked", (("queue", s.queue),))] == 2
    assert got[("celery_dlq_parked", (("queue", "elsewhere"),))] == 1
    assert got[("celery_dlq_overdue_parked", (("queue", s.queue),))] == 0
    assert got[("celery_dlq_dead_lettered_total", (("queue", s.queue), ("reason", "max_delivery_attempts"),
                                                   ("task", "shop.charge")))] == 6
    assert got[("celery_dlq_parked_total", (("queue", s.queue), ("task", 'odd"task{,}')))] == 3
    assert got[("celery_dlq_redis_up", ())] == 1
    assert 0 < got[("celery_dlq_scrape_duration_seconds", ())] < 5
    assert not [key for key in got if key[0] == "celery_dlq_dead_letters" and ("dlq", s.queue) in key[1]]
    assert ("celery_dlq_overdue_parked", (("queue", ""),)) not in got


def test_an_empty_dlq_shows_zero_and_no_age(setup):
    got = scrape(setup.collector)
    assert got[("celery_dlq_dead_letters", (("dlq", setup.dlq), ("queue", setup.queue)))] == 0
    assert not [key for key in got if key[0] == "celery_dlq_oldest_dead_letter_age_seconds"
                and ("dlq", setup.dlq) in key[1]]


def test_found_and_shared_dlqs_and_quarantines_are_reported(any_redis, unique):
    s = Setup(any_redis, unique, dlq_queue_policies={f"shared{unique}": {"dead_letter": f"Shared{unique}"}})
    s.push(2, T0 - 5, dlq=f"DLQ.found{unique}")            # never configured: found by SCAN
    s.push(1, T0 - 7, dlq=f"Shared{unique}")
    any_redis.lpush(s.op.keys.quarantine(f"raw{unique}"), b"\xff not a message")
    got = scrape(s.collector)
    assert got[("celery_dlq_dead_letters", (("dlq", f"DLQ.found{unique}"), ("queue", f"found{unique}")))] == 2
    assert got[("celery_dlq_dead_letters", (("dlq", f"Shared{unique}"), ("queue", "")))] == 1
    assert got[("celery_dlq_oldest_dead_letter_age_seconds", (("dlq", f"Shared{unique}"),))] == 7
    assert got[("celery_dlq_dead_letters", (("dlq", f"quarantine:raw{unique}"), ("queue", f"raw{unique}")))] == 1


def overdue(samples: dict) -> dict[str, float]:
    return {dict(labels)["queue"]: v for (name, labels), v in samples.items() if name == "celery_dlq_overdue_parked"}


def test_overdue_parked_counts_entries_past_five_mover_intervals(setup):
    s = setup                                     # dlq_mover_interval 2 s: overdue after 10 s
    s.park(1, due=T0 - 60, queue="other")
    (claimed,) = s.op.sharded.home.store.claim_due(limit=5, lease=1, now=T0 - 59)   # its mover died: lease ran out
    s.park(2, due=T0 - 11)
    s.park(1, due=T0 - 9)                         # late, but within five intervals
    s.park(1, due=T0 + 9)
    s.park(1, due=T0 - 30, queue="other")
    assert overdue(scrape(s.collector)) == {s.queue: 2, "other": 2}
    s.clock.now = T0 - 20                         # the cutoff is T0 - 30: strictly older only
    assert overdue(scrape(s.collector)) == {s.queue: 0, "other": 1}
    s.op.sharded.home.store.ack(claimed)
    s.clock.now = T0 + 100
    assert overdue(scrape(s.collector)) == {s.queue: 4, "other": 1}


def test_overdue_beyond_the_sample_is_reported_unattributed(setup):
    s = setup
    s.collector.overdue_sample = 3
    s.park(4, due=T0 - 100)
    s.park(2, due=T0 - 50, queue="other")         # less overdue: outside the sample of 3
    assert overdue(scrape(s.collector)) == {s.queue: 3, "other": 0, "": 3}   # the sum is exact


def test_operator_tools_and_retention_count_replayed_purged_and_trimmed(setup):
    s = setup
    s.push(5, T0 - 100)
    queue = s.op.queue(s.dlq)
    assert queue.replay(limit=2).done == 2
    assert queue.purge(Filter(task_name="shop.charge"), limit=1, force=True).done == 1
    assert queue.purge(force=True).done == 2
    no_archive = ShardedStore(s.client, s.op.sharded.shards, events_max_length=0)
    retention = Retention(redis_side(s.app, client=s.client, broker=s.client, sharded=no_archive))
    s.push(4, T0 - 100)
    assert retention.trim(s.dlq, max_length=1) == 3
    assert read(s.client, s.op.keys) == {(Metric.REPLAYED, (("dlq", s.dlq),)): 2,
                                         (Metric.PURGED, (("dlq", s.dlq),)): 3,
                                         (Metric.TRIMMED, (("dlq", s.dlq),)): 3}
    assert {k: v for k, v in s.op.stats().items() if k in ("replayed", "purged", "dead_letters_trimmed")} == \
        {"replayed": 2, "purged": 3, "dead_letters_trimmed": 3}   # the stats hash counts as before
    got = scrape(s.collector)
    assert got[("celery_dlq_replayed_total", (("dlq", s.dlq),))] == 2
    assert got[("celery_dlq_purged_total", (("dlq", s.dlq),))] == 3
    assert got[("celery_dlq_trimmed_total", (("dlq", s.dlq),))] == 3


def test_every_counter_family_is_described_before_its_first_count(setup):
    registry = CollectorRegistry()
    registry.register(setup.collector)
    text = generate_latest(registry).decode()
    for metric in Metric.LABELS:
        assert f"# TYPE celery_dlq_{metric} counter" in text


def test_registering_reads_nothing_from_redis(unique):
    server = fakeredis.FakeServer()
    server.connected = False
    client = fakeredis.FakeRedis(server=server)
    s = Setup(client, unique)
    CollectorRegistry(auto_describe=True).register(s.collector)   # describe(), not collect()


def test_redis_down_on_fakeredis_gives_redis_up_0_alone(unique):
    server = fakeredis.FakeServer()
    s = Setup(fakeredis.FakeRedis(server=server), unique)
    s.push(1, T0)
    server.connected = False
    assert scrape(s.collector) == {("celery_dlq_redis_up", ()): 0}
    server.connected = True
    got = scrape(s.collector)
    assert got[("celery_dlq_redis_up", ())] == 1
    assert got[("celery_dlq_dead_letters", (("dlq", s.dlq), ("queue", s.queue)))] == 1


def test_a_scrape_costs_the_same_round_trips_whatever_the_depth(setup):
    """LLEN and LINDEX per sub-list: a deeper DLQ costs nothing more (no LRANGE, no paging)."""
    calls = []

    class Counting:
        def __init__(self, client):
            self.client = client

        def pipeline(self, *args, **kwargs):
            pipe = self.client.pipeline(*args, **kwargs)
            execute = pipe.execute

            def counted():
                calls.append([c[0][0] for c in pipe.command_stack])
                return execute()
            pipe.execute = counted
            return pipe

        def __getattr__(self, name):
            calls.append([name])
            return getattr(self.client, name)

    s = setup
    op = Operator(s.app, broker=Counting(s.client), client=s.client, clock=s.clock)
    collector = DLQCollector(operator=op, clock=s.clock)
    s.push(10, T0)
    scrape_up(collector)                          # the first scrape looks for DLQs (SCAN)
    assert ["scan_iter"] in calls
    calls.clear()
    scrape_up(collector)
    shallow = list(calls)
    s.push(5000, T0)
    calls.clear()
    assert scrape_up(collector)[("celery_dlq_dead_letters", (("dlq", s.dlq), ("queue", s.queue)))] == 5010
    assert calls == shallow
    assert len(calls) == 1 and set(calls[0]) == {"LLEN", "LINDEX"}   # one pipeline, 2 commands per sub-list


def test_dlqs_found_by_scan_are_looked_for_again_after_discover_every(setup):
    s, now = setup, [1000.0]
    s.collector.discovery.monotonic = lambda: now[0]
    scrape(s.collector)
    s.push(2, T0, dlq=f"DLQ.{s.queue}late")       # not configured: only SCAN finds it
    s.park(1, due=T0 + 60, queue=f"{s.queue}p")   # a queue with parked retries: its DLQ is known at once
    late = ("celery_dlq_dead_letters", (("dlq", f"DLQ.{s.queue}late"), ("queue", f"{s.queue}late")))
    got = scrape_up(s.collector)
    assert late not in got
    assert got[("celery_dlq_dead_letters", (("dlq", f"DLQ.{s.queue}p"), ("queue", f"{s.queue}p")))] == 0
    now[0] += 59.9
    assert late not in scrape_up(s.collector)
    now[0] += 0.1
    scrape(s.collector)                           # starts the SCAN in the background...
    s.collector.discovery.join(5)
    assert scrape(s.collector)[late] == 2         # ...and the next scrape counts what it found
    s.client.delete(f"DLQ.{s.queue}late")
    assert scrape(s.collector)[late] == 0         # found once, counted until the next SCAN


def test_a_scrape_does_not_wait_for_the_scan_after_the_first(setup):
    """The SCAN of a large keyspace runs in a thread of its own; a scrape meanwhile answers with what it had."""
    s, now = setup, [1000.0]
    s.collector.discovery.monotonic = lambda: now[0]
    scanning, release = threading.Event(), threading.Event()
    known, looks = s.op.known, []

    def slow_known(parked):
        looks.append(parked)
        scanning.set()
        assert release.wait(10)
        return known(parked)

    scrape(s.collector)
    s.push(3, T0, dlq=f"DLQ.{s.queue}late")
    s.op.known = slow_known
    now[0] += 60
    got = scrape(s.collector)                     # starts the SCAN, which now hangs until released
    assert scanning.wait(5)
    got_again = scrape(s.collector)               # one SCAN at a time: this scrape starts none
    assert not release.is_set()                   # both scrapes answered while the SCAN hung
    assert got[("celery_dlq_redis_up", ())] == got_again[("celery_dlq_redis_up", ())] == 1
    late = ("celery_dlq_dead_letters", (("dlq", f"DLQ.{s.queue}late"), ("queue", f"{s.queue}late")))
    assert late not in got and late not in got_again
    assert got[("celery_dlq_dead_letters", (("dlq", s.dlq), ("queue", s.queue)))] == 0
    release.set()
    s.collector.discovery.join(5)
    assert len(looks) == 1
    assert scrape(s.collector)[late] == 3


def test_a_failed_background_scan_keeps_what_was_found(setup, caplog):
    s, now = setup, [1000.0]
    s.collector.discovery.monotonic = lambda: now[0]
    s.push(1, T0, dlq=f"DLQ.{s.queue}late")
    late = ("celery_dlq_dead_letters", (("dlq", f"DLQ.{s.queue}late"), ("queue", f"{s.queue}late")))
    assert scrape(s.collector)[late] == 1
    known, s.op.known = s.op.known, lambda parked: (_ for _ in ()).throw(ConnectionError("gone"))
    now[0] += 60
    scrape(s.collector)
    s.collector.discovery.join(5)
    assert scrape(s.collector)[late] == 1         # the failed look kept the last result...
    s.collector.discovery.join(5)                 # (that scrape looked again, and failed again)
    failures = [r for r in caplog.records if "looking for DLQs with SCAN failed" in r.getMessage()]
    assert len(failures) == 1 and "gone" in failures[0].getMessage()   # once per streak, not per look
    s.op.known = known
    s.push(1, T0, dlq=f"DLQ.{s.queue}later")
    scrape(s.collector)                           # ...and is tried again at the next scrape
    s.collector.discovery.join(5)
    assert scrape(s.collector)[("celery_dlq_dead_letters", (("dlq", f"DLQ.{s.queue}later"),
                                                           ("queue", f"{s.queue}later")))] == 1


def test_scrape_operator_uses_clients_that_give_up_fast():
    app = Celery("t", broker="redis://:secret@127.0.0.1:1/3", set_as_current=False)
    op = scrape_operator(app, timeout=1.5)
    assert op.client.connection_pool.connection_kwargs["socket_timeout"] == 1.5
    assert op.broker is op.client
    collector = DLQCollector(operator=op)
    assert "secret" not in collector.where and collector.lists_readable


def test_on_a_non_redis_broker_only_parked_and_counters_are_reported(any_redis, unique):
    app = Celery("amqp", broker="amqp://guest:secret@localhost//", set_as_current=False)
    app.conf.update(dlq_redis_url="redis://127.0.0.1:1/0", dlq_key_prefix=f"a{unique}")
    op = Operator(app, client=any_redis, clock=FakeClock())
    op.sharded.home.store.park("e1", b"p", f"q{unique}", due=T0 + 60)
    got = scrape(DLQCollector(operator=op, clock=op.clock))
    assert got[("celery_dlq_parked", (("queue", f"q{unique}"),))] == 1
    assert got[("celery_dlq_redis_up", ())] == 1
    assert not [key for key in got if key[0] == "celery_dlq_dead_letters"]


def test_redis_stopped_and_started_again_on_a_real_server(unique):
    """A real redis-server goes away: redis_up 0 and nothing else, never an exception; back: 1 and the values."""
    server = RedisServer().start()
    try:
        app = Celery("down", broker=server.url, set_as_current=False)
        app.conf.update(task_default_queue=f"q{unique}", dlq_key_prefix=f"d{unique}")
        collector = DLQCollector(app, clock=FakeClock())
        client = redis.Redis.from_url(server.url)
        client.lpush(f"DLQ.q{unique}", letter("t1", T0 - 3, f"q{unique}"))
        assert scrape(collector)[("celery_dlq_dead_letters", (("dlq", f"DLQ.q{unique}"), ("queue", f"q{unique}")))] == 1
        server.stop()
        assert scrape(collector) == {("celery_dlq_redis_up", ()): 0}
        assert scrape(collector) == {("celery_dlq_redis_up", ()): 0}
        server = RedisServer(server.port).start()     # same port, empty again
        redis.Redis.from_url(server.url).lpush(f"DLQ.q{unique}", letter("t2", T0 - 3, f"q{unique}"),
                                               letter("t3", T0 - 4, f"q{unique}"))
        got = scrape(collector)
        assert got[("celery_dlq_redis_up", ())] == 1
        assert got[("celery_dlq_dead_letters", (("dlq", f"DLQ.q{unique}"), ("queue", f"q{unique}")))] == 2
    finally:
        server.stop()


def test_the_cli_loads_without_prometheus_client():
    """Celery imports the dlq group for every command: prometheus-client only when `exporter` runs."""
    code = ("import sys, celery_dlq.cli; from celery_dlq.cli.base import dlq; "
            "assert 'exporter' in dlq.commands; assert 'prometheus_client' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_a_sharded_store_is_scraped_as_one(any_redis, unique):
    s = Setup(any_redis, unique, dlq_store_shards=3)
    tasks = [f"t{n}" for n in range(12)]
    for n, task_id in enumerate(tasks):
        shard = s.op.sharded.of(task_id)
        assert shard.store.park(f"{task_id}:2", b"p", s.queue if n % 3 else "other", due=T0 - 60 if n < 4 else T0 + 60)
        incr(s.client, shard.keys, Metric.PARKED, 1, queue=s.queue, task="shop.charge")
    s.op.sharded.home.store.park("before-sharding:2", b"p", s.queue, due=T0 + 60)      # still read
    assert len({s.op.sharded.shards.index(t) for t in tasks}) == 3                      # every shard holds some
    got = scrape(s.collector)
    assert got[("celery_dlq_parked", (("queue", s.queue),))] == 9
    assert got[("celery_dlq_parked", (("queue", "other"),))] == 4
    assert got[("celery_dlq_parked_total", (("queue", s.queue), ("task", "shop.charge")))] == 12
    assert overdue(got) == {s.queue: 2, "other": 2}                                   # t0..t3, due a minute ago


def test_each_breaker_reports_one_sample_per_state(setup):
    s = setup
    s.op.breakers.pause("shop.charge", queue=s.queue, actor=Actor("alice"))
    s.op.breakers.pause("shop.refund", queue=s.queue, actor=Actor("bob"))
    s.op.breakers.resume("shop.refund")
    got = scrape(s.collector)
    states = {(dict(labels)["task"], dict(labels)["state"]): value for (name, labels), value in got.items()
              if name == "celery_dlq_breaker_state"}
    assert states == {("shop.charge", "open"): 1, ("shop.charge", "closed"): 0, ("shop.charge", "half_open"): 0,
                      ("shop.refund", "open"): 0, ("shop.refund", "closed"): 1, ("shop.refund", "half_open"): 0}
