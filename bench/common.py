"""Shared plumbing of the benchmarks: a throwaway redis-server, real workers, staged messages.

Every benchmark starts its own redis-server on a free port (never the
machine's 6379) and real ``celery worker`` subprocesses (prefork) of
``bench/app.py``. To time only the work and not the worker's start, messages
are published first, the queue is renamed aside, the worker starts, and the
queue is renamed back (Redis wakes a blocked BRPOP on RENAME): that moment is
t0.
"""
from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from tests.redis_server import RedisServer  # noqa: E402

__all__ = ["ROOT", "RedisServer", "BenchWorker", "Stage", "parser", "machine", "pct", "median",
           "wait_until", "print_table", "unsettled"]


def parser(doc: str) -> argparse.ArgumentParser:
    """The benchmark's argument parser; also makes SIGTERM/SIGHUP run the cleanup (finally blocks)."""
    def _exit(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGHUP, _exit)
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller run, under a minute")
    return p


def machine() -> str:
    import celery
    import kombu

    server = redis.__version__
    return (f"{os.cpu_count()} cores, Python {platform.python_version()}, celery {celery.__version__}, "
            f"kombu {kombu.__version__}, redis-py {server}, "
            f"load average {os.getloadavg()[0]:.2f} at start")


def redis_server_version(client: redis.Redis) -> str:
    return client.info("server")["redis_version"]


class BenchWorker:
    """A ``celery -A bench.app worker`` subprocess (prefork)."""

    def __init__(self, broker: str, queue: str, mode: str, prefix: str, concurrency: int = 2,
                 conf: str | None = None, queues: str | None = None, pool: str = "prefork",
                 name: str | None = None, package: str | None = None) -> None:
        """``package``: a directory holding another ``celery_dlq`` package (an earlier commit's) to run."""
        self.log_path = Path(tempfile.mkstemp(prefix=f"bench-{mode}-", suffix=".log")[1])
        path = os.pathsep.join([*([package] if package else []), str(ROOT)])
        env = {**os.environ, "BENCH_BROKER": broker, "BENCH_QUEUE": queue, "BENCH_MODE": mode,
               "BENCH_PREFIX": prefix, "PYTHONPATH": path}
        if conf:
            env["BENCH_CONF"] = conf
        self._log = open(self.log_path, "wb")
        self.pool, self.package = pool, package
        command = [sys.executable, "-m", "celery", "-A", "bench.app", "worker", "-P", pool,
                   "-c", str(concurrency), "-Q", queues or queue, "-n", name or f"bench-{mode}-{os.getpid()}@%h",
                   "--without-heartbeat", "--without-mingle", "--without-gossip", "-l", "WARNING"]
        #: ``BENCH_PYSPY=DIR``: the worker runs under py-spy (main process and pool children, collapsed stacks
        #: in ``DIR/<mode>[-before]-<pool>-<n>.txt``): a profile run, whose timings are not figures.
        self.spied = bool(os.environ.get("BENCH_PYSPY"))
        if self.spied:
            where = Path(os.environ["BENCH_PYSPY"])
            where.mkdir(parents=True, exist_ok=True)
            out = where / f"{mode}{'-before' if package else ''}-{pool}-{time.monotonic_ns()}.txt"
            command = [str(Path(sys.executable).parent / "py-spy"), "record", "--nonblocking", "--subprocesses",
                       "--format", "raw", "--rate", "250", "-o", str(out), "--", *command]
        self.proc = subprocess.Popen(command, cwd=package or ROOT, env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def pid(self) -> int:
        """The worker's main process (under py-spy: py-spy's child)."""
        if not self.spied:
            return self.proc.pid
        import psutil

        deadline = time.monotonic() + 30
        while not (children := psutil.Process(self.proc.pid).children()):
            if time.monotonic() > deadline:
                raise RuntimeError("py-spy started no worker")
            time.sleep(0.05)
        return children[0].pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, client: redis.Redis, timeout: float = 60) -> "BenchWorker":
        """Ready when its pool children exist and it waits on Redis (CLIENT LIST: kombu's BRPOP, or
        celery-dlq's fetch script and its BLMOVE wait)."""
        import psutil

        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited:\n{self.log()[-3000:]}")
            clients = client.client_list()
            if any(c.get("cmd") in ("brpop", "blmove", "bzpopmin", "evalsha") for c in clients) \
                    and (self.pool == "solo" or psutil.Process(self.pid).children()):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker never started consuming:\n{self.log()[-3000:]}")
            time.sleep(0.1)
        time.sleep(1.0)  # let start-up work (imports in children, first polls) finish
        return self

    def rss(self, children: bool = False) -> int:
        import psutil

        proc = psutil.Process(self.pid)
        total = proc.memory_info().rss
        if children:
            total += sum(c.memory_info().rss for c in proc.children(recursive=True))
        return total

    def cpu(self) -> tuple[float, float]:
        """CPU seconds (user + system) used so far by the main process and by its pool children."""
        import psutil

        proc = psutil.Process(self.pid)
        main = sum(proc.cpu_times()[:2])
        children = sum(sum(c.cpu_times()[:2]) for c in proc.children(recursive=True))
        return main, children

    def stop(self) -> None:
        if self.spied:   # the worker under py-spy: stopped first, so py-spy writes its file and exits
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                pass
        stop_process(self.proc)
        self._log.close()
        self.log_path.unlink(missing_ok=True)


class Stage:
    """Messages published to ``queue`` then renamed aside until :meth:`release`."""

    def __init__(self, app: Any, client: redis.Redis, queue: str) -> None:
        self.app, self.client, self.queue = app, client, queue
        self.aside = f"{queue}:staged"

    def publish(self, task_name: str, n: int) -> int:
        """Publish ``n`` messages of ``task_name`` and move them aside; returns the bytes of one."""
        with self.app.producer_or_acquire() as producer:
            for i in range(n):
                self.app.send_task(task_name, args=(i,), queue=self.queue, producer=producer)
        assert self.client.llen(self.queue) == n, "someone consumed the staged queue"
        size = len(self.client.lindex(self.queue, 0))
        self.client.rename(self.queue, self.aside)
        return size

    def release(self) -> float:
        """Put the messages back in the queue at once; returns t0 (time.monotonic)."""
        t0 = time.monotonic()
        self.client.rename(self.aside, self.queue)
        return t0


def stop_process(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """SIGTERM a worker started in its own session; SIGKILL its session after ``timeout``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: only what it started
            proc.wait()


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) one process has used so far."""
    import psutil

    return sum(psutil.Process(pid).cpu_times()[:2])


def publish(app: Any, task_name: str, n: int, queue: str) -> None:
    """Publish ``n`` messages of ``task_name`` to ``queue`` (a worker may be consuming it)."""
    with app.producer_or_acquire() as producer:
        for i in range(n):
            app.send_task(task_name, args=(i,), queue=queue, producer=producer)


def sample_message(app: Any, client: redis.Redis, task_name: str) -> bytes:
    """One message of ``task_name`` as kombu stores it in a Redis list (its bytes)."""
    scratch = "bench.message-sample"
    app.send_task(task_name, args=(12345,), queue=scratch)
    element = client.lindex(scratch, 0)
    client.delete(scratch)
    return element


def unsettled(client: redis.Redis) -> int:
    """Messages fetched and not acknowledged: kombu's ``unacked`` hash and celery-dlq's in-flight hashes."""
    return client.hlen("unacked") + sum(client.hlen(key) for key in client.scan_iter(match="*:inflight:*"))


def wait_until(predicate: Callable[[], bool], timeout: float, poll: float = 0.01,
               what: str = "condition") -> float:
    """Poll until ``predicate()``; returns time.monotonic() when it first held."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)
    return time.monotonic()


def timed_call(fn: Callable[[], Any]) -> tuple[Any, float]:
    """``fn()``'s result and the wall time it took, in milliseconds."""
    started = time.perf_counter()
    result = fn()
    return result, (time.perf_counter() - started) * 1000


def timed_runs(fn: Callable[[], Any], n: int, warmup: int = 2) -> list[float]:
    """Milliseconds of ``n`` calls of ``fn``, after ``warmup`` calls not counted (connections, imports)."""
    for _ in range(warmup):
        fn()
    return [timed_call(fn)[1] for _ in range(n)]


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[k]


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """The median of ``values`` and their range: ``"1.25 (1.10-1.40)"``."""
    return f"{fmt.format(median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def ratio(after: float, before: float) -> str:
    """``after`` over ``before`` as printed beside them (``"1.05x"``), ``"-"`` when ``before`` is zero."""
    return f"{after / before:.2f}x" if before else "-"


def print_table(headers: list[str], rows: list[list[Any]]) -> None:
    cells = [[str(c) for c in row] for row in [headers, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for j, row in enumerate(cells):
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if j == 0:
            print("  ".join("-" * w for w in widths))
