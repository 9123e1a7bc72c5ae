"""Benchmark 14: a chord of 1,000 members, 10 of them dead-lettered, then replayed (rule ``wait``).

One redis-server of its own (broker, result backend or not, store), one
``celery worker -P prefork -c 2`` of ``tests/integration/proj.py``. The
header is 990 ``proj.noop`` and 10 ``proj.fixed_by_flag`` (failing while
``<prefix>:broken`` exists: 2 deliveries, then dead-lettered); the body is
``proj.tsum``. Once the 10 letters are in the DLQ and the chord waits:

- **what a waiting chord costs Redis**: commands per minute
  (``total_commands_processed``, the benchmark's own reads taken off) over
  a window with the chord waiting, next to the same window with the same
  worker idle before the chord was sent;
- **replay to body**: the cause fixed, ``celery dlq replay DLQ.<queue> --all``
  run as an operator runs it; the time from the replay's start (its
  process start included) and from its end to the body's first run, and
  that the body ran exactly once, with 1,000 results in header order.

``--backend sqlite`` runs the chord on Celery's database backend (SQLite):
the chord is joined by ``celery.chord_unlock``, which celery-dlq parks while
a member waits (Celery alone would poll it every second).

Run: ``.venv/bin/python bench/chords.py [--quick] [--runs N] [--backend redis|sqlite]``.
"""
from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402
from celery import Celery, chord  # noqa: E402

from bench import results as results_file  # noqa: E402
from bench.common import ROOT, RedisServer, machine, parser, redis_server_version, stop_process, wait_until  # noqa: E402
from celery_dlq.storage.keys import Keys  # noqa: E402

DEAD = 10


def worker(env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.integration.proj", "worker", "-P", "prefork", "-c", "2",
         "-Q", env["DLQ_TEST_QUEUE"], "-n", f"bench-chords-{os.getpid()}@%h", "--without-heartbeat",
         "--without-mingle", "--without-gossip", "-l", "INFO"],
        cwd=ROOT, env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)


def commands_per_minute(client: redis.Redis, seconds: float) -> float:
    """Commands Redis processed per minute over ``seconds`` (this function's two INFO calls taken off)."""
    before = client.info("stats")["total_commands_processed"]
    time.sleep(seconds)
    after = client.info("stats")["total_commands_processed"]
    return (after - before - 1) * 60.0 / seconds


def one_run(url: str, members: int, window: float, backend_kind: str, run: int) -> dict:
    queue, prefix = f"chords{run}", f"benchchords{run}"
    backend = url if backend_kind == "redis" else f"db+sqlite:///{tempfile.mkdtemp()}/results.sqlite"
    env = dict(os.environ, DLQ_TEST_BROKER=url, DLQ_TEST_QUEUE=queue, DLQ_TEST_PREFIX=prefix,
               PYTHONPATH=str(ROOT), DLQ_TEST_CONF=json.dumps({"result_backend": backend}),
               DLQ_TEST_OPS_CONF=json.dumps({"result_backend": backend}))
    client = redis.Redis.from_url(url)
    client.set(f"{prefix}:broken", 1)
    log = Path(tempfile.mkstemp(prefix="bench-chords-", suffix=".log")[1])
    proc = worker(env, log)
    try:
        wait_until(lambda: b"ready." in log.read_bytes() or proc.poll() is not None, timeout=60, poll=0.1)
        time.sleep(2.0)
        idle = commands_per_minute(client, window)
        app = Celery("bench-client", broker=url, backend=backend, set_as_current=False)
        app.conf.task_default_queue = queue
        sig = app.signature
        step = members // DEAD
        header = [sig("proj.fixed_by_flag", args=(i,)) if i % step == step - 1 else sig("proj.noop", args=(i,))
                  for i in range(members)]
        body = chord(header)(sig("proj.tsum"))
        keys = Keys(prefix)
        wait_until(lambda: client.llen(f"DLQ.{queue}") == DEAD and client.llen(f"{prefix}:log") == members + DEAD,
                   timeout=600, poll=0.2)
        letter = _first_letter(client, queue)
        wait_until(lambda: client.hget(keys.chord_member(letter), "group") is not None, timeout=60, poll=0.1)
        group = client.hget(keys.chord_member(letter), "group").decode()
        wait_until(lambda: client.scard(keys.chord_waiting(group)) == DEAD, timeout=60, poll=0.1)
        time.sleep(2.0)
        waiting = commands_per_minute(client, window)
        client.delete(f"{prefix}:broken")
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "celery", "-A", "tests.integration.ops_app", "dlq", "replay",
                               f"DLQ.{queue}", "--all"], cwd=ROOT, env=env, capture_output=True, text=True)
        t1 = time.monotonic()
        assert done.returncode == 0, done.stderr
        wait_until(lambda: client.llen(f"{prefix}:body") >= 1, timeout=120, poll=0.005)
        t2 = time.monotonic()
        time.sleep(1.0)
        runs = [json.loads(r)["values"] for r in client.lrange(f"{prefix}:body", 0, -1)]
        assert len(runs) == 1, f"body ran {len(runs)} times"
        expected = [1 if i % step == step - 1 else i for i in range(members)]
        assert runs[0] == expected, "results out of order or missing"
        assert app.AsyncResult(body.id).get(timeout=30) == sum(expected)
        del body
        gc.collect()          # result handles unsubscribe while the server is still up
        return {"idle": idle, "waiting": waiting, "from_start": t2 - t0, "from_end": t2 - t1,
                "replay": t1 - t0}
    finally:
        stop_process(proc)
        log.unlink(missing_ok=True)


def _first_letter(client: redis.Redis, queue: str) -> str:
    return json.loads(client.lindex(f"DLQ.{queue}", 0))["headers"]["id"]


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--backend", choices=("redis", "sqlite"), default="redis")
    results_file.add_argument(p)
    args = p.parse_args()
    members, window = (100, 5.0) if args.quick else (1000, 30.0)
    runs = 1 if args.quick else args.runs
    server = RedisServer().start()
    try:
        client = redis.Redis.from_url(server.url)
        print(f"{machine()}; redis-server {redis_server_version(client)}; backend {args.backend}")
        print(f"chord of {members} members, {DEAD} dead-lettered, rule wait; {runs} run(s), window {window:.0f} s")
        rows = [one_run(server.url, members, window, args.backend, run) for run in range(runs)]
        for name, label, unit in (("idle", "Redis commands/min, worker idle, no chord", ""),
                                  ("waiting", "Redis commands/min, the chord waiting", ""),
                                  ("replay", "celery dlq replay --all (process included)", " s"),
                                  ("from_start", "replay start -> body starts", " s"),
                                  ("from_end", "replay end -> body starts", " s")):
            values = [row[name] for row in rows]
            spread = f" (min {min(values):.2f}, max {max(values):.2f})" if len(values) > 1 else ""
            print(f"{label:48} median {statistics.median(values):.2f}{unit}{spread}")
        print("body ran exactly once in every run, with every result in header order")
        results_file.write(args.results, "chords", {
            "members": members, "runs": runs, "backend": args.backend,
            **{f"{name}.median": round(statistics.median(row[name] for row in rows), 2)
               for name in ("idle", "waiting", "replay", "from_start", "from_end")}},
            ["celery_dlq/worker/features/chords.py", "celery_dlq/storage/chords.py", "celery_dlq/workflow.py"],
            redis_server_version(client))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
