"""The fetch path with a real redis-server and a real prefork worker: malformed elements never kill it."""
from __future__ import annotations

import base64
import json
import random
import time
from collections import Counter

import pytest

from celery_dlq import headers as H
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.store import ParkedStore
from tests.integration.conftest import Harness
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration

MALFORMED = 240
VALID = 120


def template(harness) -> dict:
    """A real Celery task message as kombu's Redis transport stores it (sent to a staging list, popped)."""
    stage = f"{harness.queue}.stage"
    harness.app.send_task("proj.noop", queue=stage)
    doc = json.loads(harness.redis.rpop(stage))
    doc["properties"]["delivery_info"]["routing_key"] = harness.queue   # as if sent to the queue itself
    return doc


def envelope(base: dict, n: int, **changes) -> dict:
    doc = json.loads(json.dumps(base))
    doc["headers"]["id"] = doc["properties"]["correlation_id"] = f"bad-{n}"
    doc["properties"]["delivery_tag"] = f"tag-bad-{n}"
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = doc
        for name in parents:
            node = node[name]
        if value is KeyError:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return doc


def malformed(rng: random.Random, n: int, base: dict) -> tuple[bytes, str | None]:
    """Element ``n`` of the fuzz run: (bytes to push, task id when the DLQ letter is the message itself)."""
    kind = n % 14
    text = lambda doc: json.dumps(doc).encode()  # noqa: E731
    if kind == 0:
        return b"\x00" + rng.randbytes(rng.randint(0, 64)), None                      # not JSON at all
    if kind == 1:
        return text(rng.choice([[n, "x"], f"string {n}", n * 1.5, None, True])), None   # JSON, not an object
    if kind == 2:
        return text({"n": n, "body": "x", "headers": {"task": "proj.noop"}}), None     # an object, no properties
    if kind == 3:
        return text(envelope(base, n, body=f"!!{n} not base64")), None
    if kind == 4:
        return text(envelope(base, n, headers=f"task=proj.noop;id={n}")), None
    if kind == 5:
        return text(envelope(base, n, headers__id=KeyError)), None                   # no id: wedged Celery
    if kind == 6:
        return text(envelope(base, n, properties__delivery_info=KeyError)), None
    if kind == 7:
        return text(envelope(base, n, properties__priority=f"p{n}")), None
    if kind == 8:
        return text(envelope(base, n, properties__body_encoding="rot13")), None
    if kind == 9:
        return text(envelope(base, n, properties=None)), None
    if kind == 10:
        raw = text(envelope(base, n))
        return raw[: rng.randint(1, len(raw) - 1)], None                              # cut short
    if kind == 11:
        depth = rng.randint(1100, 3000)
        return b"[" * depth + b"]" * depth, None                                      # deeper than any parser
    if kind == 12:   # a valid envelope whose delivery count is forged: the strategy refuses it
        return text(envelope(base, n, headers__x_dlq_delivery_count=10 ** 30)), f"bad-{n}"
    return text(envelope(base, n, headers__x_dlq_delivery_count=rng.choice(["3", 0, -2, 2.5]))), f"bad-{n}"


def test_a_fuzz_run_of_malformed_elements_never_kills_the_worker_and_loses_nothing(fetch_harness):
    harness = fetch_harness
    worker = harness.worker(concurrency=2)
    pid = worker.proc.pid
    rng, base = random.Random(20261123), template(harness)
    pushed: Counter = Counter()      # raw elements the DLQ must hold, byte for byte
    refused: Counter = Counter()     # task ids the strategy must dead-letter as messages
    valid = []
    for n in range(MALFORMED):
        raw, task_id = malformed(rng, n, base)
        raw = raw.replace(b"x_dlq_delivery_count", H.DELIVERY_COUNT.encode())
        harness.redis.lpush(harness.queue, raw)
        if task_id:
            refused[task_id] += 1
        else:
            pushed[raw] += 1
        if n % 2:
            valid.append(harness.send("proj.noop").id)
    assert len(valid) == VALID

    def settled():
        return (harness.redis.llen(harness.queue) == 0 and harness.in_flight() == 0
                and harness.redis.llen(f"DLQ.{harness.queue}") >= MALFORMED
                and len({d["id"] for d in harness.deliveries()}) >= VALID)

    harness.wait_until(settled, timeout=120, message="every element handled")
    assert worker.proc.poll() is None and worker.proc.pid == pid, "the worker never exits"
    log = worker.log()
    assert "Unrecoverable error" not in log and "Connection to broker lost" not in log

    raw_letters, message_letters = Counter(), Counter()
    for letter in harness.dead_letters():
        headers = letter["headers"]
        assert headers[H.REASON] == "invalid_message" and headers[H.ORIGINAL_QUEUE] == harness.queue
        assert headers[H.EXCEPTION_MESSAGE]
        if headers.get(H.RAW):
            raw_letters[base64.b64decode(letter["body"])] += 1
        else:
            message_letters[headers["id"]] += 1
    assert raw_letters == pushed, "every malformed element in its DLQ exactly once, byte for byte"
    assert message_letters == refused
    succeeded = Counter(d["id"] for d in harness.deliveries())
    assert set(succeeded) == set(valid) and set(succeeded.values()) == {1}
    assert harness.redis.llen(harness.queue) + len(harness.dead_letters()) + len(succeeded) == MALFORMED + VALID
    assert harness.redis.keys("*quarantine*") == []
    assert log.count("invalid message") + log.count("is not a valid message") == MALFORMED   # one WARNING each


ROUNDS, TASKS = 6, 500


@pytest.mark.slow
@pytest.mark.timeout(900)   # six rounds of 10 to 30 s on a busy 2-core machine; the suite's default is 300 s
def test_redis_restarts_lose_nothing_and_never_stop_the_worker(tmp_path, unique):
    """AOF with appendfsync always; Redis shut down and started again while retries are parked and the
    worker is busy, six rounds in a row with one worker: every task succeeds every time. The worker holds
    the mover lease and runs the fetch listener, which loses its tracking with each restart and tracks again."""
    server = RedisServer(None, "--appendonly", "yes", "--appendfsync", "always").start()
    harness = Harness(server, tmp_path, unique)
    try:
        worker = harness.worker(concurrency=2)
        pid, duplicates = worker.proc.pid, 0
        for round_ in range(ROUNDS):
            started = time.monotonic()
            ids = [harness.send("proj.flaky", args=(2, f"r{round_}")).id for _ in range(TASKS)]
            store = ParkedStore(harness.redis, Keys(harness.prefix))
            harness.wait_until(lambda: store.count() > 0 and len(harness.deliveries()) > TASKS // 4, timeout=60,
                               message="retries parked and the worker busy")
            parked_at = time.monotonic()
            server.shutdown()
            time.sleep(1)   # down for a second: Celery reconnects after 2 s (its first retry interval)
            server.start()
            restarted_at = time.monotonic()
            harness.wait_until(lambda: succeeded(harness, ids) == TASKS, timeout=180,
                               message=f"round {round_}: all {TASKS} succeeded")
            harness.wait_until(lambda: harness.in_flight() == 0 and store.count() == 0
                               and harness.redis.llen(harness.queue) == 0, timeout=30, message="all settled")
            assert worker.proc.poll() is None and worker.proc.pid == pid, "the worker never exits"
            # A duplicate: the same delivery of a task ran twice (at-least-once allows it; count it).
            runs = Counter((d["id"], d["delivery"]) for d in harness.deliveries() if d["id"] in set(ids))
            duplicates += sum(n - 1 for n in runs.values())
            assert harness.dead_letters() == []
            print(f"round {round_}: {parked_at - started:.1f}s to the restart, {time.monotonic() - restarted_at:.1f}s after it")
        log = worker.log()
        assert "Unrecoverable error" not in log and "gave back" in log
        print(f"\n{ROUNDS} rounds x {TASKS} tasks: {duplicates} duplicate deliveries (at-least-once)")
    finally:
        harness.close()
        server.stop()


def succeeded(harness, ids) -> int:
    done = {d["id"] for d in harness.deliveries() if d["delivery"] >= 3}
    return len(done & set(ids))
