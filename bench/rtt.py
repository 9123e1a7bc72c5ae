"""Benchmark: throughput and round trips per task with Redis a round trip away (0, 0.5, 1 and 2 ms).

Production Redis is across a network, where round trips, not commands or
CPU, decide throughput (issue 46). Every client of the benchmark's own
redis-server (the workers and the publisher) reaches it through
``bench/rtt_proxy.py``'s proxy, which counts round trips per connection on
the client side and, where ``tc netem`` cannot delay the benchmark's port
(``--delay-method auto`` tries it: a prio root qdisc on ``lo`` whose fourth
band holds netem, selected by u32 filters on the Redis port only, removed on
exit), also adds the delay. The proxy's own cost is shown: PING round trips
through it at every setting, idle (200 PINGs) and under load (a probe every
20 ms through a second proxy at the same setting during each timed window),
and the CPU its threads used. The benchmark's own control connection
(staging, the done counter, INFO) goes to Redis directly, so it is neither
delayed nor counted; so does each task's INCR of the done counter
(``BENCH_COUNTER_URL``, and Celery's ``broker_url`` given in ``BENCH_CONF``).

Sides, in one run, rounds interleaved, medians: plain Celery prefork -c 2
and threads -c 8, celery-dlq prefork -c 2 (``bench/app.py``: ``install(app)``,
tasks ``base=RedeliveryTask``), Dramatiq -p 2 -t 8 (``bench/dramatiq_app.py``).
Workloads: the success path (N tasks that only INCR the done counter) and
the failure path (tasks x 4 attempts, 0.1 s apart: Celery ``retry(countdown=
0.1)``, celery-dlq redelivery_delay 0.1, Dramatiq Retries min = max backoff
100 ms, so 50-100 ms with its jitter). Every side publishes before the clock
(through the proxy: the publisher's round trips per task are counted there)
and starts warm, as bench/failure_path.py does.

The full run (3 rounds, 0/0.5/1/2 ms, 2,000 successes, 1,000 x 4 attempts)
takes about 45 minutes on 2 cores; ``--quick`` (300 and 100 x 4, one round,
0 and 1 ms) about 3.

Figures per side, workload and delay: tasks/s (attempts/s on the failure
path) and their ratio to plain Celery prefork at the same delay; the
workers' round trips per task through the proxy in the timed window (idle
polls and beats included), split by process (the worker's main process, its
pool children; matched by the connection's port); the server's commands per task (INFO
commandstats, less the benchmark's own and the done counter's INCR).
"""
from __future__ import annotations

import atexit
import importlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from bench import results as results_file  # noqa: E402
from bench.common import (  # noqa: E402
    ROOT,
    BenchWorker,
    RedisServer,
    Stage,
    median,
    parser,
    pct,
    print_table,
    process_cpu,
    redis_server_version,
    wait_until,
)
from bench.failure_path import warm_up  # noqa: E402
from bench.rtt_proxy import DelayProxy, calibrate, ping_rtt  # noqa: E402

SIDES = ("celery", "celery_threads", "dlq", "dramatiq")
LABELS = {"celery": "Celery, prefork -c 2", "celery_threads": "Celery, threads -c 8",
          "dlq": "celery-dlq, prefork -c 2", "dramatiq": "Dramatiq, -p 2 -t 8"}
WORKLOADS = {"ok": "success path", "fail": "failure path"}
ATTEMPTS = 4
DRAMATIQ_OPTIONS = ("-p", "2", "-t", "8")
PROBE_GAP = 0.02
#: ``--threads``: plain Celery's threads pool size
THREADS = 8


# -- the delay -------------------------------------------------------------------------------------------------
class Netem:
    """``tc netem`` delaying some TCP ports on loopback (the benchmark's and the probe's redis-servers): prio
    root (4 bands, the usual priomap on the first three), netem under band 4, u32 filters on each port as source
    and as destination. Half the delay each way. Untried on the machine this was written on (no sch_prio)."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.installed = False

    def _tc(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["tc", *args], capture_output=True, text=True, timeout=10)

    def install(self) -> str | None:
        """Install it (no delay yet); None when done, else why it cannot be used here."""
        if shutil.which("tc") is None:
            return "tc is not installed"
        shown = self._tc("qdisc", "show", "dev", "lo").stdout
        if shown.strip() and not shown.startswith("qdisc noqueue 0: root"):
            return f"lo already has a root qdisc, left alone: {shown.strip()}"
        root = self._tc("qdisc", "add", "dev", "lo", "root", "handle", "1:", "prio", "bands", "4",
                        "priomap", *"1 2 2 2 1 2 0 0 1 1 1 1 1 1 1 1".split())
        if root.returncode:
            return f"tc qdisc add ... prio: {root.stderr.strip()}"
        self.installed = True
        atexit.register(self.remove)
        steps = [("qdisc", "add", "dev", "lo", "parent", "1:4", "handle", "40:", "netem", "delay", "0us"),
                 *(("filter", "add", "dev", "lo", "parent", "1:0", "protocol", "ip", "prio", "1", "u32",
                    "match", "ip", direction, str(port), "0xffff", "flowid", "1:4")
                   for port in self.ports for direction in ("dport", "sport"))]
        for step in steps:
            done = self._tc(*step)
            if done.returncode:
                self.remove()
                return f"tc {' '.join(step[:2])}: {done.stderr.strip()}"
        return None

    def set(self, delay: float) -> None:
        done = self._tc("qdisc", "change", "dev", "lo", "parent", "1:4", "handle", "40:", "netem", "delay",
                        f"{delay / 2 * 1e6:.0f}us")
        if done.returncode:
            raise RuntimeError(f"tc netem delay: {done.stderr.strip()}")

    def remove(self) -> None:
        if self.installed:
            self._tc("qdisc", "del", "dev", "lo", "root")
            self.installed = False


@dataclass
class Delay:
    """How the delay is made: ``method`` is "tc netem" or "proxy"; ``early`` per delay (the proxy's calibration)."""

    method: str
    why: str = ""
    netem: Netem | None = None
    early: dict[float, float] = field(default_factory=dict)

    def proxy(self, server: RedisServer, delay: float) -> DelayProxy:
        """A started proxy to ``server``: counting only under netem (which then delays), else also delaying."""
        if self.netem is not None:
            self.netem.set(delay)
            return DelayProxy(server.port).start()
        return DelayProxy(server.port, delay, early=self.early.get(delay, 0.0)).start()

    def close(self) -> None:
        if self.netem is not None:
            self.netem.remove()


# -- one timed run -------------------------------------------------------------------------------------------
@dataclass
class Run:
    side: str
    workload: str
    delay_ms: float
    round: int
    tasks: int
    attempts: int
    seconds: float
    rate: float                   # tasks/s (success path) or attempts/s (failure path)
    worker_round_trips_per_task: float
    main_round_trips_per_task: float    # of the above, the worker's main process's (Dramatiq: its supervisor's)
    pool_round_trips_per_task: float    # its child processes' (prefork's pool, Dramatiq's worker processes)
    publisher_round_trips_per_task: float
    commands_per_task: float
    connections: int              # opened through the proxy in the run (publisher's and workers')
    proxy_cpu_core_share: float   # the proxy's CPU seconds / the window's seconds
    proxy_cpu_machine_share: float  # the proxy's CPU seconds / all the machine's busy CPU seconds in the window
    probe_median_ms: float
    probe_p99_ms: float
    load: float


class Probe:
    """PINGs every PROBE_GAP seconds through a proxy of its own at the same setting, until stopped."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.client.ping()
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            self.client.ping()
            self.times.append((time.perf_counter() - started) * 1000)
            self._stop.wait(PROBE_GAP)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.client.close()


def commands(control: redis.Redis) -> int:
    return sum(stat["calls"] for stat in control.info("commandstats").values())


def busy_cpu() -> float:
    import psutil

    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


class ThreadsWorker(BenchWorker):
    """A ``--pool threads`` worker: ready once it waits on Redis (it has no pool children to wait for)."""

    def wait_ready(self, client: redis.Redis, timeout: float = 60) -> ThreadsWorker:
        def waiting() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited:\n{self.log()[-3000:]}")
            return any(c.get("cmd") in ("brpop", "blmove", "evalsha") for c in client.client_list())

        wait_until(waiting, timeout, poll=0.1, what="the threads worker to consume")
        time.sleep(1.0)
        return self


def roles(proxy: DelayProxy, worker_pid: int) -> dict[int, str]:
    """The role of each open connection's client process, by its port: "main" (the worker's main process,
    Dramatiq's supervisor), "pool" (its child processes: prefork's pool, Dramatiq's workers), else "other"."""
    import psutil

    children = {p.pid for p in psutil.Process(worker_pid).children(recursive=True)}
    found = {}
    for conn in psutil.net_connections(kind="tcp4"):
        if conn.raddr and conn.raddr.port == proxy.port and conn.pid:
            found[conn.laddr.port] = ("main" if conn.pid == worker_pid else
                                      "pool" if conn.pid in children else "other")
    return found


def timed(control: redis.Redis, proxy: DelayProxy, probe_url: str, n: int, done: str, release: Any,
          worker_pid: int) -> dict[str, Any]:
    """Release the staged messages (``release()`` returns t0) and wait for ``n`` done: the window's figures."""
    each0 = {id(link): link.round_trips for link in list(proxy.links)}
    rt0, cpu0, busy0 = sum(each0.values()), proxy.cpu_seconds(), busy_cpu()
    with Probe(probe_url) as probe:
        cmd0 = commands(control)
        t0 = release()
        polls = 0
        deadline = time.monotonic() + 900
        while True:
            polls += 1
            if int(control.get(done) or 0) >= n:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{n} tasks not done in 900 s")
            time.sleep(0.01)
        t1 = time.monotonic()
        cmd1 = commands(control)
    each1 = {id(link): (link, link.round_trips) for link in list(proxy.links)}
    rt1, cpu1, busy1 = sum(count for _, count in each1.values()), proxy.cpu_seconds(), busy_cpu()
    role_of = roles(proxy, worker_pid)
    by_role = {"main": 0, "pool": 0, "other": 0}   # other: connections that ended, or of no worker process
    for link, count in each1.values():
        by_role[role_of.get(link.peer[1], "other")] += count - each0.get(id(link), 0)
    own = polls + 2   # the benchmark's GETs of the counter, release()'s RENAME, the first INFO (the second counts it)
    return {"seconds": t1 - t0, "round_trips": rt1 - rt0, "commands": cmd1 - cmd0 - own - n,
            "connections": len(proxy.links), "proxy_cpu": cpu1 - cpu0,
            "busy_cpu": max(1e-9, busy1 - busy0), "probe": probe.times, "by_role": by_role}


def celery_run(server: RedisServer, control: redis.Redis, proxy: DelayProxy, probe_url: str, side: str,
               workload: str, n: int, run: int) -> tuple[dict[str, Any], float]:
    """One Celery or celery-dlq run; the window's figures and the publisher's round trips per task."""
    from celery import Celery

    queue, prefix = f"rtt.{run}", f"rtt{run}"
    task = "bench.ok" if workload == "ok" else "bench.flaky"
    app = Celery("rtt-publisher", broker=proxy.url, set_as_current=False)
    worker = None
    try:
        stage = Stage(app, control, queue)
        rt0 = proxy.round_trips()
        stage.publish(task, n)
        published = (proxy.round_trips() - rt0) / n
        pool = ("threads", THREADS) if side == "celery_threads" else ("prefork", 2)
        kind = ThreadsWorker if pool[0] == "threads" else BenchWorker
        # broker_url through the proxy; BENCH_BROKER (the done counter's client) straight to Redis
        worker = kind(server.url, queue, "dlq" if side == "dlq" else "celery", prefix=prefix,
                      conf=json.dumps({"broker_url": proxy.url}), pool=pool[0], concurrency=pool[1],
                      name=f"rtt-{run}@%h").wait_ready(control)
        warm_up(control, prefix, lambda: app.send_task(task, args=(-1,), queue=queue))
        return timed(control, proxy, probe_url, n, f"{prefix}:done", stage.release, worker.pid), published
    finally:
        if worker is not None:
            worker.stop()
        app.close()


def dramatiq_run(server: RedisServer, control: redis.Redis, proxy: DelayProxy, probe_url: str,
                 workload: str, n: int, run: int) -> tuple[dict[str, Any], float]:
    """One Dramatiq run (``bench/dramatiq_app.py``, broker through the proxy, counter straight to Redis)."""
    import psutil

    queue, prefix = f"rtt{run}", f"rtt{run}"
    env = {"BENCH_BROKER": proxy.url, "BENCH_COUNTER_URL": server.url, "BENCH_PREFIX": prefix,
           "BENCH_QUEUE": queue, "BENCH_ATTEMPTS": str(ATTEMPTS)}
    os.environ.update(env)
    from bench import dramatiq_app
    dramatiq_app = importlib.reload(dramatiq_app)   # this run's broker, namespace and queue
    actor = dramatiq_app.ok if workload == "ok" else dramatiq_app.flaky
    fails = 0 if workload == "ok" else ATTEMPTS - 1
    proc = None
    try:
        rt0 = proxy.round_trips()
        for i in range(n):
            actor.send_with_options(args=(i,), queue_name=queue)
        published = (proxy.round_trips() - rt0) / n
        key = f"dramatiq-{prefix}:{queue}"
        assert control.llen(key) == n, "someone consumed the staged queue"
        control.rename(key, f"{key}:staged")
        proc = subprocess.Popen([sys.executable, "-m", "dramatiq", "bench.dramatiq_app", *DRAMATIQ_OPTIONS,
                                 "--queues", queue], env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_until(lambda: any(c.get("cmd") in ("evalsha", "brpop", "bzpopmin") for c in control.client_list())
                   and bool(psutil.Process(proc.pid).children()), timeout=60, poll=0.1, what="dramatiq ready")
        warm_up(control, prefix, lambda: dramatiq_app.warm.send_with_options(args=(fails,), queue_name=queue),
                int(DRAMATIQ_OPTIONS[1]))

        def release() -> float:
            t0 = time.monotonic()
            control.rename(f"{key}:staged", key)
            return t0

        return timed(control, proxy, probe_url, n, f"{prefix}:done", release, proc.pid), published
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)   # its own session: only what it started
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        dramatiq_app.broker.close()


def one_run(server: RedisServer, probe_server: RedisServer, delay: Delay, side: str, workload: str,
            delay_ms: float, n: int, run: int, round_: int) -> Run:
    control = redis.Redis.from_url(server.url)
    control.flushdb()
    proxy = delay.proxy(server, delay_ms / 1000)
    probe_proxy = delay.proxy(probe_server, delay_ms / 1000)
    try:
        if side == "dramatiq":
            window, published = dramatiq_run(server, control, proxy, probe_proxy.url, workload, n, run)
        else:
            window, published = celery_run(server, control, proxy, probe_proxy.url, side, workload, n, run)
    finally:
        proxy.close()
        probe_proxy.close()
        control.close()
    attempts = 1 if workload == "ok" else ATTEMPTS
    probe = window["probe"] or [float("nan")]
    return Run(side=side, workload=workload, delay_ms=delay_ms, round=round_, tasks=n, attempts=attempts,
               seconds=round(window["seconds"], 4), rate=round(n * attempts / window["seconds"], 2),
               worker_round_trips_per_task=round(window["round_trips"] / n, 3),
               main_round_trips_per_task=round(window["by_role"]["main"] / n, 3),
               pool_round_trips_per_task=round(window["by_role"]["pool"] / n, 3),
               publisher_round_trips_per_task=round(published, 3),
               commands_per_task=round(window["commands"] / n, 3), connections=window["connections"],
               proxy_cpu_core_share=round(window["proxy_cpu"] / window["seconds"], 4),
               proxy_cpu_machine_share=round(window["proxy_cpu"] / window["busy_cpu"], 4),
               probe_median_ms=round(median(probe), 4), probe_p99_ms=round(pct(probe, 99), 4),
               load=round(os.getloadavg()[0], 2))


# -- the whole benchmark ------------------------------------------------------------------------------------
def choose_delay(server: RedisServer, probe_server: RedisServer, method: str, delays: list[float]) -> Delay:
    """``tc netem`` on the Redis ports if asked or (``auto``) possible, else the proxy, calibrated per delay."""
    if method in ("auto", "tc"):
        netem = Netem([server.port, probe_server.port])
        why = netem.install()
        if why is None:
            return Delay("tc netem", netem=netem)
        if method == "tc":
            raise SystemExit(f"tc netem cannot be used here: {why}")
    else:
        why = "--delay-method proxy"
    early = {d: calibrate(server.port, d) for d in delays if d > 0}
    return Delay("proxy", why=why, early=early)


def measure_rtt(server: RedisServer, delay: Delay, delays: list[float]) -> dict[str, Any]:
    """PING round trips, idle: straight to Redis, and through the benchmark's path at each delay and at 0 (the
    path's own cost) whether or not 0 is among the delays run."""
    found: dict[str, Any] = {"direct": ping_rtt(server.url).as_dict()}
    for d in sorted({0.0, *delays}):
        proxy = delay.proxy(server, d)
        try:
            early_us = round(delay.early.get(d, 0) * 1e6, 1)
            found[f"{d * 1000:g}"] = {**ping_rtt(proxy.url).as_dict(), "early_us": early_us}
        finally:
            proxy.close()
    return found


def machine_facts(control: redis.Redis) -> dict[str, Any]:
    import celery
    import kombu

    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    try:
        import dramatiq
        dramatiq_version = dramatiq.__version__
    except ImportError:
        dramatiq_version = None
    return {"cores": os.cpu_count(), "cpu": model, "python": platform.python_version(),
            "redis_server": redis_server_version(control), "celery": celery.__version__,
            "kombu": kombu.__version__, "redis_py": redis.__version__, "dramatiq": dramatiq_version,
            "load_average_at_start": os.getloadavg()[0]}


def summarise(runs: list[Run], sides: list[str], delays_ms: list[float]) -> dict[str, Any]:
    """Medians over the rounds per workload, delay and side, with each rate's ratio to Celery prefork's."""
    out: dict[str, Any] = {}
    for workload in WORKLOADS:
        if not any(r.workload == workload for r in runs):
            continue
        for d in delays_ms:
            key = f"{workload}@{d:g}ms"
            rows: dict[str, Any] = {}
            for side in sides:
                mine = [r for r in runs if (r.side, r.workload, r.delay_ms) == (side, workload, d)]
                if not mine:
                    continue
                rows[side] = {f: median(getattr(r, f) for r in mine) for f in (
                    "rate", "worker_round_trips_per_task", "main_round_trips_per_task",
                    "pool_round_trips_per_task", "publisher_round_trips_per_task", "commands_per_task",
                    "proxy_cpu_core_share", "proxy_cpu_machine_share", "probe_median_ms", "probe_p99_ms")}
                rows[side]["rates"] = [r.rate for r in mine]
            base = rows.get("celery", {}).get("rate")
            for row in rows.values():
                row["vs_celery_prefork"] = round(row["rate"] / base, 3) if base else None
            out[key] = rows
    return out


def report(summary: dict[str, Any], rtt: dict[str, Any], delay: Delay, sides: list[str],
           delays_ms: list[float]) -> None:
    print(f"\ndelay method: {delay.method}" + (f" (tc netem not used: {delay.why})" if delay.why else ""))
    print("PING round trip, idle (200 PINGs; 'early': the calibration each direction releases a chunk early):")
    shown = [("direct to Redis", rtt["direct"]),
             *((f"{d:g} ms setting", rtt[f"{d:g}"]) for d in sorted({0.0, *delays_ms}))]
    print_table(["path", "p25 ms", "median ms", "p99 ms", "early us"],
                [[name, f"{m['p25_ms']:.3f}", f"{m['median_ms']:.3f}", f"{m['p99_ms']:.3f}",
                  f"{m['early_us']:.0f}" if "early_us" in m else "-"] for name, m in shown])
    workloads = [w for w in WORKLOADS if f"{w}@{delays_ms[0]:g}ms" in summary]
    for workload in workloads:
        title = WORKLOADS[workload]
        unit = "tasks/s" if workload == "ok" else "attempts/s"
        print(f"\n{title}: {unit} (x plain Celery prefork at the same delay), worker round trips per task, "
              "server commands per task, publisher round trips per task")
        rows = []
        for side in sides:
            row = [LABELS[side]]
            for d in delays_ms:
                f = summary[f"{workload}@{d:g}ms"].get(side)
                if f is None:
                    row.append("-")
                    continue
                ratio = "-" if f["vs_celery_prefork"] is None else f"{f['vs_celery_prefork']:.2f}x"
                row.append(f"{f['rate']:.0f} ({ratio}) rt {f['worker_round_trips_per_task']:.2f} "
                           f"cmd {f['commands_per_task']:.1f} pub {f['publisher_round_trips_per_task']:.2f}")
            rows.append(row)
        print_table(["side", *(f"{d:g} ms" for d in delays_ms)], rows)
    print("\nworker round trips per task by process: the worker's main process (Dramatiq: its supervisor) / its "
          "child processes (prefork's pool; Dramatiq's worker processes); the rest were on connections that ended")
    print_table(["run", *(f"{d:g} ms" for d in delays_ms)],
                [[f"{LABELS[side]}, {WORKLOADS[workload]}",
                  *("-" if (f := summary[f"{workload}@{d:g}ms"].get(side)) is None else
                    f"{f['main_round_trips_per_task']:.2f} / {f['pool_round_trips_per_task']:.2f}"
                    for d in delays_ms)] for workload in workloads for side in sides])
    print("\nthe proxy's cost in the timed windows (medians): PING through a second proxy at the same setting to an "
          "idle redis-server every 20 ms (median / p99 ms); the proxy's CPU as a share of one core and of the "
          "machine's busy CPU")
    rows = []
    for workload in workloads:
        for side in sides:
            row = [f"{LABELS[side]}, {WORKLOADS[workload]}"]
            for d in delays_ms:
                f = summary[f"{workload}@{d:g}ms"].get(side)
                row.append("-" if f is None else f"{f['probe_median_ms']:.2f}/{f['probe_p99_ms']:.2f} ms "
                           f"cpu {f['proxy_cpu_core_share']:.0%} core, {f['proxy_cpu_machine_share']:.0%} machine")
            rows.append(row)
    print_table(["run", *(f"{d:g} ms" for d in delays_ms)], rows)


def main() -> None:
    global ATTEMPTS, THREADS
    p = parser(__doc__)
    p.add_argument("--tasks", type=int, default=None, help="success-path tasks per run (2,000; 300 with --quick)")
    p.add_argument("--fail-tasks", type=int, default=None,
                   help="failure-path tasks per run (1,000; 100 with --quick), each of --attempts attempts")
    p.add_argument("--attempts", type=int, default=4, help="attempts per failure-path task, all but the last fail")
    p.add_argument("--delays", default=None, help="round-trip delays in ms (0,0.5,1,2; 0,1 with --quick)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (3; 1 with --quick)")
    p.add_argument("--sides", default=None, help=f"comma-separated sides (default: {','.join(SIDES)})")
    p.add_argument("--workloads", default="ok,fail", help="ok (success path), fail (failure path)")
    p.add_argument("--delay-method", choices=("auto", "tc", "proxy"), default="auto",
                   help="auto: tc netem on the Redis port if the machine allows it, else the proxy")
    p.add_argument("--threads", type=int, default=8, help="plain Celery's threads pool size (8)")
    results_file.add_argument(p)
    args = p.parse_args()
    quick = args.quick
    n_ok = args.tasks or (300 if quick else 2000)
    n_fail = args.fail_tasks or (100 if quick else 1000)
    rounds = args.rounds or (1 if quick else 3)
    delays_ms = [float(d) for d in (args.delays or ("0,1" if quick else "0,0.5,1,2")).split(",")]
    sides = [s for s in (args.sides.split(",") if args.sides else SIDES)]
    workloads = args.workloads.split(",")
    unknown = set(sides) - set(SIDES) | set(workloads) - set(WORKLOADS)
    if unknown:
        raise SystemExit(f"unknown side or workload: {', '.join(sorted(unknown))}")
    ATTEMPTS, THREADS = args.attempts, args.threads
    LABELS["celery_threads"] = f"Celery, threads -c {THREADS}"
    os.environ["BENCH_ATTEMPTS"] = str(ATTEMPTS)
    server, probe_server = RedisServer().start(), RedisServer().start()
    delay: Delay | None = None
    runs: list[Run] = []
    try:
        control = redis.Redis.from_url(server.url)
        facts = machine_facts(control)
        delay = choose_delay(server, probe_server, args.delay_method, [d / 1000 for d in delays_ms])
        rtt = measure_rtt(server, delay, [d / 1000 for d in delays_ms])
        print(f"machine: {facts}")
        print(f"success path {n_ok} tasks, failure path {n_fail} tasks x {ATTEMPTS} attempts; {rounds} round(s); "
              f"delays {delays_ms} ms; delay method {delay.method}\n", flush=True)
        run = 0
        for r in range(rounds):
            for d in delays_ms:
                for workload in workloads:
                    for side in sides:
                        run += 1
                        n = n_ok if workload == "ok" else n_fail
                        done = one_run(server, probe_server, delay, side, workload, d, n, run, r + 1)
                        runs.append(done)
                        print(f"  round {r + 1} {d:g} ms {workload:<4} {side:<15} {done.seconds:7.2f} s "
                              f"{done.rate:7.0f}/s  rt/task {done.worker_round_trips_per_task:6.2f} (main "
                              f"{done.main_round_trips_per_task:.2f}, pool {done.pool_round_trips_per_task:.2f})  "
                              f"cmd/task {done.commands_per_task:6.1f}  pub rt/task "
                              f"{done.publisher_round_trips_per_task:4.2f}  probe {done.probe_median_ms:.2f} ms  "
                              f"proxy {done.proxy_cpu_core_share:.0%} core  (load {done.load:.1f})", flush=True)
        server_cpu = process_cpu(server._proc.pid) if server._proc else None
    finally:
        if delay is not None:
            delay.close()
        server.stop()
        probe_server.stop()
    summary = summarise(runs, sides, delays_ms)
    report(summary, rtt, delay, sides, delays_ms)
    results_file.write(args.results, "rtt", {
        "delay_method": delay.method, "delay_method_why": delay.why, "machine_seen": facts,
        "settings": {"success_tasks": n_ok, "failure_tasks": n_fail, "attempts": ATTEMPTS, "rounds": rounds,
                     "delays_ms": delays_ms, "sides": {s: LABELS[s] for s in sides}},
        "rtt_ping": rtt, "redis_server_cpu_seconds": server_cpu,
        "summary": summary, "runs": [asdict(r) for r in runs]}, results_file.ENGINE)


if __name__ == "__main__":
    main()
