"""Benchmark 9: N idle workers on one Redis, plain Celery and celery-dlq side by side (issues #24, #30).

For each N (1, 10, 30; 1 and 3 with --quick) four private redis-servers
run at once, each with N real ``celery worker -P solo`` processes of
``bench/app.py`` consuming two queues (``bench``, ``bench2``):

- ``celery``: plain Celery (kombu's BRPOP, 1 s timeout), a default server;
- ``dlq``: celery-dlq on a default server (no ``CONFIG SET``, no keyspace
  notifications): idle fetches wait for the fetch listener;
- ``dlq-notify``: the same on a server with ``notify-keyspace-events Kl``
  (which the fetch no longer uses: the figures must not depend on it);
- ``dlq-no-listener``: celery-dlq with ``dlq_fetch_listener = False`` (the
  idle fetch blocks on its first list, 1 s, then looks at every list: how
  the code before waited on a default server).

All sides are measured in the same windows, so every round is
interleaved by construction. Reported, medians over the rounds (and min-max):

1. **Idle**: Redis commands/s and Redis CPU (ms/s, ``INFO cpu``) per worker,
   from ``INFO commandstats`` deltas (the benchmark's own INFO calls excluded).
2. **Per task**: ``bench.noop`` tasks published at 5/s (a trickle, workers
   idle between them) and at 200/s (a steady load), the same on every side:
   Redis commands per task over the window, idle included (what the server
   sees), and beyond the idle rate of the round's idle window.
3. **Pickup** after 60 s idle (10 s with --quick): a ``bench.stamp`` message
   carrying its publish time, on the default queue, the second queue and a
   priority sub-list (priority 9 on ``bench``); publish to task start, p50/p99
   over the samples (the first after the full idle, the next 1.5-3 s apart).
4. **Parked retries** (the ``dlq`` side): 3,000 tasks (300 with --quick)
   failing twice (``bench.flaky``, redelivery delay 0.1 s). The movers'
   Redis commands/s are counted with MONITOR, by command (the mover's scripts
   and what they run inside Redis, its BZPOPMIN on the store's wake marker, its
   HGETALL of the parked counts, its redelivered_total increments); apart
   from them, what the workers' fetch scripts run on the store's keys (their
   check for due entries and their moves: ``worker/fetch/moves.py``); the
   lateness of each redelivery is its move time (by the mover or a fetch)
   minus the entry's due time, from the archive's ``parked`` and
   ``redelivered`` events.
5. **At rest** (the ``dlq`` side): 1,000 retries (200 with --quick) parked
   an hour away, nothing due: the movers' commands/s over two windows
   (MONITOR), the heartbeats' apart (every worker beats: that is its
   liveness, counted in its idle cost above).

``--before DIR`` adds the side ``dlq-before``: celery-dlq as an earlier
commit had it (``DIR`` holds its ``celery_dlq`` package: ``git archive
<commit> celery_dlq | tar -x -C DIR``) on a default server, like ``dlq``, in
the same windows as every other side (phases 1 to 3), with the after/before
ratios (``dlq`` over ``dlq-before``) of its idle commands/s and commands per
task. Phases 4 and 5 stay ``dlq``-only: the MONITOR counts the movers by this
checkout's Lua scripts.

Run ``uptime`` beside it: the figures are only as quiet as the machine.
"""
from __future__ import annotations

import hashlib
import json
import random
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402
from celery import Celery  # noqa: E402

from bench import results as results_file  # noqa: E402
from bench.common import BenchWorker, RedisServer, machine, median, parser, pct, print_table, ratio, spread  # noqa: E402

NOTIFY = ("--notify-keyspace-events", "Kl")
SIDES = {"celery": ("celery", (), None), "dlq": ("dlq", (), None), "dlq-notify": ("dlq", NOTIFY, None),
         "dlq-no-listener": ("dlq", (), json.dumps({"dlq_fetch_listener": False}))}
#: ``--before``: the directory holding an earlier commit's ``celery_dlq`` package, the side ``dlq-before``.
BEFORE: str | None = None
#: The sides whose parked retries are timed, one after the other.
PARKED_SIDES = ("dlq",)
#: Per-task phases: (name, tasks per second, seconds; seconds with --quick).
LOADS = (("trickle", 5.0, 20.0, 6.0), ("load", 200.0, 10.0, 4.0))
LISTS = {"default queue": {"queue": "bench"}, "second queue": {"queue": "bench2"},
         "priority sub-list": {"queue": "bench", "priority": 9}}
MOVER_SCRIPTS = ("move_due", "next_due", "claim_due", "ack", "release")
OWN = ("info", "monitor", "client|list", "ping", "xrange", "get", "llen", "lrange", "rpush")


def blocked_fetches(client: redis.Redis) -> int:
    return sum(1 for c in client.client_list() if c.get("cmd") in ("brpop", "blmove", "bzpopmin"))


def snapshot(client: redis.Redis) -> tuple[float, dict[str, int], float]:
    stats = client.info("commandstats")
    cpu = client.info("cpu")
    calls = {name[len("cmdstat_"):]: int(row["calls"]) for name, row in stats.items()}
    return time.monotonic(), calls, float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


def rates(before, after, n: int, exclude: tuple[str, ...] = ("info",)) -> tuple[float, float, dict[str, float]]:
    """(commands/s per worker, Redis CPU ms/s per worker, commands/s by command over all workers)."""
    seconds = after[0] - before[0]
    per = {name: (after[1].get(name, 0) - before[1].get(name, 0)) / seconds for name in after[1]
           if name not in exclude}
    per = {name: v for name, v in per.items() if v > 0}
    return sum(per.values()) / n, (after[2] - before[2]) * 1000 / seconds / n, per


class Monitor(threading.Thread):
    """Counts the movers' commands on one server (MONITOR), by the rules in the module docstring."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        from celery_dlq.storage.scripts import script_source

        self.url, self.stop_flag, self.count, self.by = url, False, 0, {}
        #: The workers' beats of the leader's lease (lease.lua, and SET NX / PEXPIRE of earlier releases): per worker.
        self.beats = 0
        self.shas = {hashlib.sha1(script_source(n).encode()).hexdigest(): n for n in MOVER_SCRIPTS}
        self.beat_sha = hashlib.sha1(script_source("lease").encode()).hexdigest()
        self.fetch_sha = hashlib.sha1(script_source("fetch").encode()).hexdigest()
        #: Commands the fetch scripts ran on the store's keys (their check for due entries, their moves).
        self.fetch_count = 0
        self.ready = threading.Event()

    def run(self) -> None:
        client = redis.Redis.from_url(self.url)
        inside = in_fetch = in_beat = False
        with client.monitor() as mon:
            self.ready.set()
            for cmd in mon.listen():
                if self.stop_flag:
                    return
                parts = cmd["command"].split(" ")
                name = parts[0].upper()
                if cmd.get("client_type") == "lua":
                    if in_beat:
                        self.beats += 1
                    elif inside:
                        self._add(f"lua {name}")
                    elif in_fetch and len(parts) > 1 and parts[1].startswith("{"):
                        self.fetch_count += 1
                    continue
                inside = name == "EVALSHA" and len(parts) > 1 and parts[1] in self.shas
                in_fetch = name == "EVALSHA" and len(parts) > 1 and parts[1] == self.fetch_sha
                key = parts[1] if len(parts) > 1 else ""
                in_beat = name == "EVALSHA" and key == self.beat_sha
                if (name in ("SET", "PEXPIRE") and key.endswith(":mover")) or in_beat:
                    self.beats += 1
                elif inside:
                    self._add(f"EVALSHA {self.shas[parts[1]]}")
                elif (name == "BZPOPMIN" and key.endswith(":wake")) \
                        or (name == "HGETALL" and key.endswith(":parked")) \
                        or (name == "SMEMBERS" and key.endswith(":layout")) \
                        or (name == "HINCRBY" and key.endswith(":metrics") and "redelivered_total" in cmd["command"]):
                    self._add(name)

    def _add(self, what: str) -> None:
        self.count += 1
        self.by[what] = self.by.get(what, 0) + 1

    def stop(self) -> None:
        self.stop_flag = True
        redis.Redis.from_url(self.url).ping()   # a line, so the loop sees the flag


def lateness(client: redis.Redis, prefix: str) -> list[float]:
    """Seconds from each entry's due time to its move, paired per task by order (the archive's events)."""
    parked, moved = {}, {}
    for _, fields in client.xrange(f"{{{prefix}}}:events"):
        f = {k.decode(): v.decode() for k, v in fields.items()}
        if f.get("type") == "parked" and f.get("due_us"):
            parked.setdefault(f["task_id"], []).append(int(f["due_us"]))
        elif f.get("type") == "redelivered":
            moved.setdefault(f["task_id"], []).append(int(f["ts_us"]))
    out = []
    for task_id, dues in parked.items():
        for due, at in zip(sorted(dues), sorted(moved.get(task_id, []))):
            out.append((at - due) / 1e6)
    return out


def start_side(n: int, side: str) -> tuple[RedisServer, list[BenchWorker]]:
    mode, args, conf = SIDES[side]
    server = RedisServer(None, *args).start()
    workers = [BenchWorker(server.url, "bench", mode, prefix=f"b9{side}", concurrency=1, queues="bench,bench2",
                           pool="solo", name=f"{side}-{i}@%h", conf=conf,
                           package=BEFORE if side == "dlq-before" else None) for i in range(n)]
    return server, workers


def run_n(n: int, rounds: int, window: float, idle_first: float, samples: int, tasks: int, park: int,
          parked_rounds: int = 1, at_rest_only: float = 0.0) -> dict:
    """Every phase for N workers per side; with ``at_rest_only`` (seconds) only phase 4, that long, on the
    ``dlq`` side."""
    sides = {side: start_side(n, side) for side in (("dlq",) if at_rest_only else SIDES)}
    clients = {side: redis.Redis.from_url(server.url) for side, (server, _) in sides.items()}
    result: dict = {"n": n, "idle": {}, "pickup": {}, "parked": {}}
    try:
        deadline = time.monotonic() + 60 + 10 * n
        while any(blocked_fetches(c) < n for c in clients.values()):
            for _, workers in sides.values():
                for w in workers:
                    if w.proc.poll() is not None:
                        raise RuntimeError(f"a worker exited:\n{w.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("workers never all waited on Redis")
            time.sleep(0.5)
        ready_at = time.monotonic()
        apps = {side: Celery("client", broker=sides[side][0].url, set_as_current=False) for side in sides}
        if at_rest_only:
            result["at_rest"] = at_rest_phase(sides["dlq"][0].url, clients["dlq"], apps["dlq"], "dlq", park,
                                              at_rest_only / 2)
            return result
        for side, app in apps.items():   # warm up: a worker's first task is slower than any later one
            for options in LISTS.values():
                app.send_task("bench.stamp", args=(time.time(),), **options)
        for side, c in clients.items():
            end = time.monotonic() + 30
            while c.llen(f"b9{side}:pickup") < len(LISTS) and time.monotonic() < end:
                time.sleep(0.05)
            c.delete(f"b9{side}:pickup")
        # start-up work (first fetches, lease, the listener) settles; a channel's idle waits are short for its
        # first 30 s (worker/fetch/transport.py SETTLE): idle is measured from 35 s after the workers waited
        time.sleep(max(5.0, ready_at + 35.0 - time.monotonic()))
        idle_started = time.monotonic()
        for _ in range(rounds):
            before = {side: snapshot(c) for side, c in clients.items()}
            time.sleep(window)
            after = {side: snapshot(c) for side, c in clients.items()}
            for side in SIDES:
                result["idle"].setdefault(side, []).append(rates(before[side], after[side], n))
        time.sleep(max(0.0, idle_first - (time.monotonic() - idle_started)))
        for k in range(samples):
            for label, options in LISTS.items():
                for side, app in apps.items():
                    app.send_task("bench.stamp", args=(time.time(),), **options)
                for side, c in clients.items():
                    key = f"b9{side}:pickup"
                    end = time.monotonic() + 10
                    while c.llen(key) < k * len(LISTS) + list(LISTS).index(label) + 1 and time.monotonic() < end:
                        time.sleep(0.002)
                    result["pickup"].setdefault(side, {}).setdefault(label, []).append(float(c.lindex(key, -1)))
                time.sleep(random.uniform(1.5, 3.0))
        idle = {side: median([w[0] for w in result["idle"][side]]) for side in SIDES}
        for _ in range(rounds):   # every side at once: interleaved by construction
            for name, rate, seconds, quick_seconds in LOADS:
                phase = per_task_phase(clients, apps, rate, quick_seconds if window < 10 else seconds, idle, n)
                for side, values in phase.items():
                    result.setdefault("per_task", {}).setdefault(name, {}).setdefault(side, []).append(values)
                time.sleep(2.0)   # back to idle
        for k in range(parked_rounds):   # interleaved: each round runs every side once, in a rotated order
            for side in PARKED_SIDES[k % len(PARKED_SIDES):] + PARKED_SIDES[:k % len(PARKED_SIDES)]:
                result["parked"].setdefault(side, []).append(
                    parked_phase(sides[side][0].url, clients[side], apps[side], side, tasks))
        result["at_rest"] = at_rest_phase(sides["dlq"][0].url, clients["dlq"], apps["dlq"], "dlq", park, window)
        for app in apps.values():
            app.close()
    finally:
        for _, workers in sides.values():   # all at once: one by one, 90 warm shutdowns take minutes
            for w in workers:
                if w.proc.poll() is None:
                    w.proc.send_signal(signal.SIGTERM)
        for server, workers in sides.values():
            for w in workers:
                w.stop()
            server.stop()
    return result


def parked_phase(url: str, client: redis.Redis, app: Celery, side: str, tasks: int) -> dict:
    done_key = f"b9{side}:done"
    client.delete(done_key, f"{{b9{side}}}:events")   # this round's events and count only
    monitor = Monitor(url)
    monitor.start()
    monitor.ready.wait(10)
    started = time.monotonic()
    before = snapshot(client)
    with app.producer_or_acquire() as producer:
        for i in range(tasks):
            app.send_task("bench.flaky", args=(i,), queue="bench", producer=producer)
    end = time.monotonic() + 600
    while int(client.get(done_key) or 0) < tasks and time.monotonic() < end:
        time.sleep(0.05)
    seconds = time.monotonic() - started
    after = snapshot(client)
    monitor.stop()
    late = lateness(client, f"b9{side}")
    return {"seconds": seconds, "done": int(client.get(done_key) or 0), "mover_cmds_s": monitor.count / seconds,
            "mover_cmds": monitor.count, "fetch_moves_cmds_s": monitor.fetch_count / seconds,
            "mover_by": {k: v / seconds for k, v in sorted(monitor.by.items(), key=lambda kv: -kv[1])[:8]},
            "total_cmds_s": sum(rates(before, after, 1, exclude=("info", "monitor"))[2].values()),
            "late_p50_ms": pct(late, 50) * 1000 if late else None,
            "late_p99_ms": pct(late, 99) * 1000 if late else None,
            "late_max_ms": max(late) * 1000 if late else None, "moves": len(late)}


def at_rest_phase(url: str, client: redis.Redis, app: Celery, side: str, n: int, window: float) -> dict:
    """``n`` retries parked an hour away (``bench.park_long``): the movers' commands/s with nothing due."""
    with app.producer_or_acquire() as producer:
        for i in range(n):
            app.send_task("bench.park_long", args=(i,), queue="bench", producer=producer)
    end = time.monotonic() + 300
    while client.zcard(f"{{b9{side}}}:delayed") < n and time.monotonic() < end:
        time.sleep(0.1)
    time.sleep(2.0)
    monitor = Monitor(url)
    monitor.start()
    monitor.ready.wait(10)
    started = time.monotonic()
    time.sleep(window * 2)
    seconds = time.monotonic() - started
    monitor.stop()
    return {"parked": int(client.zcard(f"{{b9{side}}}:delayed")), "seconds": seconds,
            "fetch_moves_cmds_s": monitor.fetch_count / seconds, "mover_cmds_s": monitor.count / seconds,
            "beats_cmds_s": monitor.beats / seconds, "mover_by": {k: v / seconds for k, v in monitor.by.items()}}


def per_task_phase(clients: dict, apps: dict, rate: float, seconds: float, idle: dict, n: int) -> dict:
    """``bench.noop`` at ``rate``/s for ``seconds`` on every side at once: commands per task, idle included and
    beyond ``idle`` (each side's commands/s per worker of the round's idle window)."""
    count = int(rate * seconds)
    before = {side: snapshot(c) for side, c in clients.items()}
    producers = {side: app.producer_or_acquire() for side, app in apps.items()}
    entered = {side: p.__enter__() for side, p in producers.items()}
    started = time.monotonic()
    for i in range(count):
        for side, app in apps.items():
            app.send_task("bench.noop", args=(i,), queue="bench", producer=entered[side])
        time.sleep(max(0.0, started + (i + 1) / rate - time.monotonic()))
    for p in producers.values():
        p.__exit__(None, None, None)
    end = time.monotonic() + 120
    while any(c.llen("bench") for c in clients.values()) and time.monotonic() < end:
        time.sleep(0.05)
    time.sleep(0.5)   # the last tasks' acks
    after = {side: snapshot(c) for side, c in clients.items()}
    out = {}
    for side in clients:
        window = after[side][0] - before[side][0]
        total = sum(rates(before[side], after[side], 1)[2].values()) * window
        out[side] = (total / count, (total - idle[side] * n * window) / count)
    return out



def report(results: list[dict]) -> None:
    rows = []
    for r in results:
        for side in (side for side in SIDES if side in r["idle"]):
            windows = r["idle"][side]
            rows.append([r["n"], side, spread([w[0] for w in windows]), spread([w[1] for w in windows], "{:.3f}"),
                         " ".join(f"{k} {v / r['n']:.2f}" for k, v in sorted(windows[len(windows) // 2][2].items(),
                                                                             key=lambda kv: -kv[1])[:5])])
    print("\nIdle, per worker (median of the rounds, min-max):")
    print_table(["N", "side", "commands/s", "Redis CPU ms/s", "by command (one round)"], rows)
    rows = []
    for r in results:
        for name, *_ in LOADS:
            per = r.get("per_task", {}).get(name, {})
            base = median([v[0] for v in per.get("celery", [(1, 1)])])
            base_marginal = median([v[1] for v in per.get("celery", [(1, 1)])])
            for side in (side for side in SIDES if side in per):
                rows.append([r["n"], name, side, spread([v[0] for v in per[side]], "{:.1f}"),
                             f"{median([v[0] for v in per[side]]) / base:.2f}x",
                             spread([v[1] for v in per[side]], "{:.1f}"),
                             f"{median([v[1] for v in per[side]]) / base_marginal:.2f}x"])
    print("\nRedis commands per task (bench.noop at 5/s: a trickle; at 200/s: a load), median (min-max) of the "
          "rounds, idle included and beyond the round's idle rate, each against plain Celery:")
    print_table(["N", "phase", "side", "per task", "vs celery", "beyond idle", "vs celery"], rows)
    rows = []
    for r in results:
        for side in SIDES:
            for label, values in r["pickup"].get(side, {}).items():
                rows.append([r["n"], side, label, f"{values[0] * 1000:.1f}", f"{pct(values, 50) * 1000:.1f}",
                             f"{pct(values, 99) * 1000:.1f}", len(values)])
    print("\nPickup, publish to task start (ms): the first sample after the full idle, then p50/p99:")
    print_table(["N", "side", "list", "first", "p50", "p99", "samples"], rows)
    rows = []
    for r in results:
        for side, runs in r["parked"].items():
            cols = [spread([run[key] for run in runs], "{:.0f}" if key == "total_cmds_s" else "{:.1f}")
                    for key in ("seconds", "mover_cmds_s", "fetch_moves_cmds_s", "total_cmds_s", "late_p50_ms",
                                "late_p99_ms", "late_max_ms")]
            rows.append([r["n"], side, len(runs), sum(run["done"] for run in runs), *cols,
                         sum(run["moves"] for run in runs),
                         spread([run["mover_cmds"] / max(1, run["moves"]) for run in runs])])
    print("\nParked retries (tasks failing twice, 0.1 s delay), median (min-max) of the rounds: movers' "
          "commands/s (MONITOR), the fetches' commands/s on the store's keys, lateness (ms):")
    print_table(["N", "side", "rounds", "tasks", "s", "movers cmd/s", "fetch moves cmd/s", "all cmd/s", "late p50",
                 "late p99", "max", "moves", "movers cmd/move"], rows)
    print("\nRetries parked an hour away, nothing due (the dlq side): the movers' commands/s (MONITOR), and "
          "every worker's heartbeats together:")
    print_table(["N", "parked", "s", "movers cmd/s", "heartbeats cmd/s", "by command (/s)"],
                [[r["n"], r["at_rest"]["parked"], f"{r['at_rest']['seconds']:.0f}",
                  f"{r['at_rest']['mover_cmds_s']:.2f}", f"{r['at_rest'].get('beats_cmds_s', 0):.2f}",
                  ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["at_rest"]["mover_by"].items(),
                                                                key=lambda kv: -kv[1]))]
                 for r in results])
    for r in results:
        for side, runs in r["parked"].items():
            print(f"  N={r['n']} {side} movers by command (/s, first round): "
                  + ", ".join(f"{k} {v:.1f}" for k, v in runs[0]["mover_by"].items()))
    if "dlq-before" not in SIDES:
        return
    rows = []
    for r in (r for r in results if "dlq-before" in r["idle"]):
        after = median([w[0] for w in r["idle"]["dlq"]])
        before = median([w[0] for w in r["idle"]["dlq-before"]])
        rows.append([r["n"], "idle", "commands/s per worker", f"{after:.2f}", f"{before:.2f}", ratio(after, before)])
        for name, *_ in LOADS:
            per = r.get("per_task", {}).get(name, {})
            for i, what in enumerate(("commands per task", "beyond idle")):
                after, before = (median([v[i] for v in per[side]]) for side in ("dlq", "dlq-before"))
                rows.append([r["n"], name, what, f"{after:.1f}", f"{before:.1f}", ratio(after, before)])
    print("\nAfter/before (--before): celery-dlq (dlq) against the earlier package (dlq-before), same windows, "
          "medians of the rounds:")
    print_table(["N", "phase", "figure", "dlq", "dlq-before", "after/before"], rows)



def main() -> None:
    p = parser(__doc__)
    p.add_argument("--workers", default=None, help="comma-separated N values (default 1,10,30; 1,3 with --quick)")
    p.add_argument("--json", default=None, help="write the raw results here")
    p.add_argument("--parked-rounds", type=int, default=3, help="interleaved rounds of the parked phase (default 3)")
    p.add_argument("--at-rest-only", type=float, default=0.0, metavar="SECONDS",
                   help="only the at-rest phase (5), counted over SECONDS, on the dlq side")
    p.add_argument("--before", default=None, metavar="DIR",
                   help="a directory holding an earlier celery_dlq package: the side dlq-before")
    results_file.add_argument(p)
    args = p.parse_args()
    global BEFORE
    if args.before:
        BEFORE = args.before
        SIDES["dlq-before"] = ("dlq", (), None)
    ns = [int(x) for x in (args.workers or ("1,3" if args.quick else "1,10,30")).split(",")]
    rounds, window = (2, 5.0) if args.quick else (3, 20.0)
    idle_first, samples, tasks, park = (10.0, 3, 300, 200) if args.quick else (60.0, 12, 3000, 1000)
    print(machine())
    results = []
    for n in ns:
        print(f"N={n} ...", flush=True)
        results.append(run_n(n, rounds, window, idle_first, samples, tasks, park, args.parked_rounds,
                             args.at_rest_only))
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    report(results)
    results_file.write(args.results, "scale", figures(results), results_file.ENGINE)


def figures(results: list[dict]) -> dict[str, float]:
    """The printed tables' figures by name, ``<figure>.<side>.n<N>`` (medians of the rounds, as printed)."""
    out: dict[str, float] = {}
    for r in results:
        n = r["n"]
        for side, windows in r.get("idle", {}).items():
            out[f"idle_cmds_s_per_worker.{side}.n{n}"] = round(median([w[0] for w in windows]), 2)
        for name, *_ in LOADS:
            per = r.get("per_task", {}).get(name, {})
            if "celery" not in per:
                continue
            base = median([v[0] for v in per["celery"]])
            base_marginal = median([v[1] for v in per["celery"]])
            for side in (side for side in SIDES if side in per and side != "celery"):
                out[f"cmds_per_task_ratio.{name}.{side}.n{n}"] = round(median([v[0] for v in per[side]]) / base, 2)
                out[f"cmds_per_task_beyond_idle_ratio.{name}.{side}.n{n}"] = round(
                    median([v[1] for v in per[side]]) / base_marginal, 2)
        for side, lists in r.get("pickup", {}).items():
            for label, values in lists.items():
                out[f"pickup_p99_ms.{side}.{label.replace(' ', '_')}.n{n}"] = round(pct(values, 99) * 1000, 1)
        if r.get("at_rest"):
            out[f"movers_at_rest_cmds_s.n{n}"] = round(r["at_rest"]["mover_cmds_s"], 2)
        if "dlq-before" in r.get("idle", {}):   # --before: the after/before ratios, dlq over dlq-before
            after, before = (median([w[0] for w in r["idle"][side]]) for side in ("dlq", "dlq-before"))
            if before:
                out[f"after_before.idle_cmds_s_per_worker.n{n}"] = round(after / before, 2)
            for name, *_ in LOADS:
                per = r.get("per_task", {}).get(name, {})
                for side in ("dlq", "dlq-before"):
                    out[f"cmds_per_task.{name}.{side}.n{n}"] = round(median([v[0] for v in per[side]]), 1)
                for i, figure in enumerate(("cmds_per_task", "cmds_per_task_beyond_idle")):
                    after, before = (median([v[i] for v in per[side]]) for side in ("dlq", "dlq-before"))
                    if before:
                        out[f"after_before.{figure}.{name}.n{n}"] = round(after / before, 2)
    for side in (side for side in SIDES if side != "celery"):   # the largest gap to Celery's, over N and lists
        gaps = [value - out[celery] for key, value in list(out.items()) if key.startswith(f"pickup_p99_ms.{side}.")
                and (celery := key.replace(f".{side}.", ".celery.", 1)) in out]
        if gaps:
            out[f"pickup_p99_gap_max_ms.{side}"] = round(max(gaps), 1)
    return out


if __name__ == "__main__":
    main()
