"""Benchmark 5: redelivery punctuality at 1,000 due per second.

Parked messages come due at a steady 1,000 per second for D seconds (30;
10 with --quick). Each carries its due time in a header; a consumer thread
here BRPOPs the queue and records when each message arrived, so lateness =
arrival - due, i.e. how late the message was back on its queue (the
redelivery), not when a task started (that would add the workers' queueing).

- celery-dlq: the mover of a real ``celery worker`` (prefork -c 2, consuming
  another, idle queue) with the default ``dlq_mover_interval`` of 0.2 s; it
  ticks at that interval and also wakes for the next due entry when that is
  sooner (at most every 20 ms);
- raw: a loop in this process that runs the benchmark's raw Lua move (see
  bench/mover.py) every 0.2 s: the lateness that polling at that interval
  costs by itself;

Target: p99 < 2 x dlq_mover_interval + 50 ms = 450 ms.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import results as results_file  # noqa: E402
from bench.common import BenchWorker, RedisServer, machine, parser, pct, print_table, redis_server_version  # noqa: E402
from bench.mover import RAW_MOVE, make_app, sample_payload  # noqa: E402

QUEUE = "bench4"  # the queue the sample payload names
RATE = 1000
INTERVAL = 0.2
LEAD = 3.0  # seconds between parking and the first due time


def park_schedule(dlq, payload: bytes, n: int, start: float, raw: bool = False) -> None:
    """Park n entries due at start + i / RATE, each with its due time in a header.

    What the engine parks on a Redis broker (the direct format); for the raw
    side the element alone, which the raw move pushes as it is.
    """
    from celery_dlq.storage.store import DirectPayload

    direct = DirectPayload.loads(payload)
    doc = json.loads(direct.element)
    entries = []
    for i in range(n):
        due = start + i / RATE
        doc["headers"]["bench-due"] = due
        doc["headers"]["id"] = f"punct-{i}"
        element = json.dumps(doc).encode()
        stored = element if raw else DirectPayload(direct.queue, direct.dest, direct.task, element).dumps()
        entries.append((f"punct-{i}:2", stored, QUEUE, due))
    # The library's own park, pipelined (ParkedStore.park_many builds park.lua's KEYS and ARGV).
    for start_at in range(0, n, 2000):
        dlq.redis().store.park_many(entries[start_at:start_at + 2000])


def collect(url: str, n: int, timeout: float, out: list[float]) -> None:
    import redis

    client = redis.Redis.from_url(url)
    deadline = time.time() + timeout
    while len(out) < n and time.time() < deadline:
        item = client.brpop([QUEUE], timeout=1)
        if item is None:
            continue
        arrived = time.time()
        out.append(arrived - json.loads(item[1])["headers"]["bench-due"])
    client.close()


def run(url: str, side: str, n: int, payload: bytes, seconds: float) -> list[float]:
    import redis

    from celery_dlq.storage.store import to_ms
    from celery_dlq.worker.runtime import runtime_of

    prefix = f"b5{side}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    app = make_app(url, prefix)
    dlq = runtime_of(app)
    worker = None
    stop = threading.Event()
    if side == "dlq":
        worker = BenchWorker(url, "bench5.idle", "dlq", prefix=prefix,
                             conf=json.dumps({"dlq_mover_interval": INTERVAL})).wait_ready(client)
    else:
        move = client.register_script(RAW_MOVE)
        keys = [dlq.redis().keys.delayed, dlq.redis().keys.payloads, QUEUE]

        def raw_mover() -> None:
            while not stop.wait(INTERVAL):
                while move(keys=keys, args=[to_ms(time.time()), 100]) == 100:
                    pass
        threading.Thread(target=raw_mover, daemon=True).start()
    try:
        start = time.time() + LEAD
        park_schedule(dlq, payload, n, start, raw=side == "raw")
        assert time.time() < start, "parking took longer than the lead time"
        lateness: list[float] = []
        collect(url, n, LEAD + seconds + 30, lateness)
        return lateness
    finally:
        stop.set()
        if worker is not None:
            worker.stop()
        app.close()
        client.close()


def main() -> None:
    p = parser(__doc__)
    results_file.add_argument(p)
    args = p.parse_args()
    seconds = 10 if args.quick else 30
    n = RATE * seconds
    server = RedisServer().start()
    try:
        import redis
        from celery import Celery

        client = redis.Redis.from_url(server.url)
        print(f"machine: {machine()}, redis-server {redis_server_version(client)}")
        payload = sample_payload(Celery("s", broker=server.url, set_as_current=False), client)
        print(f"{n} redeliveries due at {RATE}/s over {seconds} s, mover interval {INTERVAL} s\n")
        results = {}
        for side in ("dlq", "raw"):
            results[side] = lat = run(server.url, side, n, payload, seconds)
            print(f"  {side:<4} {len(lat)} arrived, p50 {pct(lat, 50) * 1000:6.1f} ms, "
                  f"p99 {pct(lat, 99) * 1000:6.1f} ms, max {max(lat) * 1000:6.1f} ms", flush=True)
        client.close()
    finally:
        server.stop()
    rows = []
    for side, label in (("dlq", "celery-dlq mover (real worker)"), ("raw", "raw Lua move, same interval")):
        lat = results[side]
        rows.append([label, len(lat), *(f"{pct(lat, q) * 1000:.1f}" for q in (50, 90, 99, 99.9)),
                     f"{max(lat) * 1000:.1f}", f"{min(lat) * 1000:.1f}"])
    print()
    print_table(["side", "arrived", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms", "min ms"], rows)
    p99 = pct(results["dlq"], 99)
    target = 2 * INTERVAL + 0.05
    lost = n - len(results["dlq"])
    print(f"\ncelery-dlq p99 {p99 * 1000:.0f} ms (target < {target * 1000:.0f} ms): "
          f"{'MET' if p99 < target and not lost else 'MISSED'}" + (f"; {lost} never arrived" if lost else ""))
    results_file.write(args.results, "punctuality", {
        "redeliveries": n, "lost": lost,
        **{f"late_p{q}_ms.{side}": round(pct(results[side], q) * 1000, 1) for side in results for q in (50, 99)}},
        results_file.ENGINE)


if __name__ == "__main__":
    main()
