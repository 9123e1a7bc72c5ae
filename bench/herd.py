"""Benchmark 13: N idle fetchers on one Redis, past what this machine's real workers reach (issue #30).

Real workers stop at about 30 on a 2-core machine (``bench/scale.py``).
Here each side runs N *simulated* fetchers in one asyncio loop, each with
its own connection, speaking the same Redis protocol as the worker:

- ``celery``: kombu's fetch: ``BRPOP <8 lists> 1`` (two queues, four
  priority steps), then kombu's ``QoS.append`` (MULTI ZADD HSET EXEC) and,
  after the "task", its ack (MULTI ZREM HDEL EXEC);
- ``dlq``: celery-dlq's fetch: ``fetch.lua`` with the transport's keys and
  arguments (``worker/fetch/transport.py``), the idle wait on the wake markers
  (``BZPOPMIN``) or the fallback wait, the ack (HDEL ZREM SREM), a
  heartbeat (``SET NX PX``) every ``dlq_heartbeat_interval``; the lease
  holder's real :class:`~celery_dlq.worker.leader.lease.Leader` and
  :class:`~celery_dlq.worker.fetch.listener.FetchListener` threads run
  beside them, for the first fetcher's worker. With ``--notify`` its server also sends keyspace events
  (``Kl``), which the fetch ignores.

Both sides run at once on two redis-servers, so their windows interleave by
construction; each phase is repeated ``--rounds`` times and medians
(min-max) are reported. Per N: idle commands/s per fetcher; a trickle (5
tasks/s over the three lists: default queue, second queue, priority 9) and
a steady load (200 tasks/s): Redis commands and Redis CPU (``INFO cpu``)
per task, with the idle rate of the same window included (what a user's
Redis sees) and beyond it (what one more task costs, which must not grow
with N); pickup latency (publish to fetch) p50/p99 per list in the trickle.

``--before DIR`` adds a third side, ``dlq_before``: the same simulated
fetchers driving an earlier commit's ``celery_dlq`` package (``DIR`` holds it:
``git archive <commit> celery_dlq | tar -x -C DIR``): its ``fetch.lua``, its
fetch wait's constants and its real lease holder and listener threads, run in
a child process (one process imports one ``celery_dlq``) on a third
redis-server at once with the other two, and the after/before ratios
(``dlq`` over ``dlq_before``). So that both run alike, the ``dlq`` side then
runs in a child of its own too, on this checkout's package (its commands do
not depend on where it runs; its pickup latency may: Celery's side keeps
this process's loop to itself). The child knows this checkout's module layout
and the one before ``worker/`` was split into subpackages (``01c8b33``;
checked with ``4946e81``).
"""
from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402
import redis.asyncio as aioredis  # noqa: E402

from bench import results as results_file  # noqa: E402
from bench.common import RedisServer, machine, median, parser, pct, print_table, ratio, spread, stop_process  # noqa: E402
from celery_dlq.settings import DEFAULTS  # noqa: E402
from celery_dlq.storage.keys import Keys, QueueLists  # noqa: E402
from celery_dlq.storage.scripts import script_source  # noqa: E402

# This checkout's layout; each ``except`` is an earlier package's (``--before DIR``, run in the child: module
# docstring), as this file drove it then.
try:
    from celery_dlq.storage.fetch import FetchLayout
except ImportError:   # before 1098321: fetch.lua's keys and arguments listed in order (``DlqFetcher.compose``)
    FetchLayout = None
try:
    from celery_dlq.worker.fetch.listener import FetchListener
    from celery_dlq.worker.fetch.moves import FetchMoves
    from celery_dlq.worker.fetch.transport import FALLBACK, FETCH, HEARD_FOR, MARKER_WAIT, MARKERS, REGISTER_EVERY
except ImportError:   # before 01c8b33: worker/ not yet in subpackages
    from celery_dlq.worker.fetch_listener import FetchListener
    from celery_dlq.worker.fetch_moves import FetchMoves
    from celery_dlq.worker.fetch_wait import FALLBACK, FETCH, HEARD_FOR, MARKER_WAIT, MARKERS, REGISTER_EVERY
try:
    from celery_dlq.worker.leader.lease import Leader, LeaderLease
except ImportError:   # before 01c8b33: the mover's lease and its heartbeat thread
    from celery_dlq.storage.lease import MoverLease
    from celery_dlq.worker.heartbeat import Heartbeat as Leader
    LeaderLease = None

INFLIGHT_LEASE = DEFAULTS["dlq_inflight_lease"]

QUEUES = ("herd", "herd2")
LISTS = QueueLists()
PREFIX = "herd"
KEYS = Keys(PREFIX)
#: The three lists the trickle rotates over (queue, priority).
TARGETS = {"default queue": ("herd", 0), "second queue": ("herd2", 0), "priority sub-list": ("herd", 9)}
HEARTBEAT = 2.5
OWN = ("info", "client|list", "config|set", "flushall", "script|load", "ping")
ROOT = Path(__file__).resolve().parents[1]
#: ``--before``: the directory holding an earlier commit's ``celery_dlq`` package, the side ``dlq_before``.
BEFORE: str | None = None
#: A celery-dlq side's child (``--before``): its package's ``celery_dlq`` imported first, then this file
#: (:func:`serve_side`).
SIDE_CHILD = ("import sys; sys.path[:0] = sys.argv[1:3]; import celery_dlq; "
                "assert celery_dlq.__file__.startswith(sys.argv[1]), celery_dlq.__file__; "
                "from bench import herd; herd.serve_side(sys.argv[3], int(sys.argv[4]))")


def ordered_lists() -> list[str]:
    """kombu's BRPOP order: priority-major over the queues."""
    return [LISTS.key(queue, step) for step in LISTS.steps for queue in QUEUES]


def element(queue: str, priority: int) -> bytes:
    return json.dumps({"body": "", "content-type": "application/json", "content-encoding": "utf-8",
                       "headers": {"sent": time.time()},
                       "properties": {"delivery_tag": uuid.uuid4().hex, "priority": priority,
                                      "body_encoding": "base64",
                                      "delivery_info": {"exchange": "", "routing_key": queue}}}).encode()


class Stats:
    def __init__(self) -> None:
        self.pickups: dict[str, list[float]] = {}
        self.taken = 0

    def took(self, raw: bytes) -> None:
        message = json.loads(raw)
        sent = message["headers"]["sent"]
        info = message["properties"]["delivery_info"]["routing_key"]
        label = ("priority sub-list" if message["properties"]["priority"] else
                 "second queue" if info == "herd2" else "default queue")
        self.add(label, time.time() - sent)

    def add(self, label: str, seconds: float) -> None:
        self.pickups.setdefault(label, []).append(seconds)
        self.taken += 1


class PipedStats(Stats):
    """A celery-dlq side's child's (``--before``): each fetch also written to stdout, for the parent's
    :class:`Stats`."""

    def add(self, label: str, seconds: float) -> None:
        super().add(label, seconds)
        print(f"took\t{label}\t{seconds!r}", flush=True)


async def plain_fetcher(url: str, stats: Stats, stop: asyncio.Event) -> None:
    client = aioredis.Redis.from_url(url, single_connection_client=True, socket_timeout=None, protocol=2)
    lists = ordered_lists()
    try:
        while not stop.is_set():
            reply = await client.brpop(lists, timeout=1)
            if reply is None:
                continue
            message = json.loads(reply[1])
            tag = message["properties"]["delivery_tag"]
            pipe = client.pipeline(transaction=True)   # kombu's QoS.append
            pipe.zadd("unacked_index", {tag: time.time()}).hset("unacked", tag, reply[1])
            await pipe.execute()
            stats.took(reply[1])
            pipe = client.pipeline(transaction=True)   # kombu's ack
            pipe.zrem("unacked_index", tag).hdel("unacked", tag)
            await pipe.execute()
    finally:
        await client.aclose()


class DlqFetcher:
    """One channel of celery-dlq's transport, as ``_brpop_start``/``_brpop_read`` drive it."""

    def __init__(self, url: str, ident: int, stats: Stats, sha: str) -> None:
        self.client = aioredis.Redis.from_url(url, single_connection_client=True, socket_timeout=None, protocol=2)
        self.beat_client = aioredis.Redis.from_url(url, single_connection_client=True, protocol=2)
        self.stats, self.sha, self.ident = stats, sha, f"sim:{ident}"
        self.lists = ordered_lists()
        self.markers = [KEYS.fetch_marker(queue) for queue in QUEUES]
        self.wake = KEYS.fetch_wake(self.ident)
        self.inflight = KEYS.inflight(self.ident)
        moves = FetchMoves(tuple(KEYS.move_keys()), 0)
        self.moves = moves
        if FetchLayout is not None:
            self.layout = FetchLayout(KEYS, self.ident, tuple(self.lists), tuple(map(LISTS.queue_of, self.lists)),
                                      markers=tuple(QUEUES), moves=moves.keys)
        else:   # an earlier package (--before): fetch.lua's keys in its order
            self.keys = [*self.lists, *(KEYS.quarantine(LISTS.queue_of(k)) for k in self.lists), self.inflight,
                         KEYS.consumers, *self.markers, KEYS.fetch_queues, KEYS.fetch_listening, *moves.keys]
        self.next, self.took, self.heard_at, self.registered_at = FETCH, False, -HEARD_FOR, -REGISTER_EVERY
        self.beat_at = -INFLIGHT_LEASE
        #: Real workers start at different times: the first wait and beat are spread over their periods, so a
        #: window of the benchmark sees their average rates, not all of them at once (each later wait is
        #: U(0.5, 1) x MARKER_WAIT, as the transport's).
        self.first_wait = random.uniform(1.0, MARKER_WAIT)

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                await self.step()
        finally:
            await self.client.aclose()

    async def step(self) -> None:
        if self.next == MARKERS:
            wait, self.first_wait = self.first_wait or MARKER_WAIT * random.uniform(0.5, 1.0), 0.0
            woken = await self.client.bzpopmin([self.wake, *self.markers], timeout=wait)
            quiet = woken is None and time.monotonic() - self.heard_at < HEARD_FOR - MARKER_WAIT
            self.next = MARKERS if quiet else FETCH
            return
        if self.next == FALLBACK:
            await self.client.execute_command("BLMOVE", self.lists[0], self.lists[0], "RIGHT", "RIGHT", 1.0)
            self.next = FETCH
            return
        now, clock = time.time(), time.monotonic()
        register = clock - self.registered_at >= REGISTER_EVERY
        if register:
            self.registered_at = clock
        moves = self.moves.args(now) if self.took else []
        beat = clock - self.beat_at > INFLIGHT_LEASE / 3   # as worker/leader/inflight.py
        keys, args = self.compose(now, beat, register, moves)
        reply = await self.client.evalsha(self.sha, len(keys), *keys, *args)
        if reply and beat:
            self.beat_at = clock
        self.took = bool(reply)
        if not reply:
            if reply == 0:
                self.heard_at = time.monotonic()
            self.next = MARKERS if reply == 0 else FALLBACK
            return
        more = int(reply[4])
        self.next = FETCH if more or time.monotonic() - self.heard_at >= HEARD_FOR else MARKERS
        tag = reply[3].decode()
        self.stats.took(reply[1])
        await self.client.hdel(self.inflight, tag)   # the transport's ack

    def compose(self, now: float, beat: bool, register: bool, moves: list) -> tuple[list, list]:
        """fetch.lua's KEYS and ARGV (an earlier package's, before FetchLayout: as this file sent them then)."""
        if FetchLayout is not None:
            return self.layout.compose(now_ms=int(now * 1000), beat=beat, register=register, moves=moves)
        return self.keys, [len(self.lists), self.ident if beat else "", len(QUEUES), int(now * 1000),
                           "1" if register else "", *QUEUES, "0", *moves]

    async def beat(self, stop: asyncio.Event) -> None:
        """A worker without the lease: SET NX PX every interval (``redis/lease.py``)."""
        try:
            await asyncio.sleep(random.uniform(0, HEARTBEAT))
            while not stop.is_set():
                await self.beat_client.set(KEYS.mover_lease, self.ident, nx=True, px=7500)
                try:
                    await asyncio.wait_for(stop.wait(), HEARTBEAT)
                except asyncio.TimeoutError:
                    pass
        finally:
            await self.beat_client.aclose()


def snapshot(client: redis.Redis) -> tuple[float, int, float, dict[str, int]]:
    stats = client.info("commandstats")
    cpu = client.info("cpu")
    by = {name[len("cmdstat_"):]: int(row["calls"]) for name, row in stats.items()
          if name[len("cmdstat_"):] not in OWN}
    return time.monotonic(), sum(by.values()), float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), by


def start_holder(client: redis.Redis, url: str, threads: list) -> None:
    """The lease holder's real heartbeat and fetch listener (a worker's threads), appended to ``threads``."""
    if LeaderLease is not None:
        lease = LeaderLease(client, KEYS.mover_lease, "holder", 10.0, HEARTBEAT)
    else:   # an earlier package (--before)
        lease = MoverLease(client, KEYS, "holder", 10.0, HEARTBEAT)

    def on_role(holds: bool) -> None:
        if holds:
            listener = FetchListener(lambda: redis.Redis.from_url(url, protocol=2), KEYS, LISTS)
            listener.start()
            threads.append(listener)

    heartbeat = Leader(lease, on_role=on_role)
    heartbeat.start()
    threads.append(heartbeat)
    heartbeat.holder.wait(10)


def dlq_fetchers(client: redis.Redis, url: str, n: int, stats: Stats, stop: asyncio.Event,
                 threads: list) -> list[asyncio.Task]:
    """A celery-dlq side on ``url``: the lease holder's threads (appended to ``threads``) and ``n`` fetchers,
    each but the first beating (fetcher 0 is the lease holder's worker: its beats are the real Heartbeat's)."""
    start_holder(client, url, threads)
    sha = client.script_load(script_source("fetch"))
    tasks = []
    for i in range(n):
        fetcher = DlqFetcher(url, i, stats, sha)
        tasks.append(asyncio.create_task(fetcher.run(stop)))
        if i:
            tasks.append(asyncio.create_task(fetcher.beat(stop)))
    return tasks


class Side:
    def __init__(self, name: str, n: int, notify: bool) -> None:
        self.name, self.n = name, n
        self.server = RedisServer(None, *(("--notify-keyspace-events", "Kl") if notify else ()),
                                  "--maxclients", "10000").start()
        self.client = redis.Redis.from_url(self.server.url)
        self.stats = Stats()
        self.threads: list = []
        self.child: subprocess.Popen | None = None

    def start_child(self, package: str) -> None:
        """This side's fetchers, their beats and the lease holder's threads in a child on ``package``'s
        ``celery_dlq`` (:func:`serve_side`); its fetches come back on its stdout, into :attr:`stats`."""
        self.log = tempfile.TemporaryFile()
        self.child = subprocess.Popen([sys.executable, "-c", SIDE_CHILD, package, str(ROOT), self.server.url,
                                       str(self.n)], cwd=package, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self.log, text=True, start_new_session=True)
        ready = threading.Event()

        def read(child: subprocess.Popen) -> None:
            for line in child.stdout:
                word, *rest = line.rstrip("\n").split("\t")
                if word == "took":
                    self.stats.add(rest[0], float(rest[1]))
                elif word == "ready":
                    ready.set()

        threading.Thread(target=read, args=(self.child,), daemon=True).start()
        deadline = time.monotonic() + 60
        while not ready.wait(0.2):
            if self.child.poll() is not None or time.monotonic() > deadline:
                self.log.seek(0)
                raise RuntimeError(f"the {self.name} side's child did not start:\n"
                                   f"{self.log.read().decode(errors='replace')[-3000:]}")

    def stop_child(self) -> None:
        """Its stdin closed, the child stops its fetchers and threads and exits."""
        if self.child is None:
            return
        try:
            self.child.stdin.close()
            self.child.wait(30)
        except (OSError, subprocess.TimeoutExpired):
            pass
        stop_process(self.child)
        self.log.close()
        self.child = None

    def stop(self) -> None:
        self.stop_child()
        for thread in self.threads:
            thread.stop()
        self.server.stop()


def serve_side(url: str, n: int) -> None:
    """A celery-dlq side's child (``SIDE_CHILD``): ``n`` fetchers and the holder's threads of this process's
    ``celery_dlq`` on ``url``'s server, as :func:`run_n` runs the ``dlq`` side's, until stdin closes."""
    asyncio.run(_serve_side(url, n))


async def _serve_side(url: str, n: int) -> None:
    client = redis.Redis.from_url(url)
    threads: list = []
    stats, stop, tasks = PipedStats(), asyncio.Event(), []
    try:
        tasks += dlq_fetchers(client, url, n, stats, stop, threads)
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)   # the parent closes it: stop
    finally:
        stop.set()
        try:   # ends the blocked waits at once
            client.client_kill_filter(_type="normal", skipme=True)
        except redis.RedisError:
            pass
        await asyncio.gather(*tasks, return_exceptions=True)
        for thread in threads:
            thread.stop()


async def run_n(n: int, rounds: int, idle_window: float, trickle: int, load: int, notify: bool) -> dict:
    sides = {"celery": Side("celery", n, False), "dlq": Side("dlq", n, notify)}
    if BEFORE:
        sides["dlq_before"] = Side("dlq_before", n, notify)
    stop = asyncio.Event()
    tasks = []
    result: dict = {"n": n, "idle": {}, "trickle": {}, "load": {}, "pickup": {}}
    try:
        dlq = sides["dlq"]
        if BEFORE:   # both celery-dlq sides alike: each in its own child, neither sharing this loop
            dlq.start_child(str(ROOT))
            sides["dlq_before"].start_child(BEFORE)
        else:
            tasks += dlq_fetchers(dlq.client, dlq.server.url, n, dlq.stats, stop, dlq.threads)
        for _ in range(n):
            tasks.append(asyncio.create_task(plain_fetcher(sides["celery"].server.url, sides["celery"].stats, stop)))
        await asyncio.sleep(8.0 + n / 100)   # connected, registered, heard, blocked
        publishers = {name: aioredis.Redis.from_url(side.server.url, protocol=2) for name, side in sides.items()}
        for _ in range(rounds):
            await asyncio.sleep(random.uniform(0, MARKER_WAIT))   # no round in step with the waits' period
            before = {name: snapshot(side.client) for name, side in sides.items()}
            await asyncio.sleep(idle_window)
            after = {name: snapshot(side.client) for name, side in sides.items()}
            for name in sides:
                seconds = after[name][0] - before[name][0]
                result["idle"].setdefault(name, []).append((after[name][1] - before[name][1]) / seconds / n)
                result.setdefault("idle_by", {})[name] = {
                    k: round((v - before[name][3].get(k, 0)) / seconds / n, 3) for k, v in after[name][3].items()
                    if v != before[name][3].get(k, 0)}
            for phase, count, rate in (("trickle", trickle, 5.0), ("load", load, 200.0)):
                before = {name: snapshot(side.client) for name, side in sides.items()}
                taken = {name: side.stats.taken for name, side in sides.items()}
                labels = list(TARGETS)
                for i in range(count):
                    queue, priority = TARGETS[labels[i % len(labels)]] if phase == "trickle" else ("herd", 0)
                    for name, pub in publishers.items():
                        await pub.lpush(LISTS.key(queue, priority), element(queue, priority))
                    await asyncio.sleep(1.0 / rate)
                end = time.monotonic() + 60
                while any(side.stats.taken - taken[name] < count for name, side in sides.items()) \
                        and time.monotonic() < end:
                    await asyncio.sleep(0.01)
                after = {name: snapshot(side.client) for name, side in sides.items()}
                for name in sides:
                    seconds = after[name][0] - before[name][0]
                    total = after[name][1] - before[name][1]
                    idle = result["idle"][name][-1] * n * seconds   # this round's idle rate, over this window
                    by = {k: round((v - before[name][3].get(k, 0)) / count, 2) for k, v in after[name][3].items()
                          if v != before[name][3].get(k, 0)}
                    result[phase].setdefault(name, []).append(
                        (total / count, (after[name][2] - before[name][2]) * 1000 / count, (total - idle) / count, by))
        for name, side in sides.items():
            result["pickup"][name] = side.stats.pickups
        for pub in publishers.values():
            await pub.aclose()
    finally:
        stop.set()
        for side in sides.values():
            side.stop_child()
        for side in sides.values():   # ends the blocked waits at once
            try:
                side.client.client_kill_filter(_type="normal", skipme=True)
            except redis.RedisError:
                pass
        await asyncio.gather(*tasks, return_exceptions=True)
        for side in sides.values():
            side.stop()
    return result



def report(results: list[dict]) -> None:
    rows = []
    for r in results:
        idle = {name: median(v) for name, v in r["idle"].items()}
        trickle = {name: median([x[0] for x in v]) for name, v in r["trickle"].items()}
        load = {name: median([x[0] for x in v]) for name, v in r["load"].items()}
        rows.append([r["n"], spread(r["idle"]["celery"]), spread(r["idle"]["dlq"]),
                     f"{idle['dlq'] / idle['celery']:.2f}x" if idle["celery"] else "-",
                     spread([x[0] for x in r["trickle"]["celery"]], "{:.1f}"),
                     spread([x[0] for x in r["trickle"]["dlq"]], "{:.1f}"), f"{trickle['dlq'] / trickle['celery']:.2f}x",
                     spread([x[0] for x in r["load"]["celery"]], "{:.1f}"),
                     spread([x[0] for x in r["load"]["dlq"]], "{:.1f}"), f"{load['dlq'] / load['celery']:.2f}x"])
    print("\nRedis commands, median (min-max) of the rounds: idle per fetcher per second; per task (the idle "
          "rate of the window included) under a trickle of 5 tasks/s and a load of 200 tasks/s:")
    print_table(["N", "idle celery", "idle dlq", "ratio", "trickle celery", "trickle dlq", "ratio",
                 "load celery", "load dlq", "ratio"], rows)
    rows = []
    for r in results:
        cols = []
        for phase in ("trickle", "load"):
            marginal = {side: [x[2] for x in r[phase][side]] for side in ("celery", "dlq")}
            cols += [spread(marginal["celery"], "{:.1f}"), spread(marginal["dlq"], "{:.1f}"),
                     f"{median(marginal['dlq']) / median(marginal['celery']):.2f}x"]
        rows.append([r["n"], *cols])
    print("\nRedis commands per task beyond the idle rate of the same round (what one more task costs), "
          "median (min-max):")
    print_table(["N", "trickle celery", "trickle dlq", "ratio", "load celery", "load dlq", "ratio"], rows)
    for r in results:
        print(f"  N={r['n']} idle, per fetcher per second by command (last round): {r.get('idle_by')}")
        for phase in ("trickle", "load"):
            print(f"  N={r['n']} {phase}, per task by command (first round): celery {r[phase]['celery'][0][3]}")
            print(f"  N={r['n']} {phase}, per task by command (first round): dlq {r[phase]['dlq'][0][3]}")
    rows = []
    for r in results:
        rows.append([r["n"]] + [spread([x[1] for x in r[phase][side]], "{:.3f}")
                                for phase in ("trickle", "load") for side in ("celery", "dlq")])
    print("\nRedis CPU per task (ms), median (min-max):")
    print_table(["N", "trickle celery", "trickle dlq", "load celery", "load dlq"], rows)
    rows = []
    for r in results:
        for label in TARGETS:
            c = r["pickup"]["celery"].get(label, [])
            d = r["pickup"]["dlq"].get(label, [])
            if c and d:
                rows.append([r["n"], label, f"{pct(c, 50) * 1000:.2f}", f"{pct(c, 99) * 1000:.2f}",
                             f"{pct(d, 50) * 1000:.2f}", f"{pct(d, 99) * 1000:.2f}", len(d)])
    print("\nPickup, publish to fetch (ms), every round's trickle and load together:")
    print_table(["N", "list", "celery p50", "celery p99", "dlq p50", "dlq p99", "samples"], rows)
    if any("dlq_before" in r["idle"] for r in results):
        report_before(results)



def report_before(results: list[dict]) -> None:
    """``--before``: the dlq_before side beside the others, and dlq over dlq_before (after/before)."""
    sides = ("celery", "dlq", "dlq_before")
    rows = []
    for r in (r for r in results if "dlq_before" in r["idle"]):
        mid = {side: median(r["idle"][side]) for side in sides}
        rows.append([r["n"], "idle commands/s per fetcher", *(f"{mid[s]:.2f}" for s in sides),
                     spread(r["idle"]["dlq_before"]), ratio(mid["dlq_before"], mid["celery"]),
                     ratio(mid["dlq"], mid["dlq_before"])])
        for phase in ("trickle", "load"):
            for i, what, fmt in ((0, "commands per task", "{:.1f}"), (2, "beyond idle", "{:.1f}"),
                                 (1, "Redis CPU ms per task", "{:.3f}")):
                values = {side: [x[i] for x in r[phase][side]] for side in sides}
                mid = {side: median(v) for side, v in values.items()}
                rows.append([r["n"], f"{phase}: {what}", *(fmt.format(mid[s]) for s in sides),
                             spread(values["dlq_before"], fmt), ratio(mid["dlq_before"], mid["celery"]),
                             ratio(mid["dlq"], mid["dlq_before"])])
    print("\n--before: the earlier package's side (dlq_before), medians of the rounds in the same windows:")
    print_table(["N", "figure", "celery", "dlq", "dlq_before", "dlq_before (min-max)", "before/celery",
                 "after/before"], rows)
    rows = []
    for r in (r for r in results if "dlq_before" in r["idle"]):
        for label in TARGETS:
            got = {side: r["pickup"][side].get(label, []) for side in sides}
            if all(got.values()):
                rows.append([r["n"], label, f"{pct(got['dlq_before'], 50) * 1000:.2f}",
                             f"{pct(got['dlq_before'], 99) * 1000:.2f}", f"{pct(got['dlq'], 99) * 1000:.2f}",
                             f"{(pct(got['dlq'], 99) - pct(got['dlq_before'], 99)) * 1000:+.2f}",
                             len(got["dlq_before"])])
    print("\nPickup, publish to fetch (ms), dlq_before beside dlq:")
    print_table(["N", "list", "dlq_before p50", "dlq_before p99", "dlq p99", "after - before p99", "samples"], rows)


def figures(results: list[dict]) -> dict[str, float]:
    """The printed tables' figures by name, ``<figure>.n<N>`` (medians of the rounds, as printed)."""
    out: dict[str, float] = {}
    for r in results:
        n = r["n"]
        idle = {name: median(v) for name, v in r["idle"].items()}
        if idle["celery"]:
            out[f"idle_ratio.n{n}"] = round(idle["dlq"] / idle["celery"], 2)
        for phase in ("trickle", "load"):
            total = {side: median([x[0] for x in r[phase][side]]) for side in ("celery", "dlq")}
            out[f"cmds_per_task_ratio.{phase}.n{n}"] = round(total["dlq"] / total["celery"], 2)
        for label in TARGETS:
            c, d = r["pickup"]["celery"].get(label, []), r["pickup"]["dlq"].get(label, [])
            if c and d:
                out[f"pickup_p99_gap_ms.{label.replace(' ', '_')}.n{n}"] = round((pct(d, 99) - pct(c, 99)) * 1000, 2)
    gaps = [v for k, v in out.items() if k.startswith("pickup_p99_gap_ms.")]
    if gaps:
        out["pickup_p99_gap_max_ms"] = round(max(gaps), 1)
    return {**out, **before_figures(results)}


def before_figures(results: list[dict]) -> dict[str, float]:
    """``--before``: the dlq_before side's figures as :func:`figures` names the dlq side's (``before.<figure>``,
    against Celery), and the after/before ones (``after_before.<figure>``: dlq over dlq_before; for pickup, dlq's
    p99 less dlq_before's)."""
    out: dict[str, float] = {}
    for r in (r for r in results if "dlq_before" in r["idle"]):
        n = r["n"]
        idle = {name: median(v) for name, v in r["idle"].items()}
        if idle["celery"]:
            out[f"before.idle_ratio.n{n}"] = round(idle["dlq_before"] / idle["celery"], 2)
        if idle["dlq_before"]:
            out[f"after_before.idle.n{n}"] = round(idle["dlq"] / idle["dlq_before"], 2)
        for phase in ("trickle", "load"):
            total = {side: median([x[0] for x in r[phase][side]]) for side in ("celery", "dlq", "dlq_before")}
            beyond = {side: median([x[2] for x in r[phase][side]]) for side in ("dlq", "dlq_before")}
            out[f"before.cmds_per_task_ratio.{phase}.n{n}"] = round(total["dlq_before"] / total["celery"], 2)
            out[f"after_before.cmds_per_task.{phase}.n{n}"] = round(total["dlq"] / total["dlq_before"], 2)
            if beyond["dlq_before"] > 0:
                out[f"after_before.cmds_per_task_beyond_idle.{phase}.n{n}"] = round(
                    beyond["dlq"] / beyond["dlq_before"], 2)
        for label in TARGETS:
            c, d, b = (r["pickup"][side].get(label, []) for side in ("celery", "dlq", "dlq_before"))
            name = label.replace(" ", "_")
            if c and b:
                out[f"before.pickup_p99_gap_ms.{name}.n{n}"] = round((pct(b, 99) - pct(c, 99)) * 1000, 2)
            if d and b:
                out[f"after_before.pickup_p99_gap_ms.{name}.n{n}"] = round((pct(d, 99) - pct(b, 99)) * 1000, 2)
    gaps = [v for k, v in out.items() if k.startswith("before.pickup_p99_gap_ms.")]
    if gaps:
        out["before.pickup_p99_gap_max_ms"] = round(max(gaps), 1)
    return out


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--fetchers", default=None, help="comma-separated N (default 1,10,100,1000; 1,10,100 --quick)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--notify", action="store_true", help="the dlq side's server sends keyspace events (Kl)")
    p.add_argument("--json", default=None, help="write the raw results here")
    p.add_argument("--before", default=None, metavar="DIR",
                   help="a directory holding an earlier celery_dlq package: the third side, dlq_before")
    results_file.add_argument(p)
    args = p.parse_args()
    global BEFORE
    BEFORE = args.before
    ns = [int(x) for x in (args.fetchers or ("1,10,100" if args.quick else "1,10,100,1000")).split(",")]
    idle_window, trickle, load = (4.0, 15, 200) if args.quick else (10.0, 30, 1000)
    print(machine(), f"notify={args.notify}")
    results = []
    for n in ns:
        print(f"N={n} ...", flush=True)
        results.append(asyncio.run(run_n(n, args.rounds, idle_window, trickle, load, args.notify)))
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
    report(results)
    results_file.write(args.results, "herd", {"notify": args.notify, **figures(results)}, results_file.ENGINE)


if __name__ == "__main__":
    main()
