"""Benchmark 4: mover throughput against the raw limit of the same Redis.

N parked messages (100,000; 20,000 with --quick), all due, are moved back to
their queue:

- celery-dlq: the library's own mover (``MoverThread.move_due``, batch
  ``dlq_mover_batch_size`` = 100) in this process: claim a batch with a lease
  (one Lua call), publish each message through kombu's producer, then ack
  and count the batch (one Lua call) and archive it (one pipeline);
- raw: a Lua script written here that moves a batch of the same size from
  the sorted set + hash straight onto the queue list in one call (no lease,
  no kombu, no re-encoding): the most this Redis can do per round trip.

The time of each phase of the library's mover is measured too (by wrapping
its calls).

Target: celery-dlq >= 50% of raw.
"""
from __future__ import annotations

import base64
import json
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RedisServer, machine, parser, print_table, redis_server_version  # noqa: E402

QUEUE = "bench4"
BATCH = 100
PARK_CHUNK = 2000

RAW_MOVE = """
-- raw_move.lua (benchmark only): move up to ARGV[2] due entries onto a list, in one call.
-- KEYS[1] = delayed  (ZSET) entry_id -> due (ms)
-- KEYS[2] = payloads (HASH) entry_id -> payload
-- KEYS[3] = the queue (LIST)
-- ARGV[1] = now (ms), ARGV[2] = batch size
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
    redis.call('LPUSH', KEYS[3], redis.call('HGET', KEYS[2], id))
    redis.call('HDEL', KEYS[2], id)
    redis.call('ZREM', KEYS[1], id)
end
return #ids
"""


def make_app(url: str, prefix: str):
    from celery import Celery

    import celery_dlq

    app = Celery("bench4", broker=url, set_as_current=False)
    app.conf.update(task_default_queue=QUEUE, dlq_key_prefix=prefix, dlq_mover_batch_size=BATCH)
    celery_dlq.install(app)
    return app


def sample_payload(app, client) -> bytes:
    """A parked copy as the engine writes it: a real noop message plus redelivery headers."""
    from celery_dlq import headers as H
    from celery_dlq.message import CARRIED_PROPERTIES, Envelope

    app.send_task("bench.noop", args=(1,), queue="bench.sample")
    raw = json.loads(client.rpop("bench.sample"))
    envelope = Envelope(body=base64.b64decode(raw["body"]), content_type=raw["content-type"],
                        content_encoding=raw["content-encoding"], headers=raw["headers"],
                        properties={k: raw["properties"][k] for k in CARRIED_PROPERTIES
                                    if raw["properties"].get(k) is not None},
                        exchange="", routing_key=QUEUE, queue=QUEUE)
    from dataclasses import replace

    from celery_dlq.message import payload_hash
    from celery_dlq.redis.archive import PAYLOAD_HASH
    from celery_dlq.worker.runtime import SOURCE_TAG

    failure = {"type": "ConnectionError", "message": "transient", "traceback": ""}
    copy = envelope.with_headers(H.redelivery_headers(
        envelope.headers, delivery=2, queue=QUEUE, exchange="", routing_key=QUEUE,
        failure=failure, now=time.time()))
    # What DLQ.park adds: the source delivery tag and the payload hash.
    digest = payload_hash(copy.task_name, copy.body, copy.content_type, copy.content_encoding)
    return replace(copy, extra={SOURCE_TAG: raw["properties"]["delivery_tag"], PAYLOAD_HASH: digest}).dumps()


def park_all(dlq, n: int, payload: bytes) -> None:
    """Park n entries due one second ago, in pipelines of the library's own park script."""
    from celery_dlq.redis.store import to_ms

    script = dlq.store._scripts.get("park")
    keys = [*dlq.keys.store_keys(), dlq.keys.stats, dlq.keys.events]
    due = to_ms(time.time() - 1)
    for start in range(0, n, PARK_CHUNK):
        pipe = dlq.client.pipeline(transaction=False)
        for i in range(start, min(n, start + PARK_CHUNK)):
            script(keys=keys, args=[f"bench-{i:06d}:2", payload, QUEUE, due, 0], client=pipe)
        pipe.execute()


@contextmanager
def phase_timer(mover, dlq):
    """Wrap the mover's Redis/kombu calls to split its time into phases."""
    from celery_dlq import message as envelope_module

    spent: dict[str, float] = defaultdict(float)
    store = dlq.store
    originals = {"claim": store.claim_due, "ack": store.ack_many,
                 "publish": envelope_module.Envelope.publish}

    def timed(name, fn):
        def wrapper(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[name] += time.perf_counter() - t
        return wrapper

    store.claim_due = timed("claim (Lua, per batch)", originals["claim"])
    store.ack_many = timed("ack + count (Lua, per batch)", originals["ack"])
    envelope_module.Envelope.publish = timed("kombu publish (per message)", originals["publish"])
    try:
        yield spent
    finally:
        store.claim_due, store.ack_many = originals["claim"], originals["ack"]
        envelope_module.Envelope.publish = originals["publish"]


def run_library(url: str, n: int, payload: bytes) -> tuple[float, dict]:
    import redis

    from celery_dlq.worker.runtime import runtime_of
    from celery_dlq.worker.mover import MoverThread

    prefix = "b4lib"
    app = make_app(url, prefix)
    dlq = runtime_of(app)
    client = redis.Redis.from_url(url)
    client.delete(QUEUE)
    park_all(dlq, n, payload)
    mover = MoverThread(app, dlq)
    with phase_timer(mover, dlq) as spent:
        t0 = time.perf_counter()
        while mover.move_due():
            pass
        seconds = time.perf_counter() - t0
    assert client.llen(QUEUE) == n, (client.llen(QUEUE), n)
    assert dlq.store.count() == 0
    client.delete(QUEUE)
    app.close()
    client.close()
    return seconds, dict(spent)


def run_raw(url: str, n: int, payload: bytes) -> float:
    import redis

    from celery_dlq.worker.runtime import runtime_of
    from celery_dlq.redis.store import to_ms

    app = make_app(url, "b4raw")
    dlq = runtime_of(app)
    client = redis.Redis.from_url(url)
    client.delete(QUEUE)
    park_all(dlq, n, payload)
    move = client.register_script(RAW_MOVE)
    keys = [dlq.keys.delayed, dlq.keys.payloads, QUEUE]
    t0 = time.perf_counter()
    while move(keys=keys, args=[to_ms(time.time()), BATCH]) == BATCH:
        pass
    seconds = time.perf_counter() - t0
    assert client.llen(QUEUE) == n
    client.flushdb()
    app.close()
    client.close()
    return seconds


def main() -> None:
    args = parser(__doc__).parse_args()
    n = 20000 if args.quick else 100000
    server = RedisServer().start()
    try:
        import redis
        from celery import Celery

        client = redis.Redis.from_url(server.url)
        print(f"machine: {machine()}, redis-server {redis_server_version(client)}")
        payload = sample_payload(Celery("s", broker=server.url, set_as_current=False), client)
        print(f"{n} parked and due, batch {BATCH}, parked payload {len(payload)} B\n")
        raw = run_raw(server.url, n, payload)
        print(f"  raw Lua move          {raw:7.2f} s  {n / raw:9.0f} msg/s", flush=True)
        lib, spent = run_library(server.url, n, payload)
        print(f"  celery-dlq mover      {lib:7.2f} s  {n / lib:9.0f} msg/s", flush=True)
        client.close()
    finally:
        server.stop()
    print("\nwhere the library's mover spends its time:")
    accounted = 0.0
    for name, seconds in spent.items():
        accounted += seconds
        print(f"  {name:<30} {seconds:6.2f} s  {seconds / lib * 100:5.1f}%  ({seconds / n * 1e6:6.1f} us/msg)")
    rest = lib - accounted
    print(f"  {'the rest (decode, events, stats)':<30} {rest:6.2f} s  {rest / lib * 100:5.1f}%  "
          f"({rest / n * 1e6:6.1f} us/msg)")
    print()
    print_table(["variant", "seconds", "msg/s", "% of raw"], [
        ["raw Lua move (benchmark's own)", f"{raw:.2f}", f"{n / raw:.0f}", "100%"],
        ["celery-dlq mover", f"{lib:.2f}", f"{n / lib:.0f}", f"{raw / lib * 100:.0f}%"],
    ])
    share = raw / lib * 100
    print(f"\ncelery-dlq mover at {share:.0f}% of raw (target >= 50%): {'MET' if share >= 50 else 'MISSED'}")


if __name__ == "__main__":
    main()
