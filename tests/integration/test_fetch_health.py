"""An idle fetch lasts less than kombu's health check of a blocked fetch, so kombu never drops its connection.

kombu >= 5.7 drops a fetch connection whose reply is overdue by ``brpop_timeout + health_check_interval``
(``Channel._brpop_sent_at``, ``MultiChannelPoller.maybe_check_brpop_health``). celery-dlq stamps its own
fetch the same way, so a half-open connection is still dropped, and bounds every idle wait below that
window: with ``health_check_interval = 3`` (a 4 s window) and even ``dlq_fetch_wait = 10``, an idle worker
keeps one fetch connection and a task published afterwards runs. And the stamp is still needed: a fetch on a
half-open connection is dropped by kombu's check, and the worker goes on (without the stamp it waits forever).
"""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from celery_dlq.internals.kombu_redis import FETCH_HEALTH
from tests.integration.conftest import Harness

pytestmark = pytest.mark.integration

#: Redis commands a worker's connection blocks in (an idle fetch; the mover waits in BZPOPMIN too).
BLOCKING = {"bzpopmin", "blmove", "brpop"}
WARM_UP, IDLE = 2.0, 10.0


def fetch_connection_ids(harness: Harness) -> set[str]:
    """Ids of the clients of the test's database blocked now (an idle fetch, the mover's wait)."""
    return {c["id"] for c in harness.redis.client_list()
            if c.get("cmd") in BLOCKING and c.get("db") == str(harness.db)}


def blocking_ids_over(harness: Harness, seconds: float) -> set[str]:
    """Every id :func:`fetch_connection_ids` showed in ``seconds`` of looking."""
    seen: set[str] = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen |= fetch_connection_ids(harness)
        time.sleep(0.1)
    return seen


@pytest.mark.parametrize("conf", [
    {},                                                          # the fetch listener wakes the fetch
    {"dlq_fetch_listener": False, "dlq_fetch_wait": 10.0},       # blocks on one list, for longer than the window
], ids=["listener", "fallback-wait-10s"])
def test_an_idle_fetch_keeps_its_connection_under_a_short_health_check(harness, conf):
    harness.extra_env["DLQ_TEST_CONF"] = json.dumps({**conf, "broker_transport_options": {
        "health_check_interval": 3}})
    worker = harness.worker(concurrency=1)
    harness.wait_until(lambda: fetch_connection_ids(harness), timeout=30, message="an idle fetch blocked")
    before = blocking_ids_over(harness, WARM_UP)   # the fetch's and the mover's (it waits for due entries)
    seen = blocking_ids_over(harness, IDLE)
    log = worker.log()
    assert "got no reply" not in log, log[-3000:]
    shortened = "dlq_fetch_wait 10s is longer than kombu's health check lets a fetch wait" in log
    assert shortened is ("dlq_fetch_wait" in conf and not FETCH_HEALTH.predates()), log[-3000:]   # kombu >= 5.7
    assert seen <= before, f"a blocking connection was re-created: {sorted(before)} then {sorted(seen)}\n{log[-3000:]}"
    task = harness.send("proj.noop", args=(1,))
    harness.wait_until(lambda: harness.deliveries(task.id), timeout=15, message="the task published after idling")
    assert blocking_ids_over(harness, 1.0) <= before, "the same connection fetched the task and waits again"


class FreezingProxy:
    """A TCP proxy to the test's redis-server whose open connections can be frozen: nothing is forwarded any
    more and nothing is closed, as a connection to a server that vanished without a FIN (a half-open one)."""

    def __init__(self, target_port: int) -> None:
        self.target_port, self.sockets = target_port, []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._frozen_pairs: set[int] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        """Every connection open now forwards nothing from here on (new ones work)."""
        self._frozen_pairs |= {id(pair) for pair in self.sockets}

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            pair = (client, server)
            self.sockets.append(pair)
            for source, dest in (pair, pair[::-1]):
                threading.Thread(target=self._pump, args=(pair, source, dest), daemon=True).start()

    def _pump(self, pair: tuple, source: socket.socket, dest: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if id(pair) in self._frozen_pairs:
                    continue   # swallowed: the peer never answers
                dest.sendall(data)
        except OSError:
            pass
        if id(pair) not in self._frozen_pairs:
            for sock in pair:
                sock.close()

    def close(self) -> None:
        self.listener.close()
        for pair in self.sockets:
            for sock in pair:
                sock.close()


def test_a_fetch_on_a_half_open_connection_is_dropped_by_kombus_check_and_the_worker_goes_on(harness, redis_server):
    """Why the fetch is still stamped for kombu's check: without it, a fetch whose connection went half-open
    waits forever (the event loop reads only a readable socket, no timeout applies) and the worker stops
    taking messages."""
    if FETCH_HEALTH.predates():
        pytest.skip("kombu < 5.7 has no health check of a blocked fetch")
    proxy = FreezingProxy(redis_server.port)
    try:
        harness.extra_env.update(DLQ_TEST_BROKER=f"redis://127.0.0.1:{proxy.port}/{harness.db}",
                                 DLQ_TEST_CONF=json.dumps({"broker_transport_options": {"health_check_interval": 3}}))
        worker = harness.worker(concurrency=1)
        harness.wait_until(lambda: fetch_connection_ids(harness), timeout=30, message="an idle fetch blocked")
        time.sleep(1.0)
        proxy.freeze()
        task = harness.send("proj.noop", args=(2,))   # straight to the server: only a fresh fetch sees it
        harness.wait_until(lambda: harness.deliveries(task.id), timeout=45,
                           message="the task sent while the fetch's connection was half-open")
        assert "got no reply" in worker.log()
        assert worker.proc.poll() is None
    finally:
        proxy.close()
