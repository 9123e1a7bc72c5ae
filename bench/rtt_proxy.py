"""A TCP proxy that adds a round-trip delay between clients and Redis, and counts round trips.

``DelayProxy(upstream_port, delay)`` listens on a free loopback port; every
connection to it is forwarded to ``127.0.0.1:upstream_port``. Each direction
holds every chunk for half of ``delay`` (one round trip, client to server and
back, costs ``delay`` more), so a blocked pop woken by another client's push
also sees the delay once, as across a network.

The timing scheme, chosen after an asyncio proxy rounded a 2 ms delay up to
2.4 ms (its selector's timeout is whole milliseconds): per direction one
thread reads and stamps each chunk with its deadline (arrival + delay / 2)
into a queue, and another takes it, ``time.sleep``\\ s to the deadline and
writes it. The sleeping threads run with a timer slack of 1 ns
(``prctl(PR_SET_TIMERSLACK)``; Linux's default 50 us otherwise adds to every
sleep). At delay 0 the reading thread writes the chunk itself. What this
gives is measured, not assumed: :func:`ping_rtt` times PINGs through a
proxy, and :meth:`DelayProxy.cpu_seconds` is the CPU its threads used.

**Round trips** are counted per connection on the client side of the proxy:
a chunk from the client after a chunk from the server (or the connection's
first chunk) starts a round trip; chunks from the client with no answer in
between belong to the same one. So N commands each awaiting its reply count
N, and a pipeline of N commands sent in one write counts 1 (a pipeline large
enough that Redis answers its first part before the rest arrives would count
more: redis-py writes a pipeline in one ``sendall``).
"""
from __future__ import annotations

import ctypes
import os
import queue
import socket
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DelayProxy", "ping_rtt", "RttSample", "calibrate"]

_PR_SET_TIMERSLACK = 29
_EOF = b""


def _fine_timer_slack() -> None:
    """Make this thread's sleeps wake within ~1 ns of their deadline instead of Linux's default 50 us slack."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass   # not Linux: sleeps are as precise as the OS makes them, and ping_rtt shows it


def _ahead_of_clients(native_id: int) -> None:
    """Run this thread at nice -10 where allowed (root): on a machine the workers keep busy, the proxy stands
    for the network and should not queue for a CPU behind them (it uses a few percent of one core)."""
    try:
        os.setpriority(os.PRIO_PROCESS, native_id, -10)   # a thread id: this thread only
    except (OSError, AttributeError):
        pass   # not permitted: the probe's PINGs under load show what that costs


def _sleep_until(deadline: float) -> None:
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        time.sleep(remaining)


@dataclass
class Link:
    """One client connection and its upstream connection; ``round_trips`` counted as the module says."""

    client: socket.socket
    server: socket.socket
    peer: tuple[str, int]
    round_trips: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    _answered: bool = True      # the next chunk from the client starts a round trip
    _open_pipes: int = 2
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def from_client(self, size: int) -> None:
        self.bytes_up += size
        if self._answered:
            self._answered = False
            self.round_trips += 1

    def from_server(self, size: int) -> None:
        self.bytes_down += size
        self._answered = True

    def pipe_done(self) -> bool:
        """One direction ended; True when both have (then the sockets can close)."""
        with self._lock:
            self._open_pipes -= 1
            return self._open_pipes == 0


class DelayProxy:
    """Start with :meth:`start`, stop with :meth:`close`; ``url`` is a redis:// URL through it."""

    def __init__(self, upstream_port: int, delay: float = 0.0, upstream_host: str = "127.0.0.1",
                 db: int = 0, early: float = 0.0) -> None:
        """``delay``: seconds added to each round trip (half each way). ``early``: seconds each direction
        releases a chunk before its deadline, to offset the thread hand-off and wake-up measured by
        :func:`calibrate` (0: none)."""
        self.upstream = (upstream_host, upstream_port)
        self.delay = delay
        self._half = delay / 2
        self._hold = max(0.0, delay / 2 - early)
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(512)
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/{db}"
        self.links: list[Link] = []
        self._closed = threading.Event()
        self._threads: list[threading.Thread] = []
        self._native_ids: set[int] = set()
        self._finished_cpu = 0.0            # CPU seconds of this proxy's threads that have ended
        self._lock = threading.Lock()

    def start(self) -> DelayProxy:
        _fine_timer_slack()                 # threads started from here inherit it; each also sets its own
        self._spawn(self._accept_loop, "rtt-proxy-accept")
        return self

    # -- figures -------------------------------------------------------------------------------------------
    def round_trips(self) -> int:
        """Round trips so far over every connection, open or closed."""
        with self._lock:
            return sum(link.round_trips for link in self.links)

    def cpu_seconds(self) -> float:
        """CPU seconds (user + system) this proxy's threads have used so far (ended ones included)."""
        import psutil

        with self._lock:
            live = set(self._native_ids)
            total = self._finished_cpu
        for thread in psutil.Process().threads():
            if thread.id in live:
                total += thread.user_time + thread.system_time
        return total

    # -- plumbing ------------------------------------------------------------------------------------------
    def _spawn(self, target: Any, name: str, *args: Any) -> None:
        def run() -> None:
            native = threading.get_native_id()
            with self._lock:
                self._native_ids.add(native)
            _fine_timer_slack()
            _ahead_of_clients(native)
            try:
                target(*args)
            finally:
                with self._lock:
                    self._native_ids.discard(native)
                    self._finished_cpu += time.thread_time()

        thread = threading.Thread(target=run, name=name, daemon=True)
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, peer = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = Link(client, server, peer)
            with self._lock:
                self.links.append(link)
            for src, dst, up in ((client, server, True), (server, client, False)):
                side = "up" if up else "down"
                if self._half > 0:
                    chunks: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()
                    self._spawn(self._read, f"rtt-proxy-{side}-read", link, src, dst, up, chunks)
                    self._spawn(self._write, f"rtt-proxy-{side}-write", link, dst, chunks)
                else:
                    self._spawn(self._read, f"rtt-proxy-{side}", link, src, dst, up, None)

    def _read(self, link: Link, src: socket.socket, dst: socket.socket, up: bool,
              chunks: queue.SimpleQueue[tuple[float, bytes]] | None) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = _EOF
            now = time.monotonic()
            if data:
                (link.from_client if up else link.from_server)(len(data))
            if chunks is not None:
                chunks.put((now + self._hold, data))
                if not data:
                    return
                continue
            if not data or not self._send(dst, data):
                self._end(link, dst)
                return

    def _write(self, link: Link, dst: socket.socket, chunks: queue.SimpleQueue[tuple[float, bytes]]) -> None:
        while True:
            deadline, data = chunks.get()
            _sleep_until(deadline)
            if not data or not self._send(dst, data):
                self._end(link, dst)
                return

    @staticmethod
    def _send(dst: socket.socket, data: bytes) -> bool:
        try:
            dst.sendall(data)
            return True
        except OSError:
            return False

    def _end(self, link: Link, dst: socket.socket) -> None:
        """Pass the end of one direction on; close both sockets once both directions ended."""
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        if link.pipe_done():
            link.client.close()
            link.server.close()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            links = list(self.links)
        for link in links:
            for sock in (link.client, link.server):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        for thread in list(self._threads):
            thread.join(timeout=2)
        for link in links:
            link.client.close()
            link.server.close()

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class RttSample:
    """Round trips of PING through a connection, in milliseconds."""

    times_ms: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def p25(self) -> float:
        """The first quartile: what the path costs when the loaded machine lets it, steadier than the median."""
        return sorted(self.times_ms)[len(self.times_ms) // 4]

    @property
    def p99(self) -> float:
        ordered = sorted(self.times_ms)
        return ordered[min(len(ordered) - 1, int(round(0.99 * len(ordered) + 0.5)) - 1)]

    def as_dict(self) -> dict[str, float]:
        return {"p25_ms": round(self.p25, 4), "median_ms": round(self.median, 4), "p99_ms": round(self.p99, 4),
                "pings": len(self.times_ms)}


def ping_rtt(url: str, pings: int = 200, gap: float = 0.002) -> RttSample:
    """Time ``pings`` PINGs on one connection to ``url`` (one warm-up first), ``gap`` seconds apart."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        client.ping()
        times = []
        for _ in range(pings):
            started = time.perf_counter()
            client.ping()
            times.append((time.perf_counter() - started) * 1000)
            time.sleep(gap)
        return RttSample(times)
    finally:
        client.close()


def calibrate(upstream_port: int, delay: float, pings: int = 200) -> float:
    """The ``early`` that makes a proxy at ``delay`` add ``delay`` to a PING's round trip, as measured now.

    The round trip through a proxy at delay 0 is the baseline (Redis, the client
    and one thread hand-off each way); what a proxy at ``delay`` adds beyond
    ``delay`` on top of it (the writing threads' wake-ups) is split over the
    two directions. First quartiles, not medians: on a loaded machine the
    median moves by more than the excess being measured.
    """
    if delay <= 0:
        return 0.0
    with DelayProxy(upstream_port) as base:
        baseline = ping_rtt(base.url, pings).p25
    with DelayProxy(upstream_port, delay) as delayed:
        measured = ping_rtt(delayed.url, pings).p25
    excess_ms = measured - baseline - delay * 1000
    return max(0.0, min(delay / 2, excess_ms / 2000))
