"""Benchmark 2: the failure path, Celery's retry(countdown=0.1) against celery-dlq.

N tasks (5,000; 1,000 with --quick) that fail twice then succeed: 3 attempts
each, with a 0.1 s wait after each failure, through a real worker, prefork
(-c 2) and solo. Celery's side calls ``self.retry(countdown=0.1)`` (a new
message with an ETA, held in the worker until due); celery-dlq's raises, and
the original message is parked in Redis and moved back inside Redis by the
mover (interval 0.2 s, the default). Dramatiq's side (bench/dramatiq_app.py,
``dramatiq -p 1 -t 2``: one process, two threads) retries with its Retries
middleware on the same Redis. Each successful third attempt INCRs a counter;
time runs from releasing the staged messages (Celery, celery-dlq) or from the
first enqueue (Dramatiq, whose worker runs while they are enqueued) until the
counter reaches N. Variants are interleaved over the rounds; medians.

Targets: celery-dlq at least 1.5x Celery's attempts per second with prefork
and with solo, and at or above Dramatiq.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (BenchWorker, RedisServer, Stage, machine, median, parser,  # noqa: E402
                          print_table, process_cpu, redis_server_version, wait_until)

VARIANTS = ("celery", "dlq", "celery_solo", "dlq_solo", "dramatiq")
LABELS = {"celery": "Celery retry(countdown=0.1), prefork -c 2", "dlq": "celery-dlq (delay 0.1), prefork -c 2",
          "celery_solo": "Celery retry(countdown=0.1), solo", "dlq_solo": "celery-dlq (delay 0.1), solo",
          "dramatiq": "Dramatiq Retries, 1 process x 2 threads"}
ATTEMPTS = 3


def one_run(server: RedisServer, mode: str, n: int, run: int) -> tuple[float, tuple[float, float, float]]:
    """Seconds for n tasks x 3 attempts, and CPU us per attempt (worker main, pool, redis)."""
    import redis
    from celery import Celery

    client = redis.Redis.from_url(server.url)
    client.flushdb()
    queue, prefix = f"bench2.{run}", f"b2r{run}"
    if mode == "dramatiq":
        return dramatiq_run(server, client, n, queue, prefix)
    app = Celery("client", broker=server.url, set_as_current=False)
    stage = Stage(app, client, queue)
    stage.publish("bench.flaky", n)
    pool = ("solo", 1) if mode.endswith("_solo") else ("prefork", 2)
    worker = BenchWorker(server.url, queue, mode.removesuffix("_solo"), prefix=prefix, pool=pool[0],
                         concurrency=pool[1]).wait_ready(client)
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


def dramatiq_run(server: RedisServer, client, n: int, queue: str, prefix: str) -> tuple[float, tuple]:
    """Dramatiq's worker (1 process, 2 threads) on the same Redis; the messages are enqueued once it runs."""
    import importlib

    import psutil

    env = {**os.environ, "BENCH_BROKER": server.url, "BENCH_PREFIX": prefix, "BENCH_QUEUE": queue,
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    log = open(os.devnull, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "dramatiq", "bench.dramatiq_app", "-p", "1", "-t", "2",
                             "--queues", queue], env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        wait_until(lambda: any(c.get("cmd") in ("evalsha", "brpop", "bzpopmin") for c in client.client_list())
                   and psutil.Process(proc.pid).children(), timeout=60, poll=0.1, what="dramatiq ready")
        time.sleep(1.0)
        os.environ.update({"BENCH_BROKER": server.url, "BENCH_PREFIX": prefix, "BENCH_QUEUE": queue})
        from bench import dramatiq_app
        dramatiq_app = importlib.reload(dramatiq_app)   # this run's broker, namespace and queue
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        cpu0 = sum(sum(p.cpu_times()[:2]) for p in procs)
        redis0 = process_cpu(server._proc.pid)
        t0 = time.perf_counter()
        for i in range(n):
            dramatiq_app.flaky.send_with_options(args=(i,), queue_name=queue)
        t1 = wait_until(lambda: int(client.get(f"{prefix}:done") or 0) >= n, timeout=900, poll=0.02,
                        what=f"{n} flaky dramatiq messages")
        cpu1 = sum(sum(p.cpu_times()[:2]) for p in procs)
        us = 1e6 / (n * ATTEMPTS)
        return t1 - t0, ((cpu1 - cpu0) * us, 0.0, (process_cpu(server._proc.pid) - redis0) * us)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        log.close()


def main() -> None:
    args = parser(__doc__).parse_args()
    n, rounds = (1000, 1) if args.quick else (5000, 3)
    server = RedisServer().start()
    try:
        import redis
        print(f"machine: {machine()}, redis-server {redis_server_version(redis.Redis.from_url(server.url))}")
        print(f"{n} tasks x {ATTEMPTS} attempts per run, {rounds} interleaved round(s)\n")
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        cpu: dict[str, list[tuple[float, float, float]]] = {v: [] for v in VARIANTS}
        run = 0
        for r in range(rounds):
            for mode in VARIANTS:
                run += 1
                seconds, used = one_run(server, mode, n, run)
                times[mode].append(seconds)
                cpu[mode].append(used)
                print(f"  round {r + 1}: {mode:<11} {seconds:7.2f} s  {n * ATTEMPTS / seconds:7.0f} attempts/s   "
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
    for pool, dlq, celery in (("prefork -c 2", "dlq", "celery"), ("solo", "dlq_solo", "celery_solo")):
        ratio = rate[dlq] / rate[celery]
        print(f"\n{pool}: celery-dlq / Celery = {ratio:.2f}x (target >= 1.5x): {'MET' if ratio >= 1.5 else 'MISSED'}")
    best = max(rate["dlq"], rate["dlq_solo"])
    print(f"celery-dlq (best of prefork and solo, {best:.0f}/s) / Dramatiq ({rate['dramatiq']:.0f}/s) = "
          f"{best / rate['dramatiq']:.2f}x (target >= 1x): {'MET' if best >= rate['dramatiq'] else 'MISSED'}")
    print("(Dramatiq's CPU is its whole worker, main and threads, under 'main us'.)")


if __name__ == "__main__":
    main()
