"""Benchmark 16: how much Redis memory the event archive (``{<prefix>}:events``) takes.

What ``dlq_events_max_length`` (100,000 by default) costs when the stream is
full. The script starts its own redis-server on a free port (persistence off)
and appends ``--events`` events (100,000) through
``celery_dlq.storage.archive.EventLog`` (one ``append_events.lua`` per batch
of ``--batch``, as the mover and the operator tools append), capped at
``--events`` as the setting caps it. Every event is built by the engine's own
code from a real Celery message (``app.send_task`` into a scratch list, the
element decoded as the mover decodes it): ``event_of`` for ``parked``,
``redelivered`` and ``dead_lettered`` (the last carrying the whole dead
letter, headers built by ``headers.dead_letter_headers`` with a real
traceback, as the dead-letterer publishes it), ``letter_entries`` for
``replayed``.

The mix follows message lifecycles, as ``bench/bench_analytics.py``
generates them (seeded): each failing message fails 1 to 5 times; 35% are
dead-lettered at their last failure (5% of those replayed later), 3% are left
waiting after a park, the rest succeed after their redeliveries. That gives
about 46% ``parked``, 46% ``redelivered``, 7% ``dead_lettered`` and under 1%
``replayed`` events.

Reported: ``MEMORY USAGE <stream> SAMPLES 0`` (every node counted, not an
estimate) and the growth of ``INFO memory`` ``used_memory`` from before the
first append to after the last, both in bytes and per event; then the same
per event type, each alone in a stream of ``--per-type`` events (10,000), to
show which events weigh what. Only the archive's key is written: the store,
the queues and the DLQs are not part of these figures.

Run: ``.venv/bin/python bench/archive_size.py [--quick] [--events N] [--args-bytes B] [--json OUT]``
(under 30 s on 2 cores for 100,000 events; ``--quick``: 10,000; no worker is started).
"""
from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from celery import Celery  # noqa: E402

from bench import results as results_file  # noqa: E402
from bench.common import RedisServer, machine, parser, print_table, redis_server_version  # noqa: E402
from celery_dlq import headers as H  # noqa: E402
from celery_dlq.fingerprint import failure_group  # noqa: E402
from celery_dlq.message import Envelope, decode_raw, payload_hash  # noqa: E402
from celery_dlq.storage.archive import EventLog, EventType, event_of  # noqa: E402
from celery_dlq.storage.events import PAYLOAD_HASH, letter_entries  # noqa: E402
from celery_dlq.storage.keys import Keys  # noqa: E402

MB = 1_000_000
QUEUES = [f"queue-{i:02d}" for i in range(20)]
TASKS = [(f"app.tasks.task_{i:02d}", QUEUES[i % len(QUEUES)]) for i in range(50)]
EXCEPTIONS = ["ValueError", "KeyError", "TimeoutError", "ConnectionError", "OSError", "RuntimeError"]
WORKER = "celery@worker-07.example.internal"


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def a_traceback(app: Celery) -> str:
    """A real traceback, as a worker records one: a task raising a few frames deep, run by Celery's tracer."""
    def gateway(order: int) -> None:
        raise ConnectionError(f"payment gateway down for order {order}: connect timeout after 10.0 s")

    @app.task(name="app.tasks.charge", shared=False)
    def charge(order: int) -> None:
        gateway(order)

    result = charge.apply(args=(42,))
    assert result.failed() and result.traceback
    return result.traceback


def sample_messages(url: str, args_bytes: int) -> tuple[dict[str, Envelope], int, str]:
    """One real message per task as kombu stores it in a Redis list, decoded as the engine decodes it; the size of
    one element; a real traceback."""
    app = Celery("archive-size", broker=url)
    client = redis.Redis.from_url(url)
    out = {}
    size = 0
    try:
        args = (12345, "x" * args_bytes) if args_bytes else (12345,)
        for task, queue in TASKS:
            scratch = "bench.archive-size.sample"
            app.send_task(task, args=args, queue=scratch)
            element = client.lpop(scratch)
            size = max(size, len(element))
            out[task] = replace(decode_raw(element).as_envelope(), queue=queue, routing_key=queue, extra={})
        return out, size, a_traceback(app)
    finally:
        client.close()
        app.close()


class Lifecycles:
    """Events of failing messages, built by the engine's functions; seeded."""

    def __init__(self, messages: dict[str, Envelope], traceback_text: str, seed: int) -> None:
        self.rng = random.Random(seed)
        self.messages = messages
        self.traceback = traceback_text
        self.n = 0

    def digest(self, envelope: Envelope) -> str:
        return payload_hash(envelope.task_name, envelope.body, envelope.content_type, envelope.content_encoding)

    def failure(self, exc: str, n: int) -> dict[str, str]:
        return {"type": exc, "message": f"{exc}: order {n} failed", "traceback": self.traceback}

    def message(self) -> list[list[str]]:
        """The entries (``Event.entry``) of one message's lifecycle, in order."""
        rng = self.rng
        self.n += 1
        n = self.n
        task, queue = TASKS[min(int(rng.paretovariate(1.2)) - 1, len(TASKS) - 1)]
        base = self.messages[task]
        task_id = f"{rng.getrandbits(128):032x}"
        envelope = base.with_headers(dict(base.headers, id=task_id, root_id=task_id))
        digest = self.digest(base)
        exc = EXCEPTIONS[min(int(rng.expovariate(0.5)), len(EXCEPTIONS) - 1)]
        failure = self.failure(exc, n)
        now = time.time() - rng.randrange(28 * 86_400)
        failures = rng.choice((1, 1, 2, 2, 3, 4, 5))
        fate = rng.random()
        dead = fate < 0.35
        out: list[list[str]] = []
        retried = failures - 1 if dead else failures
        for delivery in range(1, retried + 1):
            # The parked copy carries its payload hash (the store's ``extra``), so the mover's event need not hash.
            copy = replace(envelope, headers=H.redelivery_headers(
                envelope.headers, delivery=delivery + 1, queue=queue, exchange="", routing_key=queue,
                failure=failure, now=now), extra={PAYLOAD_HASH: digest})
            out.append(event_of(EventType.PARKED, copy, ts=now, delivery=delivery, failure=failure,
                                due=now + 2.0).entry())
            if fate > 0.97 and delivery == retried:
                return out  # still waiting for its next delivery
            now += rng.uniform(1, 600)
            out.append(event_of(EventType.REDELIVERED, copy, ts=now).entry())
            envelope = copy
            now += rng.uniform(0.1, 5)
        if dead:
            reason = H.Reason.NON_RETRYABLE if failures == 1 else H.Reason.MAX_DELIVERY_ATTEMPTS
            letter_headers = H.dead_letter_headers(
                envelope.headers, delivery=failures, queue=queue, exchange="", routing_key=queue,
                failure=failure, reason=reason, worker=WORKER, now=now)
            letter_headers[H.GROUP] = failure_group(envelope.task_name, failure)
            letter_headers[H.PAYLOAD_HASH] = digest
            letter = replace(envelope, headers=letter_headers, extra={})   # as the dead-letterer publishes it
            out.append(event_of(EventType.DEAD_LETTERED, letter, ts=now, dlq=f"DLQ.{queue}",
                                with_record=True).entry())
            if rng.random() < 0.05:
                out += letter_entries(EventType.REPLAYED, [letter], dlq=f"DLQ.{queue}",
                                      now=now + rng.uniform(60, 86_400))
        return out


def fill(client: redis.Redis, keys: Keys, entries: list[list[str]], batch: int, cap: int) -> dict:
    """Append ``entries`` to a fresh stream through EventLog; what the stream and the server grew by."""
    log = EventLog(client, keys, max_length=cap)
    client.delete(keys.events)
    before = used_memory(client)
    t = time.perf_counter()
    for i in range(0, len(entries), batch):
        chunk = entries[i:i + batch]
        assert log.append_entries(chunk) == len(chunk), "an append failed (see the log)"
    seconds = time.perf_counter() - t
    after = used_memory(client)
    usage = int(client.memory_usage(keys.events, samples=0))
    length = client.xlen(keys.events)
    fields = sum(len(name) + len(text.encode()) for entry in entries for name, text in zip(
        ("v", "type", "ts_us", "task_id", "task_name", "queue", "dlq", "delivery", "reason", "exception_type",
         "exception_message", "first_failure_us", "due_us", "payload_size", "payload_hash", "worker", "record"),
        entry) if text)
    return {"events": len(entries), "xlen": length, "memory_usage": usage, "used_memory_before": before,
            "used_memory_after": after, "used_memory_growth": after - before, "field_bytes": fields,
            "append_s": round(seconds, 2)}


def main() -> None:
    cli = parser(__doc__)
    cli.add_argument("--events", type=int, default=100_000, help="events appended, and the stream's cap (100,000)")
    cli.add_argument("--per-type", type=int, default=10_000, help="events of each type alone (10,000; 0: skip)")
    cli.add_argument("--args-bytes", type=int, default=0,
                     help="text added to each task's arguments (0: args=(12345,), a message of about 0.95 kB in its "
                          "list, as in benchmark 3)")
    cli.add_argument("--batch", type=int, default=100, help="events per append (100, the mover's batch)")
    cli.add_argument("--seed", type=int, default=7)
    cli.add_argument("--json", help="write the figures to this file")
    results_file.add_argument(cli)
    args = cli.parse_args()
    if args.quick:   # a smaller stream, for a look: the figures per event barely move
        args.events, args.per_type = min(args.events, 10_000), min(args.per_type, 1_000)

    server = RedisServer().start()
    client = redis.Redis.from_url(server.url)
    try:
        print(machine())
        print(f"redis-server {redis_server_version(client)} on port {server.port} "
              f"(--save '' --appendonly no), allocator {client.info('memory').get('mem_allocator')}")
        messages, element, traceback_text = sample_messages(server.url, args.args_bytes)
        lifecycles = Lifecycles(messages, traceback_text, args.seed)
        entries: list[list[str]] = []
        while len(entries) < args.events:
            entries += lifecycles.message()
        entries = entries[:args.events]
        by_type: dict[str, int] = {}
        for entry in entries:
            by_type[entry[1]] = by_type.get(entry[1], 0) + 1
        print(f"{len(entries):,} events from {lifecycles.n:,} failing messages: "
              + ", ".join(f"{kind} {count:,} ({count / len(entries):.1%})" for kind, count in by_type.items()))
        print(f"a message as kombu stores it in its list: up to {element:,} B; the traceback: "
              f"{len(traceback_text):,} chars ({traceback_text.count(chr(10))} lines)")

        mixed = fill(client, Keys("archive-size"), entries, args.batch, args.events)
        results = {"machine": machine(), "redis": redis_server_version(client), "message_bytes": element,
                   "mix": by_type, "mixed": mixed, "per_type": {}}
        rows = [["mixed", f"{mixed['events']:,}", f"{mixed['memory_usage'] / MB:.1f} MB",
                 f"{mixed['memory_usage'] / mixed['events']:,.0f}",
                 f"{mixed['used_memory_growth'] / MB:.1f} MB",
                 f"{mixed['used_memory_growth'] / mixed['events']:,.0f}",
                 f"{mixed['field_bytes'] / mixed['events']:,.0f}"]]
        if args.per_type:
            for kind in by_type:
                alone = [entry for entry in entries if entry[1] == kind]
                while len(alone) < args.per_type:   # the rare kinds: more lifecycles until there are enough
                    alone += [entry for entry in lifecycles.message() if entry[1] == kind]
                alone = alone[:args.per_type]
                one = fill(client, Keys(f"archive-size-{kind}"), alone, args.batch, args.per_type)
                client.delete(Keys(f"archive-size-{kind}").events)
                results["per_type"][kind] = one
                rows.append([kind, f"{one['events']:,}", f"{one['memory_usage'] / MB:.1f} MB",
                             f"{one['memory_usage'] / one['events']:,.0f}",
                             f"{one['used_memory_growth'] / MB:.1f} MB",
                             f"{one['used_memory_growth'] / one['events']:,.0f}",
                             f"{one['field_bytes'] / one['events']:,.0f}"])
        print()
        print_table(["events", "n", "MEMORY USAGE", "B/event", "used_memory growth", "B/event", "field B/event"],
                    rows)
        print(f"\nused_memory {mixed['used_memory_before']:,} B before, {mixed['used_memory_after']:,} B after "
              f"the mixed stream; XLEN {mixed['xlen']:,}; appended in {mixed['append_s']} s")
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
        results_file.write(args.results, "archive_size", {
            "events": mixed["events"], "message_bytes": element,
            "memory_usage_mb.mixed": round(mixed["memory_usage"] / MB, 1),
            "used_memory_growth_mb.mixed": round(mixed["used_memory_growth"] / MB, 1),
            "bytes_per_event.mixed": round(mixed["memory_usage"] / mixed["events"]),
            **{f"share_pct.{kind}": round(100 * count / len(entries), 1) for kind, count in by_type.items()},
            **{f"bytes_per_event.{kind}": round(one["memory_usage"] / one["events"])
               for kind, one in results["per_type"].items()}},
            ["celery_dlq/storage/events.py", "celery_dlq/storage/archive.py", "celery_dlq/headers.py"],
            redis_server_version(client))
    finally:
        client.close()
        server.stop()


if __name__ == "__main__":
    main()
