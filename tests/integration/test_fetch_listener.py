"""An idle fetch: woken by the fetch listener, one worker per message, on every list it watches.

Every worker here waits up to ``dlq_fetch_wait = 30`` s per fallback wait, so a message found within 10 s
on a list other than the first was found because the listener woke the fetch, not because a wait ran out.
The Redis commands per message are read from ``INFO commandstats`` of a server of the test's own.
"""
from __future__ import annotations

import json
import time

import pytest
import redis

from tests.integration.conftest import Harness, Worker
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

LONG_WAIT = {"dlq_fetch_wait": 30.0}


def two_queue_worker(harness: Harness, second: str, name: str = "w1", **conf) -> Worker:
    env = harness.env(DLQ_TEST_CONF=json.dumps({**LONG_WAIT, **conf}))
    worker = Worker(env, 1, name, harness.tmp_path / f"{name}.log")
    worker.options = (*Worker.options, "-Q", f"{harness.queue},{second}")   # the last -Q wins
    harness.workers.append(worker)
    return worker


def wait_heard(harness: Harness, workers: list[Worker]) -> None:
    for worker in workers:
        worker.wait_for_log("an idle fetch waits for the fetch listener", timeout=60)
    harness.wait_until(lambda: sum(1 for c in harness.redis.client_list() if c.get("cmd") == "bzpopmin")
                       >= len(workers), timeout=30, message="every worker blocked on its markers")


def test_an_idle_worker_is_woken_for_a_second_queue_and_a_priority_list(harness):
    second = f"{harness.queue}.second"
    worker = two_queue_worker(harness, second).start()
    wait_heard(harness, [worker])
    for options in ({"queue": second}, {"queue": harness.queue, "priority": 9}, {"queue": harness.queue}):
        before = len(harness.deliveries())
        sent = time.time()
        harness.app.send_task("proj.noop", **options)
        harness.wait_until(lambda: len(harness.deliveries()) > before, timeout=10,
                           message=f"the message sent with {options} (a wait of 30 s never ran out)")
        assert harness.deliveries()[-1]["at"] - sent < 5.0
    assert "Unrecoverable error" not in worker.log()


def test_without_the_listener_an_idle_fetch_blocks_on_its_first_list_and_says_so(harness):
    second = f"{harness.queue}.second"
    worker = two_queue_worker(harness, second, dlq_fetch_listener=False).start()
    worker.wait_for_log("blocks on its first list and looks at every list each 30s")
    harness.send("proj.noop")   # the first list: the no-op BLMOVE wakes at once
    harness.wait_until(lambda: len(harness.deliveries()) == 1, timeout=10, message="the first list's message")
    assert not harness.redis.exists(f"{{{harness.prefix}}}:fetch:listening")


def commands(client: redis.Redis) -> dict[str, int]:
    return {name[len("cmdstat_"):]: int(row["calls"]) for name, row in client.info("commandstats").items()}


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {name: after.get(name, 0) - before.get(name, 0) for name in after
            if after.get(name, 0) != before.get(name, 0) and name not in ("info", "client|list", "lrange", "llen")}


class Idle:
    """``n`` idle workers on two queues, on a redis-server of their own (INFO commandstats counts every client
    of a server), each past its first task (its pool's connections)."""

    def __init__(self, tmp_path, unique: str, n: int):
        self.n, self.server = n, RedisServer().start()
        (tmp_path / f"n{n}").mkdir()
        self.harness = Harness(self.server, tmp_path / f"n{n}", unique + f"n{n}")
        self.second = f"{self.harness.queue}.second"
        self.client = redis.Redis.from_url(self.server.url)
        self.workers = [two_queue_worker(self.harness, self.second, name=f"w{i}").start(wait_ready=False)
                        for i in range(n)]

    def settle(self) -> None:
        for worker in self.workers:
            worker.wait_for_log("ready.", timeout=90)
        wait_heard(self.harness, self.workers)
        for i in range(self.n):
            self.harness.app.send_task("proj.noop", args=(-1,), queue=self.second)
            self.harness.wait_until(lambda: len(self.harness.deliveries()) == i + 1, timeout=30,
                                    message="a warm-up task")
            time.sleep(0.2)

    def per_message(self, messages: int = 18) -> dict[str, float]:
        """Redis commands per message for a trickle over the three lists, by command, less the idle rate
        measured just before."""
        harness, client = self.harness, self.client
        time.sleep(1.0)
        warm = len(harness.deliveries())
        idle_before, started = commands(client), time.monotonic()
        time.sleep(3.0)
        idle = delta(idle_before, commands(client))
        idle_seconds = time.monotonic() - started
        before, started = commands(client), time.monotonic()
        lists = ({"queue": self.second}, {"queue": harness.queue, "priority": 9}, {"queue": harness.queue})
        for i in range(messages):
            harness.app.send_task("proj.noop", args=(i,), **lists[i % 3])
            time.sleep(0.2)
        harness.wait_until(lambda: len(harness.deliveries()) == warm + messages, timeout=30,
                           message="every message")
        time.sleep(0.3)
        busy = delta(before, commands(client))
        seconds = time.monotonic() - started
        return {name: (busy.get(name, 0) - idle.get(name, 0) * seconds / idle_seconds) / messages
                for name in set(busy) | set(idle)}

    def close(self) -> None:
        try:
            self.harness.close()
        finally:
            self.server.stop()


@pytest.mark.slow
def test_a_message_wakes_one_idle_worker_however_many_wait(tmp_path, unique):
    """Eight idle workers cost each message what one does: no herd (kombu's BRPOP wakes one; so do we).
    Both groups start and settle side by side, each on its own server; they are measured one after the other."""
    groups = []
    try:
        groups += [Idle(tmp_path, unique, 1), Idle(tmp_path, unique, 8)]
        for group in groups:
            group.settle()
        one, eight = (group.per_message() for group in groups)
    finally:
        for group in groups:
            group.close()
    total_one, total_eight = sum(one.values()), sum(eight.values())
    print(f"\ncommands per message: 1 worker {total_one:.1f}, 8 workers {total_eight:.1f}")
    for name in sorted(set(one) | set(eight), key=lambda k: -eight.get(k, 0)):
        print(f"  {name:24} {one.get(name, 0):6.2f} {eight.get(name, 0):6.2f}")
    assert total_eight <= total_one * 1.25 + 1.0, "the cost of a message does not grow with idle workers"
    for woken in ("bzpopmin", "evalsha", "blmove"):   # a herd shows here first: one per idle worker
        assert eight.get(woken, 0) <= one.get(woken, 0) + 0.5, woken


def test_a_server_that_refuses_client_tracking_leaves_the_fallback_wait(tmp_path, unique):
    """A managed Redis that refuses CLIENT (an ACL here): the listener says so, no listening set is left,
    and idle workers keep the fallback wait, which still takes a message on their first list."""
    server = RedisServer().start()
    admin = redis.Redis.from_url(server.url)
    admin.execute_command("ACL", "SETUSER", "worker", "on", ">pw", "~*", "&*", "+@all", "-client")
    url = server.url.replace("redis://", "redis://worker:pw@")
    harness = Harness(type("Server", (), {"url": url})(), tmp_path, unique)
    try:
        worker = harness.worker(concurrency=1)
        worker.wait_for_log("the fetch listener cannot track the queues", timeout=60)
        worker.wait_for_log("blocks on its first list", timeout=60)
        assert not harness.redis.exists(f"{{{harness.prefix}}}:fetch:listening")
        harness.send("proj.noop")
        harness.wait_until(lambda: len(harness.deliveries()) == 1, timeout=10, message="the fallback's message")
    finally:
        harness.close()
        server.stop()


def test_the_listener_tracks_once_marks_pushes_and_keeps_its_set(tmp_path, unique, monkeypatch):
    """The listener alone, its checks every 0.2 s: it tracks the registered queue once (not at every check),
    marks a push to any of its lists, and writes its set again when it is gone."""
    from celery_dlq.storage.keys import Keys, QueueLists
    from celery_dlq.worker.fetch import listener as fetch_listener
    monkeypatch.setattr(fetch_listener, "CHECK", 0.2)
    server = RedisServer().start()
    client = redis.Redis.from_url(server.url)
    keys, queue = Keys(f"l{unique}"), f"q{unique}"
    client.zadd(keys.fetch_queues, {queue: time.time() * 1000})
    listener = fetch_listener.FetchListener(lambda: redis.Redis.from_url(server.url, protocol=2), keys,
                                            QueueLists())
    listener.start()
    try:
        deadline = time.monotonic() + 10
        while not client.sismember(keys.fetch_listening, queue) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.sismember(keys.fetch_listening, queue)
        client.lpush(f"{queue}\x06\x169", "x")   # a priority sub-list
        deadline = time.monotonic() + 5
        while not client.exists(keys.fetch_marker(queue)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.zrange(keys.fetch_marker(queue), 0, -1) == [b"m"]
        client.delete(keys.fetch_listening)            # as a listener stopping elsewhere might
        deadline = time.monotonic() + 5
        while not client.sismember(keys.fetch_listening, queue) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.sismember(keys.fetch_listening, queue), "written again at the next check"
        time.sleep(1.0)                                # five more checks
        calls = client.info("commandstats").get("cmdstat_client|tracking", {}).get("calls")
        assert calls == 2, "CLIENT TRACKING OFF and ON once: every check found the tracking on"
    finally:
        listener.stop()
        server.stop()
