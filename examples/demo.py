"""End-to-end demo: a real prefork worker of the shop app, a mix of tasks, and their timeline.

    python -m examples.demo            # or scripts/demo.sh, which installs everything first

Uses ``REDIS_URL`` when given; otherwise starts a throwaway ``redis-server`` on
a free port (or, when there is no redis-server binary, fakeredis' TCP server
in this process). Starts ``celery -A examples.timeline worker``, sends orders
and payments that succeed, fail twice then succeed, always fail, are declined,
and crash their worker process; waits until each one succeeded or was
dead-lettered; prints every delivery with the wait since the previous one and
every dead letter with its reason; then runs ``celery dlq queues`` and
``celery dlq list``. Stops everything it started, and exits 0 on success.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator

import redis
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
console = Console(highlight=False)
if not console.is_terminal:  # piped or logged: wide enough that rows stay on one line
    console = Console(highlight=False, width=130)

#: (label, task name, args, kwargs, what should happen)
SCENARIO = [
    ("confirm ORD-1001", "shop.orders.confirm", ("ORD-1001",), {}, "succeeds"),
    ("charge ORD-1001", "shop.payments.charge", ("ORD-1001", "4000-0000-0000-0002", 42.0), {}, "succeeds"),
    ("charge ORD-1002", "shop.payments.charge", ("ORD-1002", "4000-0000-flaky", 19.9), {},
     "gateway times out twice, then succeeds"),
    ("ship ORD-1003", "shop.orders.ship", ("ORD-1003", "00000"), {}, "always fails: DLQ after 3 deliveries"),
    ("charge ORD-1004", "shop.payments.charge", ("ORD-1004", "4000-0000-declined", 310.0), {},
     "declined: straight to the DLQ"),
    ("fraud_check ORD-666", "shop.payments.fraud_check", ("ORD-666",), {},
     "kills its worker process: DLQ after 2 deliveries"),
    ("confirm ORD-1005", "shop.orders.confirm", ("ORD-1005",), {}, "succeeds, poison or not"),
]


# -- Redis: the user's, a throwaway redis-server, or fakeredis ----------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ping(url: str, proc: subprocess.Popen | None = None, timeout: float = 10.0) -> None:
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.ping()
            return
        except redis.ConnectionError:
            if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
                raise RuntimeError(f"no Redis answered at {url}")
            time.sleep(0.05)
        finally:
            client.close()


@contextmanager
def redis_for_demo() -> Iterator[tuple[str, str]]:
    """Yields (url, how it was obtained); stops what it started."""
    if os.environ.get("REDIS_URL"):
        url = os.environ["REDIS_URL"]
        _wait_ping(url)
        yield url, "REDIS_URL"
        return
    port = _free_port()
    url = f"redis://127.0.0.1:{port}/0"
    binary = shutil.which("redis-server")
    if binary:
        workdir = tempfile.mkdtemp(prefix="celery-dlq-demo-")
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--dir", workdir, "--loglevel", "warning"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_ping(url, proc)
            yield url, f"throwaway redis-server on port {port}"
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            shutil.rmtree(workdir, ignore_errors=True)
        return
    import fakeredis  # the dev extra installs it, with Lua support

    server = fakeredis.TcpFakeServer(("127.0.0.1", port), server_type="redis")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        _wait_ping(url)
        yield url, f"no redis-server binary: fakeredis TCP server on port {port} (in this process)"
    finally:
        server.shutdown()
        server.server_close()


# -- the worker ----------------------------------------------------------------------------------

class Worker:
    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "examples.timeline", "worker", "-P", "prefork",
             "-c", "2", "-Q", "orders,payments", "-n", f"demo-{os.getpid()}@%h",
             "--without-heartbeat", "--without-mingle", "--without-gossip", "-l", "INFO"],
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while " ready." not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start:\n{self.log()[-3000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # warm shutdown: the pool children go too
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: only what it started
                self.proc.wait()
        self._log.close()


# -- the timeline --------------------------------------------------------------------------------

def wait_for_outcomes(client: redis.Redis, key: str, ids: set[str], timeout: float) -> list[dict]:
    from examples.timeline import read_events

    deadline = time.monotonic() + timeout
    while True:
        events = read_events(client, key)
        done = {e["id"] for e in events if e["event"] in ("success", "dead_letter")}
        if ids <= done or time.monotonic() > deadline:
            return events
        time.sleep(0.1)


def _short(exception: str) -> str:
    """``examples.shop.gateway.GatewayTimeout: ...`` -> ``GatewayTimeout: ...``."""
    kind, _, message = exception.partition(": ")
    return f"{kind.rsplit('.', 1)[-1]}: {message}"


def _describe(event: dict, previous_delivery: dict[str, float]) -> tuple[str, str]:
    kind = event["event"]
    if kind == "delivery":
        last = previous_delivery.get(event["id"])
        previous_delivery[event["id"]] = event["at"]
        since = "first" if last is None else f"{event['at'] - last:.2f}s after the previous one"
        return "[cyan]delivery[/]", f"#{event['delivery']} from {event['queue']} ({since})"
    if kind == "success":
        return "[green]succeeded[/]", event["result"]
    if kind == "redelivery":
        wait = event["due"] - event["at"]
        return "[yellow]failed, parked[/]", (f"{_short(event['exception'])} -> delivery #{event['next_delivery']} "
                                             f"due in {wait:.2f}s")
    n = event["delivery"]
    return "[red]dead-lettered[/]", (f"to {event['dlq']} after {n} deliver{'y' if n == 1 else 'ies'}, "
                                     f"reason [bold]{event['reason']}[/] ({_short(event['exception'])})")


def print_timeline(events: list[dict], labels: dict[str, str], t0: float) -> None:
    table = Table(title="Timeline (time since the first task was sent)", show_lines=False)
    table.add_column("t", justify="right")
    table.add_column("message")
    table.add_column("event")
    table.add_column("detail", overflow="fold")
    previous: dict[str, float] = {}
    for event in events:
        if event["id"] not in labels:
            continue
        what, detail = _describe(event, previous)
        table.add_row(f"{event['at'] - t0:6.2f}s", labels[event["id"]], what, detail)
    console.print(table)


def print_outcomes(events: list[dict], results: dict[str, Any]) -> bool:
    ok = True
    table = Table(title="Outcome per message")
    for col in ("message", "expected", "deliveries", "outcome"):
        table.add_column(col)
    for task_id, (label, expected) in results.items():
        mine = [e for e in events if e["id"] == task_id]
        deliveries = sum(e["event"] == "delivery" for e in mine)
        end = next((e for e in mine if e["event"] in ("success", "dead_letter")), None)
        if end is None:
            ok, outcome = False, "[red]no outcome in time[/]"
        elif end["event"] == "success":
            outcome = "[green]SUCCESS[/]"
        else:
            outcome = f"[red]{end['dlq']}[/] ({end['reason']})"
        table.add_row(label, expected, str(deliveries), outcome)
    console.print(table)
    return ok


# -- the operator's view: celery dlq -------------------------------------------------------------

def dlq_cli_available() -> bool:
    from importlib import metadata, util

    if util.find_spec("celery_dlq.cli") is None:
        return False
    return any(ep.name == "dlq" for ep in metadata.entry_points(group="celery.commands"))


def show_operator_view(env: dict[str, str], client: redis.Redis, dlqs: list[str]) -> None:
    """``celery dlq queues``, then ``celery dlq list`` of each DLQ this run filled."""
    if dlq_cli_available():
        # The CLI draws its own tables: as wide as the terminal, or 160 columns into a pipe.
        env = {**env, "COLUMNS": str(console.width if console.is_terminal else 160)}
        for verb in (["queues"], *(["list", name] for name in dlqs)):
            console.rule(f"$ celery -A examples.shop dlq {' '.join(verb)}")
            out = subprocess.run([sys.executable, "-m", "celery", "-A", "examples.shop", "dlq", *verb],
                                 cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
            sys.stdout.write((out.stdout.rstrip() or "(no output)") + "\n")
            sys.stdout.flush()
            if out.returncode:
                console.print(out.stderr.rstrip(), markup=False, style="red")
        return
    import json

    console.rule("Dead-letter queues (read with redis-py: `celery dlq` is not installed in this checkout)")
    for key in dlqs:
        console.print(f"{key}: {client.llen(key)} message(s)")
        for raw in reversed(client.lrange(key, 0, -1)):
            headers = json.loads(raw)["headers"]
            console.print(f"  {headers['id'][:8]}  {headers['task']:<26} {headers['x-dlq-reason']:<22} "
                          f"deliveries={headers['x-dlq-delivery-count']}  {headers['x-dlq-last-exception']}",
                          markup=False)


# -- main ----------------------------------------------------------------------------------------

def run(timeout: float) -> int:
    from examples.shop import app

    key = f"shop:timeline:{uuid.uuid4().hex[:8]}"
    with ExitStack() as stack:
        url, how = stack.enter_context(redis_for_demo())
        console.print(f"[bold]celery-dlq demo[/] | Redis: {how}")
        env = {**os.environ, "REDIS_URL": url, "SHOP_TIMELINE_KEY": key,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        client = redis.Redis.from_url(url)
        stack.callback(client.close)
        stack.callback(client.delete, key)
        app.conf.broker_url = url
        logdir = Path(tempfile.mkdtemp(prefix="celery-dlq-demo-logs-"))
        worker = Worker(env, logdir / "worker.log")
        stack.callback(worker.stop)
        worker.wait_ready()
        console.print("worker ready: [bold]celery -A examples.timeline worker -P prefork -c 2 "
                      "-Q orders,payments[/]  (log: " + str(worker.log_path) + ")")

        t0 = time.time()
        results: dict[str, tuple[str, str]] = {}
        for label, name, args, kwargs, expected in SCENARIO:
            result = app.send_task(name, args=args, kwargs=kwargs)
            results[result.id] = (label, expected)
        labels = {task_id: label for task_id, (label, _) in results.items()}
        events = wait_for_outcomes(client, key, set(results), timeout)
        print_timeline(events, labels, t0)
        ok = print_outcomes(events, results)
        dlqs = sorted({e["dlq"] for e in events if e["event"] == "dead_letter" and e["id"] in results})
        show_operator_view(env, client, dlqs)
        if not ok:
            console.print(f"[red]Some messages had no outcome within {timeout:.0f}s.[/] Worker log tail:")
            console.print(worker.log()[-3000:], markup=False)
            return 1
        console.print(f"[bold green]Done in {time.time() - t0:.1f}s.[/] Everything this demo started "
                      "is being stopped.")
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=45.0,
                        help="seconds to wait for every message's outcome (default 45)")
    args = parser.parse_args(argv)

    def stop(signum: int, frame: Any) -> None:  # clean up (worker, redis-server) on SIGTERM too
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    return run(args.timeout)


if __name__ == "__main__":
    sys.exit(main())
