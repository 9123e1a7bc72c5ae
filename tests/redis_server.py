"""A throwaway redis-server on a free port, for tests, benchmarks and the demo.

Shared state on the machine's own Redis (6379) is never touched: every run
starts its own server with persistence off in a temporary directory.
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time

import redis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _bulk_reply(sock: socket.socket) -> bytes:
    """One RESP reply read whole: a bulk string (``$<n>\\r\\n`` then n bytes), or an error line."""
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    if not data.startswith(b"$"):
        return data
    size = int(data[1:data.index(b"\r\n")])
    while len(data) < data.index(b"\r\n") + 2 + size:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


class RedisServer:
    """Start with :meth:`start`, stop with :meth:`stop`; ``url`` names it."""

    def __init__(self, port: int | None = None, *args: str) -> None:
        #: A port the caller chose is kept; a free one picked here is picked again if taken meanwhile.
        self._port_given = port is not None
        self.port = port or free_port()
        #: Extra redis-server arguments (they override the defaults), e.g. "--appendonly", "yes".
        self.args = args
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.mkdtemp(prefix="celery-dlq-redis-")
        self._proc: subprocess.Popen | None = None

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start it and wait until it answers; the server answering must be this one.

        Between :func:`free_port` and the server's bind another process of a
        parallel test run can take the port; a PING would then be answered by
        that process. The answer's ``process_id`` tells; a port picked here is
        then picked again.
        """
        for _ in range(5):
            if self._start(timeout):
                return self
            if self._port_given:
                break
            self.port = free_port()
            self.url = f"redis://127.0.0.1:{self.port}/0"
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def _start(self, timeout: float) -> bool:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not on PATH (scripts/test.sh installs it)")
        self._proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self._dir,
             "--daemonize", "no", "--loglevel", "warning", *self.args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while self._proc.poll() is None and time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    sock.sendall(b"INFO\r\n")          # the default user (no password) may, in every test
                    reply = _bulk_reply(sock)
            except OSError:
                time.sleep(0.05)
                continue
            if f"process_id:{self._proc.pid}".encode() not in reply:
                if reply.startswith(b"$"):
                    break                               # another server holds the port
            elif b"\r\nloading:0" in reply:
                return True                             # ours, and done loading its AOF
            time.sleep(0.05)
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        return False

    def shutdown(self) -> None:
        """SHUTDOWN, as an upgrade would: what persistence is on (AOF) is written; the directory is kept."""
        try:
            redis.Redis(port=self.port).shutdown()
        except redis.ConnectionError:
            pass   # it closes the connection as it goes
        if self._proc is not None:
            self._proc.wait(timeout=30)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)


class RedisClusterServers:
    """A Redis Cluster of ``masters`` nodes (no replicas) on free loopback ports; ``url`` names its first node."""

    def __init__(self, masters: int = 3) -> None:
        # The bus port is given (else it is port + 10000, which can be past 65535 for a free port).
        self.nodes = [RedisServer(None, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                                  "--cluster-node-timeout", "2000", "--cluster-port", str(free_port()))
                      for _ in range(masters)]
        self.url = self.nodes[0].url

    def start(self, timeout: float = 30.0) -> RedisClusterServers:
        for node in self.nodes:
            node.start()
        if len(self.nodes) == 1:   # redis-cli --cluster create wants three masters; one node takes every slot
            redis.Redis(port=self.nodes[0].port).execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        else:
            cli = shutil.which("redis-cli")
            if cli is None:
                raise RuntimeError("redis-cli is not on PATH (scripts/test.sh installs redis-tools)")
            subprocess.run([cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
                            "--cluster-replicas", "0", "--cluster-yes"], check=True, capture_output=True, timeout=60)
        deadline = time.monotonic() + timeout
        while any(redis.Redis(port=n.port).cluster("info").get("cluster_state") != "ok" for n in self.nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster never reached cluster_state:ok")
            time.sleep(0.1)
        return self

    def flush(self) -> None:
        """Empty every node (between benchmark rounds)."""
        for node in self.nodes:
            redis.Redis(port=node.port).flushall()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
