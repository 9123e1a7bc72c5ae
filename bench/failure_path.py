"""Benchmark 2: the failure path, Celery's retry(countdown=0.1) against celery-dlq.

N tasks (5,000; 1,000 with --quick) that fail twice then succeed, through a
real prefork worker (-c 2): 3 attempts each, with a 0.1 s wait after each
failure. Celery's side calls ``self.retry(countdown=0.1)`` (a new message with
an ETA, held in the worker until due); celery-dlq's raises, and the original
message is parked in Redis and moved back by the mover (interval 0.2 s,
the default). Each successful third attempt INCRs a counter (both sides);
time runs from releasing the staged messages until the counter reaches N.

Target: celery-dlq at least 1.5x Celery's attempts per second.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (BenchWorker, RedisServer, Stage, machine, median, parser,  # noqa: E402
                          print_table, process_cpu, redis_server_version, wait_until)

VARIANTS = ("celery", "dlq")
LABELS = {"celery": "Celery retry(countdown=0.1)", "dlq": "celery-dlq (delay 0.1, persist on)"}
ATTEMPTS = 3


def one_run(server: RedisServer, mode: str, n: int, run: int) -> tuple[float, tuple[float, float, float]]:
    """Seconds for n tasks x 3 attempts, and CPU us per attempt (worker main, pool, redis)."""
    import redis
    from celery import Celery

    client = redis.Redis.from_url(server.url)
    client.flushdb()
    queue, prefix = f"bench2.{run}", f"b2r{run}"
    app = Celery("client", broker=server.url, set_as_current=False)
    stage = Stage(app, client, queue)
    stage.publish("bench.flaky", n)
    worker = BenchWorker(server.url, queue, mode, prefix=prefix).wait_ready(client)
    try:
        main0, kids0 = worker.cpu()
        redis0 = process_cpu(server._proc.pid)
        t0 = stage.release()
        done = f"{prefix}:done"
        t1 = wait_until(lambda: int(client.get(done) or 0) >= n, timeout=900, poll=0.02,
                        what=f"{n} flaky tasks of {mode}")
        main1, kids1 = worker.cpu()
        us = 1e6 / (n * ATTEMPTS)
        return t1 - t0, ((main1 - main0) * us, (kids1 - kids0) * us,
                         (process_cpu(server._proc.pid) - redis0) * us)
    finally:
        worker.stop()
        app.close()
        client.close()


def main() -> None:
    args = parser(__doc__).parse_args()
    n, rounds = (1000, 1) if args.quick else (5000, 2)
    server = RedisServer().start()
    try:
        import redis
        print(f"machine: {machine()}, redis-server {redis_server_version(redis.Redis.from_url(server.url))}")
        print(f"{n} tasks x {ATTEMPTS} attempts per run, {rounds} round(s), worker -P prefork -c 2\n")
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        cpu: dict[str, list[tuple[float, float, float]]] = {v: [] for v in VARIANTS}
        run = 0
        for r in range(rounds):
            for mode in VARIANTS:
                run += 1
                seconds, used = one_run(server, mode, n, run)
                times[mode].append(seconds)
                cpu[mode].append(used)
                print(f"  round {r + 1}: {mode:<8} {seconds:7.2f} s  {n * ATTEMPTS / seconds:7.0f} attempts/s   "
                      f"CPU per attempt: worker main {used[0]:5.0f} us, pool {used[1]:5.0f} us, "
                      f"redis {used[2]:4.0f} us (load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        server.stop()
    rows = []
    rate = {m: n * ATTEMPTS / median(times[m]) for m in VARIANTS}
    for mode in VARIANTS:
        rows.append([LABELS[mode], f"{median(times[mode]):.2f}", f"{rate[mode]:.0f}",
                     f"{rate[mode] / rate['celery']:.2f}x", " ".join(f"{x:.2f}" for x in times[mode])])
    print()
    print_table(["variant", "median s", "attempts/s", "vs Celery", "runs (s)"], rows)
    med = {m: tuple(median(c[i] for c in cpu[m]) for i in range(3)) for m in VARIANTS}
    print("\nCPU per attempt (median):")
    print_table(["variant", "main us", "pool us", "redis us", "total us"],
                [[LABELS[m], *(f"{x:.0f}" for x in med[m]), f"{sum(med[m]):.0f}"] for m in VARIANTS])
    ratio = rate["dlq"] / rate["celery"]
    print(f"\ncelery-dlq / Celery = {ratio:.2f}x (target >= 1.5x): {'MET' if ratio >= 1.5 else 'MISSED'}")


if __name__ == "__main__":
    main()
