"""Benchmark 2: the failure path, Celery's retry(countdown=0.1) against celery-dlq and Dramatiq.

N tasks (5,000; 1,000 with --quick) that fail twice then succeed: 3 attempts
each, with a 0.1 s wait after each failure (Dramatiq's: 50 to 100 ms, its
jitter; see bench/dramatiq_app.py), through a real worker, prefork
(-c 2) and solo. Celery's side calls ``self.retry(countdown=0.1)`` (a new
message with an ETA, held in the worker until due); celery-dlq's raises, and
the original message is parked in Redis and moved back inside Redis by the
mover. Dramatiq's side (bench/dramatiq_app.py) retries with its Retries
middleware on the same Redis, run at its own default (``-p`` = CPU count,
``-t 8``) and at ``-p 1 -t 2``; the better of the two is its headline.

Every side publishes before the clock and starts it from the same state:
the messages are published, their list is renamed aside, the worker starts
and waits on Redis, warm-up messages of the run's kind (failing like the
others, or succeeding) go through the worker, their count is reset, and the
list is renamed back at once (t0). So no side starts idle: each of
Dramatiq's worker processes, whose consumers (its queue's and its delay
queue's) back off to polls up to 1 s apart while idle, has just run one (a
round of one message per process is sent until each has), as celery-dlq's
fetch and mover and Celery's consumer have (one message: one process
fetches). Each successful (last) attempt INCRs a counter; the clock stops
when it reaches N.

The same run measures each system's success path: N tasks that succeed at
once (``bench.ok``, Dramatiq's ``ok``), so each failure path is also given as
a share of its own success-path tasks/s. Variants are interleaved over the
rounds (three full runs; one with --quick); each headline is the median and
the min-max of the runs.

Targets: celery-dlq at least 1.5x Celery's attempts per second with prefork
and with solo, and at or above Dramatiq.

``--attempts 4 --tasks 1000`` is the long-standing shape (1,000 tasks x 4
attempts). ``--before DIR`` adds the sides ``dlq_before`` and
``dlq_before_solo``: celery-dlq as an earlier commit had it (``DIR`` holds
its ``celery_dlq`` package: ``git archive <commit> celery_dlq | tar -x -C
DIR``), interleaved with the others, so a change is measured before and
after in one run. ``--sides`` keeps only some sides (``celery,dlq``).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import results as results_file  # noqa: E402
from bench.common import (  # noqa: E402
    BenchWorker,
    RedisServer,
    Stage,
    machine,
    median,
    parser,
    print_table,
    process_cpu,
    redis_server_version,
    wait_until,
)

SIDES = ("celery", "dlq", "celery_solo", "dlq_solo", "dramatiq", "dramatiq_p1t2")
BEFORE_SIDES = ("dlq_before", "dlq_before_solo")
LABELS = {"celery": "Celery retry(countdown=0.1), prefork -c 2", "dlq": "celery-dlq (delay 0.1), prefork -c 2",
          "celery_solo": "Celery retry(countdown=0.1), solo", "dlq_solo": "celery-dlq (delay 0.1), solo",
          "dramatiq": f"Dramatiq Retries, default: -p {os.cpu_count()} -t 8",
          "dramatiq_p1t2": "Dramatiq Retries, -p 1 -t 2",
          "dlq_before": "celery-dlq before (--before), prefork -c 2",
          "dlq_before_solo": "celery-dlq before (--before), solo"}
ATTEMPTS = 3
#: ``--before``: the directory holding the earlier ``celery_dlq`` package.
BEFORE: str | None = None
DRAMATIQ_OPTIONS = {"dramatiq": (), "dramatiq_p1t2": ("-p", "1", "-t", "2")}


def attempts(mode: str) -> int:
    return 1 if mode.endswith("_ok") else ATTEMPTS


def one_run(server: RedisServer, mode: str, n: int, run: int) -> tuple[float, tuple[float, float, float]]:
    """Seconds for n tasks (x 3 attempts on the failure path), and CPU us per attempt (worker main, pool, redis)."""
    import redis
    from celery import Celery

    client = redis.Redis.from_url(server.url)
    client.flushdb()
    queue, prefix = f"bench2.{run}", f"b2r{run}"
    side = mode.removesuffix("_ok")
    if side.startswith("dramatiq"):
        return dramatiq_run(server, client, n, queue, prefix, DRAMATIQ_OPTIONS[side], ok=mode.endswith("_ok"))
    app = Celery("client", broker=server.url, set_as_current=False)
    stage = Stage(app, client, queue)
    stage.publish("bench.ok" if mode.endswith("_ok") else "bench.flaky", n)
    pool = ("solo", 1) if side.endswith("_solo") else ("prefork", 2)
    before = side.startswith("dlq_before")
    worker = BenchWorker(server.url, queue, "dlq" if before else side.removesuffix("_solo"), prefix=prefix,
                         pool=pool[0], concurrency=pool[1], package=BEFORE if before else None).wait_ready(client)
    try:
        done = f"{prefix}:done"
        warm_up(client, prefix, lambda: app.send_task("bench.ok" if mode.endswith("_ok") else "bench.flaky",
                                                      args=(-1,), queue=queue))
        main0, kids0 = worker.cpu()
        redis0 = process_cpu(server._proc.pid)
        t0 = stage.release()
        t1 = wait_until(lambda: int(client.get(done) or 0) >= n, timeout=900, poll=0.02,
                        what=f"{n} tasks of {mode}")
        main1, kids1 = worker.cpu()
        us = 1e6 / (n * attempts(mode))
        return t1 - t0, ((main1 - main0) * us, (kids1 - kids0) * us,
                         (process_cpu(server._proc.pid) - redis0) * us)
    finally:
        worker.stop()
        app.close()
        client.close()


def warm_up(client, prefix: str, send, processes: int = 1) -> None:
    """Rounds of ``processes`` warm-up messages (``send`` publishes one) through the waiting worker until each of
    its ``processes`` fetching processes ran one (Dramatiq's ``warm`` records them in ``<prefix>:warm``; a
    Celery worker fetches in one process), then the counts reset: every side starts its clock just after
    taking a message, none backed off by idling (module docstring)."""
    done, warm, sent = f"{prefix}:done", f"{prefix}:warm", 0
    for _ in range(50):
        for _ in range(processes):
            send()
        sent += processes
        wait_until(lambda sent=sent: int(client.get(done) or 0) >= sent, timeout=120, poll=0.005,
                   what="warm-up messages")
        if processes == 1 or client.scard(warm) >= processes:
            client.delete(done, warm)
            return
    raise RuntimeError(f"after {sent} warm-up messages, {client.scard(warm)} of {processes} processes ran one")


def dramatiq_run(server: RedisServer, client, n: int, queue: str, prefix: str, options: tuple[str, ...],
                 ok: bool = False) -> tuple[float, tuple]:
    """Dramatiq's worker on the same Redis; its messages are published first and renamed aside until it waits."""
    import importlib

    import psutil

    env = {**os.environ, "BENCH_BROKER": server.url, "BENCH_PREFIX": prefix, "BENCH_QUEUE": queue,
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    os.environ.update({"BENCH_BROKER": server.url, "BENCH_PREFIX": prefix, "BENCH_QUEUE": queue})
    from bench import dramatiq_app
    dramatiq_app = importlib.reload(dramatiq_app)   # this run's broker, namespace and queue
    actor = dramatiq_app.ok if ok else dramatiq_app.flaky
    fails = 0 if ok else ATTEMPTS - 1
    for i in range(n):
        actor.send_with_options(args=(i,), queue_name=queue)
    key = f"dramatiq-{prefix}:{queue}"
    assert client.llen(key) == n, "someone consumed the staged queue"
    client.rename(key, f"{key}:staged")
    log = open(os.devnull, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "dramatiq", "bench.dramatiq_app", *options,
                             "--queues", queue], env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        wait_until(lambda: any(c.get("cmd") in ("evalsha", "brpop", "bzpopmin") for c in client.client_list())
                   and psutil.Process(proc.pid).children(), timeout=60, poll=0.1, what="dramatiq ready")
        processes = int(options[options.index("-p") + 1]) if "-p" in options else os.cpu_count() or 1
        warm_up(client, prefix, lambda: dramatiq_app.warm.send_with_options(args=(fails,), queue_name=queue),
                processes)
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        cpu0 = sum(sum(p.cpu_times()[:2]) for p in procs)
        redis0 = process_cpu(server._proc.pid)
        t0 = time.monotonic()
        client.rename(f"{key}:staged", key)
        t1 = wait_until(lambda: int(client.get(f"{prefix}:done") or 0) >= n, timeout=900, poll=0.02,
                        what=f"{n} dramatiq messages")
        cpu1 = sum(sum(p.cpu_times()[:2]) for p in procs)
        us = 1e6 / (n * (1 if ok else ATTEMPTS))
        return t1 - t0, ((cpu1 - cpu0) * us, 0.0, (process_cpu(server._proc.pid) - redis0) * us)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        log.close()


def spread(values: list[float]) -> str:
    return f"{median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def main() -> None:
    global ATTEMPTS, BEFORE, SIDES
    p = parser(__doc__)
    p.add_argument("--tasks", type=int, default=None, help="tasks per run (default 5,000; 1,000 with --quick)")
    p.add_argument("--attempts", type=int, default=3, help="attempts per task, all but the last failing (3)")
    p.add_argument("--before", default=None, help="a directory holding an earlier celery_dlq package")
    p.add_argument("--sides", default=None, help="comma-separated sides to run (default: all)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3; 1 with --quick)")
    results_file.add_argument(p)
    args = p.parse_args()
    n, rounds = (1000, 1) if args.quick else (5000, 3)
    n, rounds = args.tasks or n, args.rounds or rounds
    ATTEMPTS, BEFORE = args.attempts, args.before
    os.environ["BENCH_ATTEMPTS"] = str(ATTEMPTS)
    SIDES = (*SIDES, *(BEFORE_SIDES if BEFORE else ()))
    if args.sides:
        SIDES = tuple(side for side in SIDES if side in args.sides.split(","))
    server = RedisServer().start()
    try:
        import redis
        server_version = redis_server_version(redis.Redis.from_url(server.url))
        print(f"machine: {machine()}, redis-server {server_version}")
        print(f"{n} tasks per run, {rounds} interleaved round(s)\n")
        variants = (*SIDES, *(f"{side}_ok" for side in SIDES))   # each failure path, then its success path
        times: dict[str, list[float]] = {v: [] for v in variants}
        cpu: dict[str, list[tuple[float, float, float]]] = {v: [] for v in variants}
        run = 0
        for r in range(rounds):
            for mode in variants:
                run += 1
                seconds, used = one_run(server, mode, n, run)
                times[mode].append(seconds)
                cpu[mode].append(used)
                print(f"  round {r + 1}: {mode:<18} {seconds:7.2f} s  {n * attempts(mode) / seconds:7.0f} /s   "
                      f"CPU per attempt: worker main {used[0]:5.0f} us, pool {used[1]:5.0f} us, "
                      f"redis {used[2]:4.0f} us (load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        server.stop()
    figures = report(n, times, cpu)
    results_file.write(args.results, "failure_path", {"tasks": n, "attempts": ATTEMPTS, "rounds": rounds, **figures},
                  results_file.ENGINE, server_version)


def report(n: int, times: dict[str, list[float]], cpu: dict[str, list[tuple[float, float, float]]]) -> dict:
    """Print the tables; return the figures by name (ratios are medians of the rounds' ratios)."""
    figures: dict[str, float] = {}
    per_run = {m: [n * attempts(m) / t for t in times[m]] for m in times}
    rate = {m: median(per_run[m]) for m in times}
    print()
    print_table(["side", "failure attempts/s: median (min-max)", "vs Celery", "success tasks/s", "share"],
                [[LABELS[m], spread(per_run[m]), f"{rate[m] / rate['celery']:.2f}x", spread(per_run[f"{m}_ok"]),
                  f"{rate[m] / rate[f'{m}_ok']:.0%}"] for m in SIDES])
    print("(share: failure-path attempts/s as a share of the same system's success-path tasks/s, medians)")
    med = {m: tuple(median(c[i] for c in cpu[m]) for i in range(3)) for m in SIDES}
    print("\nCPU per failure-path attempt (median):")
    print_table(["side", "main us", "pool us", "redis us", "total us"],
                [[LABELS[m], *(f"{x:.0f}" for x in med[m]), f"{sum(med[m]):.0f}"] for m in SIDES])
    for m in SIDES:
        figures[f"attempts_per_s.{m}"] = round(rate[m])
        figures[f"success_per_s.{m}"] = round(rate[f"{m}_ok"])
        figures[f"cpu_us_per_attempt.{m}"] = round(sum(med[m]))
    pairs = (("prefork -c 2", "dlq", "celery"), ("solo", "dlq_solo", "celery_solo"),
             ("prefork -c 2, before", "dlq_before", "celery"), ("solo, before", "dlq_before_solo", "celery_solo"))
    for pool, dlq, celery in pairs:
        if dlq not in times or celery not in times:
            continue
        ratios = [d / c for d, c in zip(per_run[dlq], per_run[celery])]
        name = dlq.replace("dlq", "ratio", 1)
        figures[name], figures[f"{name}.min"], figures[f"{name}.max"] = (
            round(median(ratios), 2), round(min(ratios), 2), round(max(ratios), 2))
        print(f"\n{pool}: celery-dlq / Celery = {median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}, per "
              f"round) (target >= 1.5x): {'MET' if median(ratios) >= 1.5 else 'MISSED'}")
    if "dramatiq" not in rate or "dlq" not in rate:
        return figures
    dramatiq = max(("dramatiq", "dramatiq_p1t2"), key=lambda m: rate[m])
    best = max(("dlq", "dlq_solo"), key=lambda m: rate[m])
    print(f"celery-dlq (best: {LABELS[best]}, {rate[best]:.0f}/s) / Dramatiq (best: {LABELS[dramatiq]}, "
          f"{rate[dramatiq]:.0f}/s) = {rate[best] / rate[dramatiq]:.2f}x (target >= 1x): "
          f"{'MET' if rate[best] >= rate[dramatiq] else 'MISSED'}")
    print("(Dramatiq's CPU is its whole worker, main and threads, under 'main us'.)")
    figures["best_dlq_over_best_dramatiq"] = round(rate[best] / rate[dramatiq], 2)
    return figures


if __name__ == "__main__":
    main()
