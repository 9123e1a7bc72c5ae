"""Benchmark: a retry storm. One kind of task fails during an outage; another, healthy, keeps coming.

``--failing`` tasks (10,000) of ``storm.failing`` are published at a steady
rate during an outage of ``--outage`` seconds (60): each attempt fails while
it lasts, then succeeds. ``--healthy`` tasks (2,000) of ``storm.healthy`` are
published at a steady rate over the outage and as long again after it, on the
same queue. Every side retries the failing kind on the same schedule (1 s
doubling to 30 s, 20 retries: bench/storm_app.py, bench/storm_dramatiq.py):

* ``dlq_breaker``: celery-dlq with the circuit breaker (20 failures at 50 %
  in a minute open it; cool-down 5 s doubling to 30 s; release 50/s doubling
  to 1,000/s);
* ``dlq``: celery-dlq without the breaker;
* ``celery``: plain Celery, ``autoretry_for`` with ``retry_backoff`` and jitter;
* ``dramatiq``: Dramatiq's Retries middleware (``-p 1 -t 2``);
* ``quiet``: celery-dlq with the healthy kind alone: the baseline that the
  failing kind's costs are given against.

Each side runs on its own fresh redis-server database with one worker
(prefork -c 2; Dramatiq -p 1 -t 2). Reported per side: the healthy kind's
queue-to-start latency p50/p99 (over the whole run; the p99 also over the
outage and after it: the first and second half of the healthy tasks), the worker's CPU
seconds and Redis commands during the outage, both less the quiet side's
(the failing kind's share), the seconds from the outage's end until every
failing task has succeeded, and failing tasks lost (never succeeded by the
deadline) or duplicated (succeeded twice). Sides are interleaved over
``--rounds`` rounds; figures are medians, with the min-max.

A smoke run (the machine is shared): ``python bench/storm.py --failing 500
--healthy 100 --outage 10``.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RedisServer, machine, median, parser, pct, print_table, process_cpu, stop_process  # noqa: E402

SIDES = ("quiet", "dlq_breaker", "dlq", "celery", "dramatiq")
ROOT = Path(__file__).resolve().parents[1]


def start_worker(side: str, url: str, queue: str, prefix: str) -> subprocess.Popen:
    env = {**os.environ, "BENCH_BROKER": url, "BENCH_QUEUE": queue, "BENCH_PREFIX": prefix,
           "BENCH_MODE": "dlq" if side == "quiet" else side, "PYTHONPATH": str(ROOT)}
    if side == "dramatiq":
        cmd = [sys.executable, "-m", "dramatiq", "bench.storm_dramatiq", "-p", "1", "-t", "2", "--queues", queue]
    else:
        cmd = [sys.executable, "-m", "celery", "-A", "bench.storm_app", "worker", "-P", "prefork", "-c", "2",
               "-Q", queue, "-n", f"storm-{side}-{os.getpid()}@%h", "--without-heartbeat", "--without-mingle",
               "--without-gossip", "-l", "ERROR"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def tree_cpu(pid: int) -> float:
    import psutil

    proc = psutil.Process(pid)
    return sum(sum(p.cpu_times()[:2]) for p in [proc, *proc.children(recursive=True)])


def wait_ready(client, proc: subprocess.Popen, timeout: float = 60) -> None:
    import psutil

    deadline = time.monotonic() + timeout
    while not (any(c.get("cmd") in ("brpop", "blmove", "bzpopmin", "evalsha") for c in client.client_list())
               and psutil.Process(proc.pid).children()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the worker did not start")
        time.sleep(0.1)
    time.sleep(1.0)


class Sender:
    """Publishes one kind's messages: Celery's send_task, or the Dramatiq actor's send."""

    def __init__(self, side: str, url: str, queue: str, prefix: str) -> None:
        self.side, self.queue = side, queue
        if side == "dramatiq":
            os.environ.update(BENCH_BROKER=url, BENCH_PREFIX=prefix, BENCH_QUEUE=queue)
            import importlib

            from bench import storm_dramatiq
            self.dramatiq = importlib.reload(storm_dramatiq)
        else:
            from celery import Celery
            self.app = Celery("storm-client", broker=url, set_as_current=False)

    def send(self, kind: str, arg: float) -> None:
        if self.side == "dramatiq":
            getattr(self.dramatiq, kind).send(arg)
        else:
            self.app.send_task(f"storm.{kind}", args=(arg,), queue=self.queue)


def one_side(server: RedisServer, side: str, n_failing: int, n_healthy: int, outage: float,
             run: int) -> dict:
    import redis

    client = redis.Redis.from_url(server.url)
    client.flushdb()
    queue, prefix = f"storm{run}", f"st{run}"
    proc = start_worker(side, server.url, queue, prefix)
    try:
        wait_ready(client, proc)
        sender = Sender(side, server.url, queue, prefix)
        failing = 0 if side == "quiet" else n_failing
        span = 2 * outage
        healthy_done = threading.Event()

        def steady() -> None:
            gap = span / max(1, n_healthy)
            start = time.monotonic()
            for i in range(n_healthy):
                time.sleep(max(0.0, start + i * gap - time.monotonic()))
                sender.send("healthy", time.time())
            healthy_done.set()

        cpu0, cmds0 = tree_cpu(proc.pid), client.info("stats")["total_commands_processed"]
        redis_cpu0 = process_cpu(server._proc.pid)
        client.set(f"{prefix}:outage_until", time.time() + outage)
        t0 = time.monotonic()
        thread = threading.Thread(target=steady, daemon=True)
        thread.start()
        for i in range(failing):   # at a steady rate over the outage, as calls to a service keep coming
            time.sleep(max(0.0, t0 + i * outage / failing - time.monotonic()))
            sender.send("failing", i)
        time.sleep(max(0.0, t0 + outage - time.monotonic()))
        cpu1, cmds1 = tree_cpu(proc.pid), client.info("stats")["total_commands_processed"]
        redis_cpu1 = process_cpu(server._proc.pid)
        end = time.monotonic()
        deadline = end + max(120.0, 4 * outage)
        while client.scard(f"{prefix}:ok") < failing and time.monotonic() < deadline:
            time.sleep(0.1)
        recovered = time.monotonic() - end
        healthy_done.wait(span + 60)
        while client.llen(f"{prefix}:lat") < n_healthy and time.monotonic() < deadline:
            time.sleep(0.1)
        ok, runs = client.scard(f"{prefix}:ok"), int(client.get(f"{prefix}:ok_runs") or 0)
        lat = [float(x) for x in client.lrange(f"{prefix}:lat", 0, -1)]
        half = len(lat) // 2   # sent at a steady rate over twice the outage: the first half during it
        return {"p50": pct(lat, 50) * 1000, "p99": pct(lat, 99) * 1000, "cpu": cpu1 - cpu0,
                "p99_out": pct(lat[:half], 99) * 1000, "p99_after": pct(lat[half:], 99) * 1000,
                "cmds": cmds1 - cmds0, "redis_cpu": redis_cpu1 - redis_cpu0, "recovery": recovered,
                "lost": failing - ok, "dup": runs - ok, "attempts": int(client.get(f"{prefix}:attempts") or 0),
                "healthy_seen": len(lat)}
    finally:
        stop_process(proc)
        client.close()


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--failing", type=int, default=10_000)
    p.add_argument("--healthy", type=int, default=2_000)
    p.add_argument("--outage", type=float, default=60.0)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--sides", default=",".join(SIDES))
    args = p.parse_args()
    sides = [s for s in args.sides.split(",") if s]
    print(f"storm: {args.failing} failing during a {args.outage:g}s outage, {args.healthy} healthy; "
          f"{args.rounds} round(s); {machine()}")
    results: dict[str, list[dict]] = {side: [] for side in sides}
    server = RedisServer().start()
    try:
        for r in range(args.rounds):
            for i, side in enumerate(sides if r % 2 == 0 else list(reversed(sides))):
                results[side].append(one_side(server, side, args.failing, args.healthy, args.outage, r * 10 + i))
                print(f"  round {r + 1} {side}: {results[side][-1]}", flush=True)
    finally:
        server.stop()
    quiet = results.get("quiet") or []
    base_cpu = median(x["cpu"] for x in quiet) if quiet else 0.0
    base_cmds = median(x["cmds"] for x in quiet) if quiet else 0.0

    def fig(side: str, key: str, fmt: str, less: float = 0.0) -> str:
        values = [x[key] - less for x in results[side]]
        mid = format(median(values), fmt)
        return mid if len(values) == 1 else f"{mid} ({format(min(values), fmt)}-{format(max(values), fmt)})"

    print_table(["side", "healthy p50 ms", "healthy p99 ms", "p99 outage / after ms", "failing kind CPU s",
                 "failing kind Redis cmds", "attempts", "recovery s", "lost", "duplicated"],
                [[side, fig(side, "p50", ".0f"), fig(side, "p99", ".0f"),
                  f"{fig(side, 'p99_out', '.0f')} / {fig(side, 'p99_after', '.0f')}",
                  "-" if side == "quiet" else fig(side, "cpu", ".2f", base_cpu),
                  "-" if side == "quiet" else fig(side, "cmds", ".0f", base_cmds),
                  fig(side, "attempts", ".0f"), "-" if side == "quiet" else fig(side, "recovery", ".1f"),
                  fig(side, "lost", ".0f"), fig(side, "dup", ".0f")] for side in sides])


if __name__ == "__main__":
    main()
