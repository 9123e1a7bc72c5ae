"""A server the tests start as a real process: a command on a free loopback port, its output in a log file.

Flower, the Prometheus exporter and the web dashboard are each started this
way: :meth:`ServerProcess.start` waits until the port answers HTTP (any
status: an answer is an answer), failing with the log's tail if the process
exits or never answers; :meth:`ServerProcess.stop` sends SIGTERM, then kills.
"""
from __future__ import annotations

import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Sequence

from tests.redis_server import free_port

ROOT = Path(__file__).resolve().parents[1]


def wait_for(predicate: Callable[[], Any], timeout: float = 30, message: str = "condition",
             log: Path | str | None = None, poll: float = 0.2) -> Any:
    """``predicate()``'s first true value; an AssertionError (with the log's tail) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace") if isinstance(log, Path) else (log or "")
            raise AssertionError(f"timed out waiting for {message}" + (f"\n{tail[-4000:]}" if tail else ""))
        time.sleep(poll)


class ServerProcess:
    """``command(port)`` run with ``env`` from the checkout; ``ready`` is the path that answers once it serves."""

    def __init__(self, command: Callable[[int], Sequence[str]], env: dict, log: Path, *, ready: str = "/",
                 what: str = "the server", timeout: float = 30) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.command, self.env, self.log_path, self.ready, self.what, self.timeout = \
            command, env, log, ready, what, timeout
        self.proc: subprocess.Popen | None = None

    def start(self) -> ServerProcess:
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(list(self.command(self.port)), cwd=ROOT, env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT)
        wait_for(self._answers, self.timeout, f"{self.what} to answer", self.log_path, poll=0.1)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> None:
        """Fail the test, with the log's tail, when the process has exited."""
        assert self.proc is not None and self.proc.poll() is None, f"{self.what} exited:\n{self.log()[-4000:]}"

    def _answers(self) -> bool:
        self.alive()
        try:
            urllib.request.urlopen(self.base + self.ready, timeout=2).close()
        except urllib.error.HTTPError:
            return True      # it answered, with an error status (a login required, say)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False
        return True

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after 20 s; the exit status."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode if self.proc is not None else None
