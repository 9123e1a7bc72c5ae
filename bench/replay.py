"""Benchmark 13: an unthrottled replay of 100,000 dead letters, a whole DLQ and one failure group (target: >= 10,000/s).

Fills its own redis-server through the dead-letterer's own script
(``lua/dead_letter.lua``, so the group index is what a worker would have
written) with 1 kB letters, then times ``celery dlq replay`` as an operator
runs it (a subprocess of ``tests/integration/ops_app.py``, its start
included):

- ``replay DLQ.orders --all``: 100,000 letters;
- ``replay DLQ.mixed --group <id>``: the 100,000 letters of one group in a
  DLQ of 150,000 (the other 50,000, another group, must stay).

Each run then checks, in Redis, that every task id is in the target queue
exactly once and that the group counts match the letters left. Last, the
interrupted case: an unthrottled ``--all`` replay of 100,000 is SIGKILLed
once a fifth has moved and run again; every task id must be delivered exactly once.

Run: ``.venv/bin/python bench/replay.py [--quick] [--runs N]``.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from bench import results as results_file  # noqa: E402
from bench.common import ROOT, RedisServer, machine, parser, redis_server_version  # noqa: E402
from celery_dlq import headers as H  # noqa: E402
from celery_dlq.fingerprint import group_id  # noqa: E402
from celery_dlq.message import Envelope, payload_hash  # noqa: E402
from celery_dlq.storage import groups  # noqa: E402
from celery_dlq.storage.keys import QueueLists  # noqa: E402
from celery_dlq.storage.scripts import Scripts  # noqa: E402

TARGET = 10_000.0
LISTS = QueueLists()


def fill(client: redis.Redis, queue: str, n: int, task: str, message: str, start: int = 0) -> str:
    """``n`` dead letters of ``task`` on ``DLQ.<queue>``, pushed by dead_letter.lua; returns their group id."""
    scripts, dlq = Scripts(client), f"DLQ.{queue}"
    pipe = client.pipeline(transaction=False)
    script = scripts.get("dead_letter")
    gid = ""
    for i in range(start, start + n):
        task_id = f"{queue}-{i:08d}"
        headers = H.dead_letter_headers({"id": task_id, "task": task, "lang": "py", "argsrepr": f"({i},)",
                                         "retries": 2}, delivery=3, queue=queue, exchange="", routing_key=queue,
                                        reason="max_delivery_attempts",
                                        failure={"type": "KeyError", "message": message.format(i),
                                                 "traceback": "Traceback (most recent call last):\n" + " x" * 200},
                                        worker="w1@bench")
        gid = headers[H.GROUP] = group_id(task, "KeyError", message.format(i))
        body = f'[[{i}], {{}}, {{"callbacks": null}}]'.encode()
        headers[H.PAYLOAD_HASH] = payload_hash(task, body, "application/json", "utf-8")   # as the dead-letterer does
        envelope = Envelope(body, "application/json", "utf-8", headers, {"correlation_id": task_id}, "", queue, queue)
        at = headers[H.DEAD_LETTERED_AT]
        script(keys=[LISTS.key(dlq), LISTS.groups(dlq)],
               args=[envelope.element("", dlq, task_id), gid, "max_delivery_attempts", repr(at),
                     groups.hour_of(at), groups.describe(headers, task_id)], client=pipe)
        if len(pipe) >= 2000:
            pipe.execute()
    pipe.execute()
    return gid


def cli(url: str, queue: str, *args: str, root: Path = ROOT) -> subprocess.Popen:
    """``celery dlq ARGS`` of the checkout at ``root`` (another one: ``--baseline``)."""
    env = dict(os.environ, DLQ_TEST_BROKER=url, DLQ_TEST_QUEUE=queue, DLQ_TEST_PREFIX="bench", PYTHONPATH=str(root))
    return subprocess.Popen([sys.executable, "-m", "celery", "-A", "tests.integration.ops_app", "dlq", *args],
                            cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return info["used_cpu_user"] + info["used_cpu_sys"]


def timed_replay(url: str, queue: str, *args: str, root: Path = ROOT) -> tuple[float, float, float]:
    """Wall seconds, the CLI's CPU seconds and redis-server's CPU seconds of one ``replay``."""
    client = redis.Redis.from_url(url)
    children, server = resource.getrusage(resource.RUSAGE_CHILDREN), redis_cpu(client)
    started = time.perf_counter()
    proc = cli(url, queue, "replay", f"DLQ.{queue}", *args, root=root)
    out, err = proc.communicate(timeout=900)
    elapsed = time.perf_counter() - started
    assert proc.returncode == 0, out + err
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
    return elapsed, cpu, redis_cpu(client) - server


def delivered(client: redis.Redis, queue: str) -> Counter:
    return Counter(json.loads(raw)["headers"]["id"] for raw in client.lrange(queue, 0, -1))


def group_counts(client: redis.Redis, dlq: str) -> dict[str, int]:
    return {g.group_id: g.count for g in groups.parse(dlq, client.hgetall(LISTS.groups(dlq)), time.time())}


def check_exactly_once(client: redis.Redis, queue: str, expected: set[str]) -> None:
    seen = delivered(client, queue)
    assert set(seen) == expected and max(seen.values()) == 1, "a letter lost or delivered twice"


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--letters", type=int, default=100_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--baseline", type=Path, help="another checkout (e.g. `git archive <commit> | tar -x -C DIR`): "
                                                 "its `replay --all` is timed in the same runs, interleaved")
    results_file.add_argument(p)
    args = p.parse_args()
    if args.quick:
        args.letters, args.runs = 20_000, 1
    n = args.letters
    print(machine())
    server = RedisServer().start()
    try:
        client = redis.Redis.from_url(server.url)
        print(f"redis-server {redis_server_version(client)}; {n:,} letters per run, {args.runs} runs\n")
        rates: dict[str, list[float]] = {"whole DLQ (--all)": [], "one group (--group)": []}
        if args.baseline:
            rates["whole DLQ (--all), baseline"] = []
        cpus: dict[str, list[tuple[float, float]]] = {name: [] for name in rates}
        for run in range(args.runs):
            client.flushdb()
            fill(client, "orders", n, "shop.charge", "'user_{}'")
            size = len(client.lindex("DLQ.orders", 0))
            elapsed, cpu, server_cpu = timed_replay(server.url, "orders", "--all")
            cpus["whole DLQ (--all)"].append((cpu, server_cpu))
            check_exactly_once(client, "orders", {f"orders-{i:08d}" for i in range(n)})
            assert client.llen("DLQ.orders") == 0 and group_counts(client, "DLQ.orders") == {}
            rates["whole DLQ (--all)"].append(n / elapsed)
            print(f"run {run + 1}: --all {n:,} letters of {size} B in {elapsed:.2f} s = {n / elapsed:,.0f}/s "
                  f"(CLI {cpu:.2f} s CPU, redis-server {server_cpu:.2f} s CPU)")

            if args.baseline:
                client.flushdb()
                fill(client, "orders", n, "shop.charge", "'user_{}'")
                elapsed, cpu, server_cpu = timed_replay(server.url, "orders", "--all", root=args.baseline.resolve())
                check_exactly_once(client, "orders", {f"orders-{i:08d}" for i in range(n)})
                rates["whole DLQ (--all), baseline"].append(n / elapsed)
                cpus["whole DLQ (--all), baseline"].append((cpu, server_cpu))
                print(f"run {run + 1}: baseline --all in {elapsed:.2f} s = {n / elapsed:,.0f}/s "
                      f"(CLI {cpu:.2f} s CPU, redis-server {server_cpu:.2f} s CPU)")

            client.flushdb()
            gid = fill(client, "mixed", n, "shop.charge", "'user_{}'")
            other = fill(client, "mixed", n // 2, "shop.ship", "carrier {} down", start=n)
            elapsed, cpu, server_cpu = timed_replay(server.url, "mixed", "--group", gid)
            cpus["one group (--group)"].append((cpu, server_cpu))
            check_exactly_once(client, "mixed", {f"mixed-{i:08d}" for i in range(n)})
            assert group_counts(client, "DLQ.mixed") == {other: n // 2} == {other: client.llen("DLQ.mixed")}
            rates["one group (--group)"].append(n / elapsed)
            print(f"run {run + 1}: --group {n:,} of {n + n // 2:,} letters in {elapsed:.2f} s = {n / elapsed:,.0f}/s "
                  f"(CLI {cpu:.2f} s CPU, redis-server {server_cpu:.2f} s CPU)")

        client.flushdb()
        fill(client, "killed", n, "shop.charge", "'user_{}'")
        proc = cli(server.url, "killed", "replay", "DLQ.killed", "--all")
        deadline = time.monotonic() + 300
        while client.llen("killed") < n // 5 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)   # until a fifth has moved: mid-run, whatever the CLI's start took
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        moved = client.llen("killed")
        assert moved + client.llen("DLQ.killed") == n, "the kill lost or doubled a letter"
        timed_replay(server.url, "killed", "--all")
        check_exactly_once(client, "killed", {f"killed-{i:08d}" for i in range(n)})
        assert 0 < moved < n, f"not killed mid-run ({moved:,} of {n:,} moved)"
        print(f"\nkilled with {moved:,} of {n:,} moved, run again: {n:,} delivered exactly once")

        print(f"\n| replay (CLI, start included) | median letters/s | min | max | CLI CPU s | redis CPU s | "
              f"letters per CLI CPU s | target |\n|---|---|---|---|---|---|---|---|")
        for name, values in rates.items():
            med = statistics.median(values)
            cli_cpu = statistics.median(c for c, _ in cpus[name])
            server_cpu = statistics.median(s for _, s in cpus[name])
            print(f"| {name} | {med:,.0f} | {min(values):,.0f} | {max(values):,.0f} | {cli_cpu:.2f} | "
                  f"{server_cpu:.2f} | {n / cli_cpu:,.0f} | {'met' if med >= TARGET else 'MISSED'} (>= {TARGET:,.0f}) |")
        print(f"\nload average at the end: {os.getloadavg()[0]:.2f}")
        figures: dict = {"letters": n, "runs": args.runs}
        for name, values in rates.items():
            key = {"whole DLQ (--all)": "all", "one group (--group)": "group"}.get(name, "all_baseline")
            figures[f"letters_per_s.{key}"] = round(statistics.median(values))
            figures[f"cli_cpu_us_per_letter.{key}"] = round(statistics.median(c for c, _ in cpus[name]) / n * 1e6)
            figures[f"redis_cpu_us_per_letter.{key}"] = round(statistics.median(s for _, s in cpus[name]) / n * 1e6)
        results_file.write(args.results, "replay", figures, ["celery_dlq/ops/", "celery_dlq/cli/",
                                                             "celery_dlq/storage/", "celery_dlq/message.py"],
                           redis_server_version(client))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
