"""Benchmark 15: when a worker dies, how long until its task runs again, and what leases cost (issue 35).

Each group of workers has its own redis-server and real ``celery worker -P
prefork -c 1`` processes of ``bench/app.py``; ``bench.sleeps`` tasks record
each start (time, worker pid, delivery count) and wait until released. A
kill is ``os.killpg(SIGKILL)`` of the worker's session; a time is the task's
start (``time.time()`` in the pool child) minus the kill's.

1. **celery-dlq** (mode ``dlq``, defaults: ``dlq_inflight_lease`` 10 s,
   heartbeat 2.5 s): ``--cells`` groups of three workers at once
   (``worker_prefetch_multiplier = 1``: a busy worker takes nothing more).
   Per kill, two long tasks run on two workers and 1-6 s later one of them is
   SIGKILLed (on alternate kills the mover lease's holder, the sweeper, if
   busy: both cases reported); its task must start on the idle worker, up
   since before the kill, with delivery count 2, and the other busy task
   must not start again. Timed from the kill and from the victim's last beat.
   Then, one group at a time, a non-holder killed and a new worker started.
2. **Plain Celery** (``celery_late``: acks_late), pairs running meanwhile: a
   killed worker's task, waited for ``--celery-cap`` s at kombu's default
   ``visibility_timeout`` (3600 s), 240 s at 60 s (kombu's restore sweep at
   its defaults); a 90 s task on live pairs of both sides (Celery's at 60 s):
   how many times it starts. Without ``--quick`` these pairs publish after a
   random 0-100 s pause (kombu looks for expired messages every ~100 s per
   worker: a random phase, as in use).
3. **Idle and busy cost**: Redis commands/s per worker (``INFO commandstats``
   deltas, the benchmark's INFO and the tasks' BLPOP left out), N = 1 and 4
   workers per side, celery-dlq, plain Celery and Celery acks_late, six
   servers in the same windows: ``--rounds`` of an idle window (from 35 s
   after the workers waited) then a busy one (each worker running one long
   task; ``worker_prefetch_multiplier = 1``). ``--before DIR`` adds the
   side ``dlq_before``: celery-dlq as an earlier commit had it (``DIR`` holds
   its ``celery_dlq`` package: ``git archive <commit> celery_dlq | tar -x -C
   DIR``), in the same windows, so a change is measured before and after in
   one run.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402
import redis  # noqa: E402
from celery import Celery  # noqa: E402
from kombu.transport.redis import Channel  # noqa: E402

from bench import results as results_file  # noqa: E402
from bench.common import BenchWorker, RedisServer, machine, median, parser, pct, print_table  # noqa: E402
from celery_dlq.storage.keys import Keys  # noqa: E402

QUEUE = "rq"
LONG, DUPLICATE_TASK = 3600, 90   # seconds: the long tasks (released by the benchmark); the live pairs' task
VIS, VIS_CAP = 60, 240
BLOCKING, OWN = ("brpop", "bzpopmin", "blmove"), ("info", "blpop")   # OWN: the benchmark's commands
ONE = json.dumps({"worker_prefetch_multiplier": 1})
VIS60 = json.dumps({"broker_transport_options": {"visibility_timeout": VIS}})
SCAN = Channel.unacked_restore_interval * Channel.unacked_restore_throttle
COST_SIDES = ["dlq", "celery", "celery_late"]   # + "dlq_before" with --before
#: ``--before``: the directory holding an earlier commit's ``celery_dlq`` package.
BEFORE: str | None = None
#: Plain Celery's pairs and celery-dlq's live pairs: (label, mode, BENCH_CONF, pairs; 1 each with --quick).
PLAN = (("celery 3600", "celery_late", None, 3), ("celery 60", "celery_late", VIS60, 6),
        ("live celery 60", "celery_late", VIS60, 4), ("live dlq", "dlq", None, 4))
anomalies: list[str] = []
same_host_lock = threading.Lock()


class Cell:
    """One redis-server and ``size`` workers of ``mode`` consuming ``QUEUE``, prefix ``name``."""

    def __init__(self, name: str, mode: str, size: int, conf: str | None = None) -> None:
        self.package = BEFORE if mode == "dlq_before" else None
        mode = "dlq" if mode == "dlq_before" else mode
        self.name, self.mode, self.conf, self.spawned = name, mode, conf, 0
        self.server = RedisServer().start()
        self.client = redis.Redis.from_url(self.server.url, decode_responses=True)
        self.app = Celery("recovery", broker=self.server.url, set_as_current=False)
        self.workers = [self.spawn() for _ in range(size)]

    def spawn(self) -> BenchWorker:
        self.spawned += 1
        return BenchWorker(self.server.url, QUEUE, self.mode, self.name, concurrency=1, conf=self.conf,
                           name=f"{self.name}w{self.spawned}@%h", package=self.package)

    def waiting(self) -> set[int]:
        """Pids of this cell's workers with a pool child and a connection blocked on a fetch."""
        blocked = {int(c["addr"].rsplit(":", 1)[1]) for c in self.client.client_list() if c.get("cmd") in BLOCKING}
        pids = set()
        for w in self.workers:
            try:
                proc = psutil.Process(w.pid)
                if proc.children() and blocked & {c.laddr.port for c in proc.net_connections("tcp")
                                                  if c.raddr and c.raddr.port == self.server.port}:
                    pids.add(w.pid)
            except psutil.Error:
                pass
        return pids

    def ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while len(self.waiting()) < len(self.workers):
            if time.monotonic() > deadline or any(w.proc.poll() is not None for w in self.workers):
                logs = "".join(w.log()[-2000:] for w in self.workers)
                raise RuntimeError(f"{self.name}: workers not all waiting on Redis:\n{logs}")
            time.sleep(0.2)

    def publish(self, seconds: float) -> str:
        token = uuid.uuid4().hex[:10]
        self.app.send_task("bench.sleeps", args=(token, seconds), queue=QUEUE)
        return token

    def starts(self, token: str) -> list[dict]:
        return [json.loads(s) for s in self.client.lrange(f"{self.name}:starts:{token}", 0, -1)]

    def wait_starts(self, token: str, n: int, timeout: float) -> list[dict] | None:
        deadline = time.monotonic() + timeout
        while len(found := self.starts(token)) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        return found if len(found) >= n else None

    def release(self, *tokens: str) -> None:
        for token in tokens:
            self.client.lpush(f"{self.name}:release:{token}", *range(5))

    def holder_pid(self) -> int | None:
        value = self.client.get(Keys(self.name).mover_lease)
        return int(value.rsplit(":", 2)[1]) if value else None

    def last_beat(self, pid: int) -> float | None:
        """The in-flight beat (unix seconds) of the consumer with main pid ``pid``."""
        found = [score for member, score in self.client.zrange(Keys(self.name).consumers, 0, -1, withscores=True)
                 if member.rsplit(":", 2)[1] == str(pid)]
        return found[0] / 1000 if found else None

    def kill(self, pid: int) -> float:
        at = time.time()
        with suppress(ProcessLookupError):   # already gone (close)
            os.killpg(pid, signal.SIGKILL)
        w = next(w for w in self.workers if w.pid == pid)
        w.proc.wait()
        self.workers.remove(w)
        w.stop()
        return at

    def close(self) -> None:
        for w in list(self.workers):
            if "Traceback" in w.log():
                anomalies.append(f"{self.name}: an error in worker {w.pid}'s log:\n{w.log()[-2500:]}")
            self.kill(w.pid)
        self.server.stop()


def suspicious(cell: Cell, what: str) -> None:
    logs = "".join(f"\n--- worker {w.pid} log tail ---\n{w.log()[-2500:]}" for w in cell.workers)
    anomalies.append(f"{cell.name}: {what}{logs}")


def dlq_kill(cell: Cell, want_holder: bool, same_host: bool = False) -> dict | None:
    """Two long tasks on two of three workers; kill one (the holder if ``want_holder`` and it is busy); time its
    task's start on another worker. ``same_host``: a new worker is started right after the kill."""
    cell.ready()
    tokens = [cell.publish(LONG) for _ in range(2)]
    first = {t: cell.wait_starts(t, 1, 60) for t in tokens}
    busy = {s[0]["pid"]: t for t, s in first.items() if s}
    if len(busy) != 2:
        return suspicious(cell, f"two tasks did not start on two workers: {first}")
    holder = cell.holder_pid()
    pid = holder if (want_holder and holder in busy) else next(p for p in busy if p != holder)
    token, other = busy[pid], next(t for t in tokens if t != busy[pid])
    survivors = {w.pid for w in cell.workers} - {pid}
    time.sleep(random.uniform(1.0, 6.0))
    killed_at = cell.kill(pid)
    fresh = cell.spawn() if same_host else None
    beat = cell.last_beat(pid)
    if not (starts := cell.wait_starts(token, 2, 90)):
        return suspicious(cell, f"task {token} of killed worker {pid} did not start again within 90 s")
    again, once = starts[1], len(cell.starts(other)) == 1
    if again["delivery"] != 2 or not (again["pid"] in survivors or fresh) or not once:
        suspicious(cell, f"restart of {token}: {again} (victim {pid}, survivors {survivors}); "
                         f"the other busy worker's task: {cell.starts(other)}")
    cell.release(*tokens)
    cell.workers.append(fresh or cell.spawn())
    return {"holder": pid == holder, "from_kill": again["at"] - killed_at, "delivery 2": again["delivery"] == 2,
            "from_beat": again["at"] - beat if beat else None, "on_running": again["pid"] in survivors,
            "other_once": once, "recovered": bool(fresh and "left in flight by" in fresh.log()),
            "on_fresh": bool(fresh and again["pid"] == fresh.pid)}


def dlq_cell_run(index: int, rounds: int, out: dict) -> None:
    """``rounds`` kills in one group of three, then one same-host restart (one group at a time)."""
    cell = Cell(f"k{index}", "dlq", 3, conf=ONE)
    try:
        for r in range(rounds):
            if (result := dlq_kill(cell, want_holder=(index + r) % 2 == 0)) is not None:
                out["kills"].append(result)
        with same_host_lock:
            if (result := dlq_kill(cell, want_holder=False, same_host=True)) is not None:
                out["same_host"].append(result)
    except Exception as exc:  # noqa: BLE001 - reported; the other groups go on
        anomalies.append(f"{cell.name}: {type(exc).__name__}: {exc}")
    finally:
        cell.close()


def pair_run(cell: Cell, kill: bool, cap: float, offset: float) -> dict:
    """One task on a pair, after ``offset`` s. ``kill``: a long one whose worker is SIGKILLed 1-6 s after it
    started, then up to ``cap`` s for it to start again; else a 90 s one, never killed: its starts."""
    time.sleep(offset)
    cell.ready()
    token = cell.publish(LONG if kill else DUPLICATE_TASK)
    first = cell.wait_starts(token, 1, 60)[0]
    if kill:
        time.sleep(random.uniform(1.0, 6.0))
        killed_at = cell.kill(first["pid"])
        starts = cell.wait_starts(token, 2, cap)
        return {"from_kill": starts[1]["at"] - killed_at if starts else None}
    time.sleep(max(0.0, first["at"] + DUPLICATE_TASK + 20 - time.time()))   # until 20 s after its first run
    starts = cell.starts(token)
    if cell.mode == "dlq" and len(starts) != 1:
        suspicious(cell, f"a live worker's task started {len(starts)} times: {starts}")
    return {"starts": len(starts), "later": [round(s["at"] - first["at"], 1) for s in starts[1:]]}


def threads(target, items: list) -> None:
    with ThreadPoolExecutor(len(items)) as pool:
        list(pool.map(lambda item: target(*item), items))


def celery_phase(args: argparse.Namespace, out: dict, started: threading.Event) -> None:
    """Every pair at once, each in its own thread (they mostly wait)."""
    cells: list[tuple[str, Cell]] = []

    def run(label: str, cell: Cell) -> None:
        offset = 0.0 if args.quick or label == "celery 3600" else random.uniform(0, SCAN)
        cap = args.celery_cap if label == "celery 3600" else VIS_CAP
        try:
            out.setdefault(label, []).append(pair_run(cell, not label.startswith("live"), cap, offset))
        except Exception as exc:  # noqa: BLE001
            anomalies.append(f"{label} {cell.name}: {type(exc).__name__}: {exc}")

    try:
        for label, mode, conf, count in PLAN:
            cells += [(label, Cell(f"p{len(cells)}", mode, 2, conf)) for _ in range(1 if args.quick else count)]
        for _, cell in cells:
            cell.ready()
        started.set()
        threads(run, cells)
    finally:
        started.set()
        for _, cell in cells:
            cell.close()


def window(cells: dict, seconds: float) -> dict:
    """(commands/s per worker, by command) of each cell over ``seconds`` (the OWN commands left out)."""
    def calls(cell: Cell) -> tuple[float, dict[str, int]]:
        stats = cell.client.info("commandstats")
        return time.monotonic(), {k[len("cmdstat_"):]: int(row["calls"]) for k, row in stats.items()}

    before = {key: calls(cell) for key, cell in cells.items()}
    time.sleep(seconds)
    out = {}
    for key, cell in cells.items():
        (t0, old), (t1, new) = before[key], calls(cell)
        by = {k: (v - old.get(k, 0)) / (t1 - t0) / key[0] for k, v in new.items() if k not in OWN and v > old.get(k, 0)}
        out[key] = (sum(by.values()), by)
    return out


def cost_phase(ns: list[int], rounds: int, seconds: float) -> dict:
    """(N, state, side) -> one (commands/s per worker, by command) per round."""
    cells = {(n, side): Cell(f"c{side}{n}", side, n, conf=ONE) for n in ns for side in COST_SIDES}
    out: dict = {}
    try:
        for cell in cells.values():
            cell.ready()
        time.sleep(35.0)   # a dlq channel's idle waits are short for its first 30 s (worker/fetch/transport.py SETTLE)
        for _ in range(rounds):
            for key, got in window(cells, seconds).items():
                out.setdefault((key[0], "idle", key[1]), []).append(got)
            tokens = {key: [cell.publish(LONG) for _ in range(key[0])] for key, cell in cells.items()}
            for key, cell in cells.items():
                if len({(cell.wait_starts(t, 1, 60) or [{}])[0].get("pid") for t in tokens[key]} - {None}) != key[0]:
                    anomalies.append(f"busy window N={key[0]} {key[1]}: the tasks did not run on N workers")
            time.sleep(3.0)
            for key, got in window(cells, seconds).items():
                out.setdefault((key[0], "busy", key[1]), []).append(got)
            for key, cell in cells.items():
                cell.release(*tokens[key])
            time.sleep(10.0)
    finally:
        for cell in cells.values():
            cell.close()
    return out


def stats(values: list[float]) -> list[str]:
    return [f"{pct(values, q):.1f}" for q in (50, 99, 100)] if values else ["-"] * 3


def count(rows: list[dict], key: str) -> str:
    return f"{sum(bool(r[key]) for r in rows)}/{len(rows)}"


def report_kills(kills: list[dict], same_host: list[dict]) -> None:
    cases = (("victim held the mover lease", [k for k in kills if k["holder"]], "22.5"),
             ("victim did not", [k for k in kills if not k["holder"]], "12.5"), ("all", kills, ""))
    rows = [[label, len(got), *stats([k["from_kill"] for k in got]), *stats([k["from_beat"] for k in got
            if k["from_beat"]]), bound, *(count(got, key) for key in ("delivery 2", "on_running", "other_once"))]
            for label, got, bound in cases]
    print("\n1. celery-dlq (dlq_inflight_lease 10 s, heartbeat 2.5 s): SIGKILL of a busy worker to its task's "
          "start on another worker that was running (s):")
    print_table(["case", "kills", "from kill p50", "p99", "max", "from its last beat p50", "p99", "max",
                 "bound from beat", "delivery 2", "on a running worker", "other busy task started once"], rows)
    print("\nThe killed worker restarted at once on the same host (a non-holder; one kill at a time):")
    print_table(["kills", "kill+restart to task start p50", "p99", "max", "given back by the new worker",
                 "ran on the new worker", "delivery 2"],
                [[len(same_host), *stats([k["from_kill"] for k in same_host]),
                  *(count(same_host, key) for key in ("recovered", "on_fresh", "delivery 2"))]])


def report_celery(kills: list[dict], phase: dict, cap: float) -> None:
    ours = [k["from_kill"] for k in kills]
    rows = [["celery-dlq, defaults", len(ours), f"{len(ours)}/{len(ours)}", *stats(ours), "1.0x"]]
    for label, setting, limit in (("celery 3600", "plain Celery acks_late, visibility_timeout 3600 (default)", cap),
                                  ("celery 60", f"plain Celery acks_late, visibility_timeout {VIS}", VIS_CAP)):
        runs = phase.get(label, [])
        done = [r["from_kill"] for r in runs if r["from_kill"] is not None]
        whole = len(done) == len(runs) > 0
        rows.append([setting, len(runs), f"{len(done)}/{len(runs)} within {limit:.0f} s",
                     *(stats(done) if whole else [f"> {limit:.0f}"] * 3),
                     f"{pct(done, 50) / pct(ours, 50):.1f}x" if whole else f"> {limit / pct(ours, 50):.1f}x"])
    print(f"\n2. SIGKILL to the task's start on another worker (s); kombu's restore sweep at its defaults: "
          f"unacked_restore_interval {Channel.unacked_restore_interval} s x unacked_restore_throttle "
          f"{Channel.unacked_restore_throttle} (a scan every ~{SCAN} s per worker):")
    print_table(["side", "kills", "restarted", "p50", "p99", "max", "p50 vs celery-dlq"], rows)
    rows = []
    for label, side in (("live dlq", "celery-dlq, defaults"), ("live celery 60", f"plain Celery, visibility {VIS}")):
        runs = phase.get(label, [])
        rows.append([side, len(runs), " ".join(str(r["starts"]) for r in runs), sum(r["starts"] > 1 for r in runs),
                     "; ".join(str(r["later"]) for r in runs if r["later"]) or "-"])
    print(f"\nA {DUPLICATE_TASK} s task on a live worker (pairs never killed): how many times each started:")
    print_table(["side", "tasks", "starts per task", "started twice or more", "later starts (s after the first)"],
                rows)


def report_cost(cost: dict, ns: list[int]) -> None:
    rows = []
    for n in ns:
        for state in ("idle", "busy"):
            got = {side: [w[0] for w in cost.get((n, state, side), [])] for side in COST_SIDES}
            if not all(got.values()):
                continue
            mid = {side: median(v) for side, v in got.items()}
            top = sorted(cost[(n, state, "dlq")][0][1].items(), key=lambda kv: -kv[1])[:6]
            before = [f"{mid['dlq'] / mid['dlq_before']:.2f}x"] if "dlq_before" in mid else []
            rows.append([n, state, *(f"{mid[s]:.2f} ({min(got[s]):.2f}-{max(got[s]):.2f})" for s in COST_SIDES),
                         f"{mid['dlq'] / mid['celery']:.2f}x", f"{mid['dlq'] / mid['celery_late']:.2f}x", *before,
                         ", ".join(f"{k} {v:.2f}" for k, v in top)])
    print("\n3. Redis commands/s per worker, median of the rounds (min-max), every side in the same windows:")
    print_table(["N", "state", "celery-dlq", "plain Celery", "Celery acks_late",
                 *(["celery-dlq before"] if "dlq_before" in COST_SIDES else []), "dlq/Celery", "dlq/acks_late",
                 *(["dlq/before"] if "dlq_before" in COST_SIDES else []), "celery-dlq by command (first round)"], rows)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--kills", type=int, default=None, help="celery-dlq kills (default 20; 4 with --quick)")
    p.add_argument("--cells", type=int, default=None, help="celery-dlq groups run at once (default 4; 2 quick)")
    p.add_argument("--celery-cap", type=float, default=150.0, help="wait at Celery's default visibility (s)")
    p.add_argument("--window", type=float, default=None, help="cost window (s; default 40, 10 with --quick)")
    p.add_argument("--rounds", type=int, default=None, help="cost rounds (default 3; 1 with --quick)")
    p.add_argument("--cost-only", action="store_true", help="only the heartbeats' cost (part 3)")
    p.add_argument("--before", default=None, help="a directory holding an earlier celery_dlq package (part 3)")
    p.add_argument("--sizes", default="1,4", help="comma-separated N of part 3 (default 1,4)")
    results_file.add_argument(p)
    args = p.parse_args()
    global BEFORE
    if args.before:
        BEFORE = args.before
        COST_SIDES.append("dlq_before")
    sizes = [int(n) for n in args.sizes.split(",")]
    cells, kills = args.cells or (2 if args.quick else 4), args.kills or (4 if args.quick else 20)
    window, rounds = args.window or (10.0 if args.quick else 40.0), args.rounds or (1 if args.quick else 3)
    print(machine(), flush=True)
    if args.cost_only:
        cost = cost_phase(sizes, rounds, window)
        report_cost(cost, sizes)
        results_file.write(args.results, "recovery", cost_figures(cost, sizes), results_file.ENGINE)
        return
    pairs = ", ".join(f"{1 if args.quick else n} {label}" for label, *_, n in PLAN)
    print(f"celery-dlq: {kills} kills in {cells} groups of 3 workers at once, then {cells} same-host restarts one "
          f"at a time; pairs running meanwhile: {pairs}; cost: {rounds} round(s) of {window:.0f} s", flush=True)
    out: dict = {"kills": [], "same_host": [], "pairs": {}}
    began, started = time.monotonic(), threading.Event()
    plain = threading.Thread(target=celery_phase, args=(args, out["pairs"], started))
    plain.start()
    started.wait()
    print(f"plain Celery pairs ready ({time.monotonic() - began:.0f} s); celery-dlq kills ...", flush=True)
    threads(dlq_cell_run, [(i, kills // cells + (i < kills % cells), out) for i in range(cells)])
    plain.join()
    print(f"kills done ({time.monotonic() - began:.0f} s); cost windows ...", flush=True)
    cost = cost_phase(sizes, rounds, window)
    print(f"done ({time.monotonic() - began:.0f} s)")
    report_kills(out["kills"], out["same_host"])
    report_celery(out["kills"], out["pairs"], args.celery_cap)
    report_cost(cost, sizes)
    for text in anomalies:
        print(f"\nSUSPICIOUS: {text}")
    results_file.write(args.results, "recovery", {**kill_figures(out["kills"], out["pairs"], out["same_host"]),
                                                  **cost_figures(cost, sizes)}, results_file.ENGINE)


def kill_figures(kills: list[dict], pairs: dict, same_host: list[dict]) -> dict[str, float]:
    """Part 1 and 2's figures by name (seconds, as printed: one decimal)."""
    out: dict[str, float] = {"kills": len(kills), "same_host_restarts": len(same_host)}
    if same_host:
        restarted = [k["from_kill"] for k in same_host]
        out["same_host_from_kill_p50_s"] = round(pct(restarted, 50), 1)
        out["same_host_from_kill_max_s"] = round(pct(restarted, 100), 1)
    holder = [k for k in kills if k["holder"]]
    for case, got in (("holder", holder), ("not_holder", [k for k in kills if not k["holder"]]), ("all", kills)):
        from_kill = [k["from_kill"] for k in got]
        from_beat = [k["from_beat"] for k in got if k["from_beat"]]
        if from_kill:
            out[f"from_kill_p50_s.{case}"] = round(pct(from_kill, 50), 1)
            out[f"from_kill_max_s.{case}"] = round(pct(from_kill, 100), 1)
        if from_beat:
            out[f"from_beat_max_s.{case}"] = round(pct(from_beat, 100), 1)
    live = pairs.get("live dlq", [])
    out["live_tasks"] = len(live) + len(kills)   # the four long ones and each kill's other busy task
    out["live_started_twice"] = sum(r["starts"] > 1 for r in live) + sum(not k["other_once"] for k in kills)
    return out


def cost_figures(cost: dict, ns: list[int]) -> dict[str, float]:
    """Part 3's figures by name: commands/s per worker, medians of the rounds."""
    out: dict[str, float] = {}
    for n in ns:
        for state in ("idle", "busy"):
            for side in COST_SIDES:
                got = [w[0] for w in cost.get((n, state, side), [])]
                if got:
                    out[f"cmds_s_per_worker.{side}.{state}.n{n}"] = round(median(got), 2)
    return out


if __name__ == "__main__":
    main()
