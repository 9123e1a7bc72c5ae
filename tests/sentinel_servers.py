"""A Redis master, a replica and three sentinels on free loopback ports, for the failover tests."""
from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from tests.redis_server import RedisServer, free_port

MASTER_NAME = "dlqmaster"


class SentinelServers:
    """``start()`` a master, a replica of it and three sentinels (quorum 2); ``kill_master()`` as a crash does."""

    def __init__(self, down_after_ms: int = 1000, failover_timeout_ms: int = 3000) -> None:
        self.down_after_ms, self.failover_timeout_ms = down_after_ms, failover_timeout_ms
        self.master = RedisServer()
        self.replica = RedisServer(None, "--replicaof", "127.0.0.1", str(self.master.port))
        self.sentinel_ports = [free_port() for _ in range(3)]
        self._dir = Path(tempfile.mkdtemp(prefix="celery-dlq-sentinel-"))
        self._sentinels: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        """kombu's form: every sentinel, ``;``-separated (``master_name`` goes in the transport options)."""
        return ";".join(f"sentinel://127.0.0.1:{port}" for port in self.sentinel_ports)

    def start(self, timeout: float = 20.0) -> SentinelServers:
        self.master.start()
        self.replica.start()
        for port in self.sentinel_ports:
            conf = self._dir / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self._dir}\n"
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.master.port} 2\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}\n"
                f"sentinel failover-timeout {MASTER_NAME} {self.failover_timeout_ms}\n"
                f"sentinel parallel-syncs {MASTER_NAME} 1\n")
            self._sentinels.append(subprocess.Popen(
                [shutil.which("redis-server"), str(conf), "--sentinel", "--loglevel", "warning"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + timeout
        while not self._ready():
            if time.monotonic() > deadline:
                raise RuntimeError("the sentinels never saw the master, its replica and each other")
            time.sleep(0.2)
        return self

    def _ready(self) -> bool:
        try:
            link = redis.Redis(port=self.replica.port).info("replication").get("master_link_status")
            for port in self.sentinel_ports:
                info = redis.Redis(port=port).sentinel_master(MASTER_NAME)
                if info.get("num-slaves", 0) < 1 or info.get("num-other-sentinels", 0) < 2:
                    return False
            return link == "up"
        except (redis.ConnectionError, redis.ResponseError):
            return False

    def master_port(self) -> int:
        """The port of the master the sentinels name now."""
        host, port = redis.Redis(port=self.sentinel_ports[0]).sentinel_get_master_addr_by_name(MASTER_NAME)
        return int(port)

    def kill_master(self) -> float:
        """SIGKILL the master (no shutdown, no save); returns when it died (``time.monotonic()``)."""
        self.master._proc.send_signal(signal.SIGKILL)
        self.master._proc.wait()
        return time.monotonic()

    def wait_for_promotion(self, timeout: float = 30.0) -> float:
        """Wait until the sentinels name the replica as master; returns when (``time.monotonic()``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.master_port() == self.replica.port and \
                        redis.Redis(port=self.replica.port).info("replication")["role"] == "master":
                    return time.monotonic()
            except redis.ConnectionError:
                pass
            time.sleep(0.05)
        raise AssertionError("no failover: the replica was never promoted")

    def stop(self) -> None:
        for proc in self._sentinels:
            proc.terminate()
        for proc in self._sentinels:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.replica.stop()
        self.master.stop()
        shutil.rmtree(self._dir, ignore_errors=True)
