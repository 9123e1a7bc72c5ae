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

``--before DIR`` runs each of ``quiet``, ``dlq_breaker`` and ``dlq`` that is
run also on an earlier commit's ``celery_dlq`` package (``DIR`` holds it:
``git archive <commit> celery_dlq | tar -x -C DIR``): the sides
``quiet_before``, ``dlq_breaker_before`` and ``dlq_before``, each right after
its twin in the order of the sides (which every other round reverses), their
failing kind's costs given against ``quiet_before``; then the after/before
ratios of the breaker's cuts, the failing kind's runs, CPU and commands, and
healthy p99.

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

from bench import results as results_file  # noqa: E402
from bench.common import RedisServer, machine, median, parser, pct, print_table, process_cpu, stop_process  # noqa: E402

SIDES = ("quiet", "dlq_breaker", "dlq", "celery", "dramatiq")
ROOT = Path(__file__).resolve().parents[1]
#: ``--before``: the directory holding an earlier commit's ``celery_dlq`` package, and the sides it runs.
BEFORE: str | None = None
BEFORE_OF = ("quiet", "dlq_breaker", "dlq")


def start_worker(side: str, url: str, queue: str, prefix: str) -> subprocess.Popen:
    before = side.endswith("_before")   # the earlier package first on the path, and the worker's directory
    mode = side.removesuffix("_before")
    env = {**os.environ, "BENCH_BROKER": url, "BENCH_QUEUE": queue, "BENCH_PREFIX": prefix,
           "BENCH_MODE": "dlq" if mode == "quiet" else mode,
           "PYTHONPATH": os.pathsep.join([BEFORE, str(ROOT)]) if before else str(ROOT)}
    if side == "dramatiq":
        cmd = [sys.executable, "-m", "dramatiq", "bench.storm_dramatiq", "-p", "1", "-t", "2", "--queues", queue]
    else:
        cmd = [sys.executable, "-m", "celery", "-A", "bench.storm_app", "worker", "-P", "prefork", "-c", "2",
               "-Q", queue, "-n", f"storm-{side}-{os.getpid()}@%h", "--without-heartbeat", "--without-mingle",
               "--without-gossip", "-l", "ERROR"]
    return subprocess.Popen(cmd, cwd=BEFORE if before else ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


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
        failing = 0 if side.startswith("quiet") else n_failing
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
    p.add_argument("--before", default=None, metavar="DIR",
                   help="a directory holding an earlier celery_dlq package: quiet, dlq_breaker and dlq on it too")
    results_file.add_argument(p)
    args = p.parse_args()
    global BEFORE
    BEFORE = args.before
    sides = [s for s in args.sides.split(",") if s]
    if any(s.endswith("_before") for s in sides):
        p.error("--sides names no _before side: --before DIR runs each of quiet, dlq_breaker and dlq's twin")
    if BEFORE:   # each twin right after its side
        sides = [x for s in sides for x in ((s, f"{s}_before") if s in BEFORE_OF else (s,))]
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
    quiet_before = results.get("quiet_before") or []   # --before: the earlier package's sides' baseline
    before_cpu = median(x["cpu"] for x in quiet_before) if quiet_before else 0.0
    before_cmds = median(x["cmds"] for x in quiet_before) if quiet_before else 0.0

    def fig(side: str, key: str, fmt: str, less: float = 0.0) -> str:
        values = [x[key] - less for x in results[side]]
        mid = format(median(values), fmt)
        return mid if len(values) == 1 else f"{mid} ({format(min(values), fmt)}-{format(max(values), fmt)})"

    def base(side: str) -> tuple[float, float]:
        return (before_cpu, before_cmds) if side.endswith("_before") else (base_cpu, base_cmds)

    print_table(["side", "healthy p50 ms", "healthy p99 ms", "p99 outage / after ms", "failing kind CPU s",
                 "failing kind Redis cmds", "attempts", "recovery s", "lost", "duplicated"],
                [[side, fig(side, "p50", ".0f"), fig(side, "p99", ".0f"),
                  f"{fig(side, 'p99_out', '.0f')} / {fig(side, 'p99_after', '.0f')}",
                  "-" if side.startswith("quiet") else fig(side, "cpu", ".2f", base(side)[0]),
                  "-" if side.startswith("quiet") else fig(side, "cmds", ".0f", base(side)[1]),
                  fig(side, "attempts", ".0f"), "-" if side.startswith("quiet") else fig(side, "recovery", ".1f"),
                  fig(side, "lost", ".0f"), fig(side, "dup", ".0f")] for side in sides])
    run = {"failing": args.failing, "healthy": args.healthy, "outage_s": args.outage, "rounds": args.rounds}
    by_side = results_by_side(results)
    out = figures({side: m for side, m in by_side.items() if not side.endswith("_before")}, base_cpu, base_cmds)
    if BEFORE:
        out.update(before_figures(by_side, base_cpu, base_cmds, before_cpu, before_cmds))
        print("\n--before: after/before (each side over its _before twin):")
        print_table(["figure", "after/before"], [[name.removeprefix("after_before."), value]
                                                 for name, value in out.items() if name.startswith("after_before.")])
    results_file.write(args.results, "storm", {**run, **out}, results_file.ENGINE)


def results_by_side(runs: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    """Each side's medians over its rounds."""
    return {side: {key: median(x[key] for x in rows) for key in rows[0]} for side, rows in runs.items() if rows}


def figures(results_by_side: dict[str, dict[str, float]], base_cpu: float, base_cmds: float) -> dict[str, float]:
    """The figures by name: per side, and the breaker's cut and p99 ratio as the docs quote them."""
    out: dict[str, float] = {}
    for side, m in results_by_side.items():
        out[f"healthy_p50_ms.{side}"] = round(m["p50"], 1)
        out[f"healthy_p99_ms.{side}"] = round(m["p99"], 1)
        out[f"lost.{side}"], out[f"duplicated.{side}"] = m["lost"], m["dup"]
        if not side.startswith("quiet"):
            out[f"failing_cpu_s.{side}"] = round(m["cpu"] - base_cpu, 2)
            out[f"failing_cmds.{side}"] = round(m["cmds"] - base_cmds)
    breaker, plain, quiet = (results_by_side.get(s) for s in ("dlq_breaker", "dlq", "quiet"))
    if breaker and plain:
        out["breaker_cpu_cut_pct"] = round(100 * (1 - (breaker["cpu"] - base_cpu) / (plain["cpu"] - base_cpu)))
        out["breaker_cmds_cut_pct"] = round(100 * (1 - (breaker["cmds"] - base_cmds) / (plain["cmds"] - base_cmds)))
    if breaker and quiet:
        out["breaker_p99_over_quiet"] = round(breaker["p99"] / quiet["p99"], 2)
    return out


def before_figures(results_by_side: dict[str, dict[str, float]], base_cpu: float, base_cmds: float,
                   before_cpu: float, before_cmds: float) -> dict[str, float]:
    """``--before``: the _before sides' figures (:func:`figures` names them by side, against quiet_before), their
    breaker's cuts and p99 ratio (``<figure>.before``), each twin's runs of the failing kind (``attempts.<side>``),
    and the after/before ratios (``after_before.<figure>``: this checkout's over the earlier package's)."""
    twins = {side: m for side, m in results_by_side.items() if side.endswith("_before")}
    out = {name: value for name, value in figures(twins, before_cpu, before_cmds).items()
           if name.endswith("_before")}
    named = {side.removesuffix("_before"): m for side, m in twins.items()}
    cuts = {name: value for name, value in figures(named, before_cpu, before_cmds).items()
            if name.startswith("breaker_")}
    out.update({f"{name}.before": value for name, value in cuts.items()})
    after = figures(results_by_side, base_cpu, base_cmds)
    for name, value in cuts.items():
        if name in after and value > 0:
            out[f"after_before.{name}"] = round(after[name] / value, 2)
    for side in (side for side in named if side in results_by_side):
        now, then = results_by_side[side], named[side]
        out[f"attempts.{side}"], out[f"attempts.{side}_before"] = round(now["attempts"]), round(then["attempts"])
        pairs = [("attempts", now["attempts"], then["attempts"]), ("healthy_p99_ms", now["p99"], then["p99"])]
        if not side.startswith("quiet"):
            pairs += [("failing_cpu_s", now["cpu"] - base_cpu, then["cpu"] - before_cpu),
                      ("failing_cmds", now["cmds"] - base_cmds, then["cmds"] - before_cmds)]
        for name, a, b in pairs:
            if b > 0:
                out[f"after_before.{name}.{side}"] = round(a / b, 2)
    return out


if __name__ == "__main__":
    main()
