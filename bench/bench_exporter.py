"""Benchmark 7: one Prometheus scrape of 50 DLQs of 100,000 dead letters each (target < 50 ms).

The exporter reads Redis at scrape time, so a scrape must cost O(number of
DLQs and label sets), never O(DLQ depth). This fills its own redis-server
with 50 DLQs (``DLQ.bench00`` ... ``DLQ.bench49``, not configured: found by
SCAN, as ``celery dlq queues`` finds them) of 100,000 small dead letters each
(5,000,000 kombu JSON messages, pushed with pipelines), 1,000 parked retries
(100 overdue) and the counters of 50 queues x 4 tasks (1,150 label sets), then
times scrapes:

- ``collect``: ``DLQCollector`` with the exporter's own clients, rendered to
  Prometheus' text format (``generate_latest``), in this process;
- ``http``: a GET of ``/metrics`` from :func:`celery_dlq.exporter.serve`;
- ``http, +200k keys``: the same after 200,000 unrelated keys are added (the
  delivery counters and audit markers a busy worker fleet keeps, or a result
  backend's keys);
- the first scrape, which looks for unconfigured DLQs with SCAN in its own
  thread (it walks the whole keyspace), and a scrape while that SCAN runs in
  the collector's background thread, as every scrape after the first does
  once a minute (``discover_every=0`` here: a SCAN starts at every scrape
  and the next one answers while it runs).

Run: ``.venv/bin/python bench/bench_exporter.py [--quick] [--scrapes N]``.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402
from celery import Celery  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from bench import results as results_file  # noqa: E402
from bench.common import RedisServer, machine, parser, redis_server_version, timed_call, timed_runs  # noqa: E402
from celery_dlq import headers as H  # noqa: E402
from celery_dlq.exporter import DLQCollector, serve  # noqa: E402
from celery_dlq.storage.keys import Keys  # noqa: E402
from celery_dlq.storage.store import ParkedStore  # noqa: E402
from celery_dlq.storage.totals import Metric, field  # noqa: E402

TARGET_MS = 50.0
PREFIX = "bench"
TASKS = ("shop.charge", "shop.refund", "mail.send", "report.build")


def template(queue: str) -> str:
    """A small dead letter of ``queue`` as kombu stores it, with ``@ID@`` where each task id goes."""
    headers = H.dead_letter_headers({"id": "@ID@", "task": "shop.charge", "lang": "py"}, delivery=3, queue=queue,
                                    exchange="", routing_key=queue, reason="max_delivery_attempts",
                                    failure={"type": "ValueError", "message": "card declined"}, worker="w1@bench",
                                    now=time.time() - 3600)
    return json.dumps({"body": "W1sxXSwge30sIHt9XQ==", "content-encoding": "utf-8",
                       "content-type": "application/json", "headers": headers,
                       "properties": {"correlation_id": "@ID@", "body_encoding": "base64", "priority": 0,
                                      "delivery_tag": "@ID@"}})


def fill_dlqs(client: redis.Redis, dlqs: int, depth: int) -> int:
    """``dlqs`` DLQs of ``depth`` letters each, LPUSHed 1,000 per command; returns one letter's bytes."""
    size = 0
    for d in range(dlqs):
        queue = f"{PREFIX}{d:02d}"
        parts = template(queue).split("@ID@")
        pipe = client.pipeline(transaction=False)
        for start in range(0, depth, 1000):
            batch = [f"{d:02d}-{i:08d}".join(parts) for i in range(start, min(start + 1000, depth))]
            pipe.lpush(f"DLQ.{queue}", *batch)
            if len(pipe) >= 20:
                pipe.execute()
        pipe.execute()
        size = len(batch[-1])
    return size


def fill_store_and_counters(client: redis.Redis, keys: Keys, dlqs: int) -> int:
    """1,000 parked retries (100 overdue) over the queues, and the counters; returns the label sets."""
    store = ParkedStore(client, keys)
    now = time.time()
    for i in range(1000):
        store.park(f"p-{i}", b"payload", f"{PREFIX}{i % dlqs:02d}", due=now - 600 if i < 100 else now + 3600)
    pipe = client.pipeline(transaction=False)
    for d in range(dlqs):
        queue = f"{PREFIX}{d:02d}"
        for task in TASKS:
            for metric in (Metric.PARKED, Metric.REDELIVERED, Metric.DROPPED):
                pipe.hincrby(keys.metrics, field(metric, queue=queue, task=task), 7)
            for reason in ("max_delivery_attempts", "non_retryable"):
                pipe.hincrby(keys.metrics, field(Metric.DEAD_LETTERED, queue=queue, task=task, reason=reason), 3)
        for metric in (Metric.REPLAYED, Metric.PURGED, Metric.TRIMMED):
            pipe.hincrby(keys.metrics, field(metric, dlq=f"DLQ.{queue}"), 2)
    pipe.execute()
    return client.hlen(keys.metrics)


def add_unrelated_keys(client: redis.Redis, n: int) -> None:
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        pipe.set(f"{Keys(PREFIX).base}:count:task-{i:08d}", 1)
        if len(pipe) >= 5000:
            pipe.execute()
    pipe.execute()


def check(text: str, dlqs: int, depth: int) -> None:
    """The scrape reports what was pushed: a benchmark of a wrong answer is worthless."""
    total = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith("celery_dlq_dead_letters{") and f'dlq="DLQ.{PREFIX}' in line)
    assert total == dlqs * depth, (total, dlqs * depth)
    overdue = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith("celery_dlq_overdue_parked{"))
    assert overdue == 100, overdue


#: Rows the target does not apply to: what they cost is reported.
ONCE = "the first scrape of a collector"


def row(name: str, times: list[float]) -> str:
    verdict = "met" if statistics.median(times) < TARGET_MS else "MISSED"
    return (f"| {name} | {statistics.median(times):.1f} | {min(times):.1f} | {max(times):.1f} | "
            f"{'(once per start)' if name.startswith(ONCE) else verdict} |")


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--dlqs", type=int, default=50)
    p.add_argument("--depth", type=int, default=100_000)
    p.add_argument("--scrapes", type=int, default=15)
    results_file.add_argument(p)
    args = p.parse_args()
    if args.quick:
        args.dlqs, args.depth, args.scrapes = 10, 10_000, 7
    print(machine())
    server = RedisServer().start()
    exporter = None
    try:
        client = redis.Redis.from_url(server.url)
        print(f"redis-server {redis_server_version(client)}; filling {args.dlqs} DLQs x {args.depth:,} letters...")
        started = time.perf_counter()
        size = fill_dlqs(client, args.dlqs, args.depth)
        label_sets = fill_store_and_counters(client, Keys(PREFIX), args.dlqs)
        print(f"  {args.dlqs * args.depth:,} letters of {size} B in {time.perf_counter() - started:.0f} s; "
              f"Redis used {client.info('memory')['used_memory_human']}; {label_sets:,} counter label sets")

        app = Celery("bench", broker=server.url, set_as_current=False)
        app.conf.update(dlq_key_prefix=PREFIX, task_default_queue=f"{PREFIX}00")
        registry = CollectorRegistry()
        registry.register(DLQCollector(app))
        check(generate_latest(registry).decode(), args.dlqs, args.depth)
        results = [("collect + text format, in process", timed_runs(lambda: generate_latest(registry), args.scrapes))]

        exporter = serve(app, port=0)
        host, port = exporter.address
        url = f"http://{host}:{port}/metrics"

        def http() -> bytes:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.read()

        check(http().decode(), args.dlqs, args.depth)
        results.append(("GET /metrics", timed_runs(http, args.scrapes)))
        add_unrelated_keys(client, 200_000)
        results.append((f"GET /metrics, +200,000 unrelated keys ({client.dbsize():,} in all)",
                        timed_runs(http, args.scrapes)))
        def first_scrape() -> bytes:
            fresh = CollectorRegistry()
            fresh.register(DLQCollector(app))
            return generate_latest(fresh)

        check(first_scrape().decode(), args.dlqs, args.depth)
        results.append((f"{ONCE}: SCANs in the scrape's thread (+200,000 keys)",
                        timed_runs(first_scrape, max(3, args.scrapes // 5))))
        scanning = DLQCollector(app, discover_every=0)
        background = CollectorRegistry()
        background.register(scanning)
        generate_latest(background)

        during = []
        for _ in range(args.scrapes):
            scanning.discovery.join()          # untimed: the previous SCAN is over, this scrape starts the next
            text, took = timed_call(lambda: generate_latest(background))
            check(text.decode(), args.dlqs, args.depth)
            during.append(took)
        results.append(("a later scrape while the background SCAN runs (+200,000 keys)", during))
        print(f"\n{args.dlqs} DLQs x {args.depth:,} dead letters, {args.scrapes} scrapes each; "
              f"target: median < {TARGET_MS:.0f} ms\n")
        print("| scrape | median ms | min ms | max ms | target |\n|---|---|---|---|---|")
        for name, times in results:
            print(row(name, times))
        names = ("in_process", "http", "http_unrelated_keys", "first_scrape", "during_scan")
        results_file.write(args.results, "exporter", {
            "dlqs": args.dlqs, "depth": args.depth, "scrapes": args.scrapes,
            **{f"scrape_median_ms.{key}": round(statistics.median(times), 1)
               for key, (_, times) in zip(names, results)}},
            ["celery_dlq/exporter.py", "celery_dlq/storage/"], redis_server_version(client))
    finally:
        if exporter is not None:
            exporter.close()
        server.stop()


if __name__ == "__main__":
    main()
