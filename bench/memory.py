"""Benchmark 3: memory of N retries waiting one hour (20,000; 2,000 with --quick).

Each task fails on its first delivery and asks to come back in an hour.
Celery's side calls ``self.retry(countdown=3600)``: the worker holds every
retry in its own memory (and kombu keeps a copy in Redis' ``unacked`` hash).
celery-dlq's side raises with ``redelivery_delay=3600``: the original message
is parked in Redis and the worker holds nothing.

Reported per side: the worker main process' RSS growth (after a warm-up of
200 such tasks, so imports, connections and caches already exist), and
Redis' ``used_memory`` growth per waiting retry, measured from before the
messages were published to when all of them wait (so the queue is empty
again), next to the size of one message as kombu stores it. For celery-dlq,
``MEMORY USAGE`` of each key the store uses splits the bytes up.

Targets: celery-dlq worker growth < 1 MB; Redis bytes per parked retry <=
message size + 200 B.

Then the floor, in the same Redis: the same number of distinct elements,
once as the message was first sent and once as it is parked (with the next
delivery's headers), alone in an empty database as a plain list, as
sorted-set members and as hash fields beside sorted-set members (this
store's layout). What no layout of these elements can go below.
"""
from __future__ import annotations

import gc  # noqa: F401  (documentation: the worker is not forced to collect)
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import results as results_file  # noqa: E402
from bench.common import (  # noqa: E402
    BenchWorker,
    RedisServer,
    machine,
    parser,
    print_table,
    publish,
    redis_server_version,
    sample_message,
    wait_until,
)
from celery_dlq.storage.store import DirectPayload  # noqa: E402

MB = 1024 * 1024
WARMUP = 200


def used_memory(client) -> int:
    return int(client.info("memory")["used_memory"])


def waiting(client, mode: str, prefix: str) -> int:
    """How many retries wait: held by the worker (Celery) or parked (celery-dlq)."""
    if mode == "celery":
        return client.hlen("unacked") if client.llen(QUEUE) == 0 else 0
    return client.zcard(f"{{{prefix}}}:delayed") if client.llen(QUEUE) == 0 else 0


QUEUE = "bench3"


def one_run(server: RedisServer, mode: str, n: int, original: dict) -> dict:
    import redis
    from celery import Celery

    client = redis.Redis.from_url(server.url)
    client.flushdb()
    prefix = f"b3{mode}"
    app = Celery("client", broker=server.url, set_as_current=False)
    worker = BenchWorker(server.url, QUEUE, mode, prefix=prefix).wait_ready(client)
    try:
        # warm-up: the same kind of task, so every code path has run once
        publish(app, "bench.park_long", WARMUP, QUEUE)
        wait_until(lambda: waiting(client, mode, prefix) >= WARMUP, 120, 0.05, "warm-up")
        time.sleep(2)
        rss0, redis0 = worker.rss(), used_memory(client)
        # redis0 is taken before the messages exist, so the growth is all they cost while waiting
        original["message"] = sample_message(app, client, "bench.park_long")
        size = len(original["message"])
        t0 = time.monotonic()
        publish(app, "bench.park_long", n, QUEUE)
        wait_until(lambda: waiting(client, mode, prefix) >= WARMUP + n, 900, 0.1, f"{n} waiting retries")
        seconds = time.monotonic() - t0
        time.sleep(3)  # let the worker settle (no forced gc: that is what an operator sees)
        rss1, redis1 = worker.rss(), used_memory(client)
        keys = {}
        if mode != "celery":
            base = f"{{{prefix}}}"
            for key in sorted(k.decode() for k in client.scan_iter(match=f"{base}:*", count=1000)
                              if b":count:" not in k):
                keys[key.removeprefix(base + ":")] = client.memory_usage(key, samples=0) or 0
            counters = list(client.scan_iter(match=f"{base}:count:*", count=1000))
            sample = counters[:200]
            per = sum(client.memory_usage(k, samples=0) or 0 for k in sample) / max(1, len(sample))
            keys[f"count:* ({len(counters)} keys)"] = int(per * len(counters))
            payload = client.hget(f"{base}:payloads", client.zrange(f"{base}:delayed", -1, -1)[0])
            keys["(one parked payload, bytes)"] = len(payload)
            direct = DirectPayload.loads(payload)
            original["parked"] = payload if direct is None else direct.element
        else:
            keys["unacked"] = client.memory_usage("unacked", samples=0) or 0
            keys["unacked_index"] = client.memory_usage("unacked_index", samples=0) or 0
        dbsize = client.dbsize()
        return {"dbsize": dbsize, "rss_growth": rss1 - rss0, "rss_after": rss1, "redis_per": (redis1 - redis0) / n,
                "size": size, "keys": keys, "seconds": seconds}
    finally:
        worker.stop()
        app.close()
        client.close()


#: The elements of the floor: the message as first sent, the least a next delivery's element can add to it
#: (only the three headers issue 11 names), and the element as parked.
ELEMENTS = ("message", "minimal", "parked")


def minimal_element(message: bytes, parked: bytes) -> bytes:
    """``message`` with only the delivery count, first failure and last exception headers of ``parked`` added."""
    from kombu.utils import json

    from celery_dlq import headers as H

    doc, next_headers = json.loads(message), json.loads(parked)["headers"]
    doc["headers"].update({name: next_headers[name] for name in (H.DELIVERY_COUNT, H.FIRST_FAILURE_AT,
                                                                  H.LAST_EXCEPTION)})
    return json.dumps(doc).encode()


#: Where the allocator puts n elements of one size, with no bookkeeping beside them (FLOOR_LAYOUTS).
FLOOR_LAYOUTS = ("list", "zset member", "hash field + zset member")


def floor(client, element: bytes, n: int) -> dict[str, float]:
    """Redis bytes per element for ``n`` distinct elements as long as ``element``, per layout.

    The floor under any store: an element in a plain list (kombu's queue),
    as the member of a sorted set scored by due time (Sidekiq's schedule),
    and as a hash field beside a sorted-set member (the layout of this
    store). Measured as ``used_memory`` growth on an empty database, so the
    allocator's size classes count as they do for the store.
    """
    stamp = len(element) - 10   # 8 bytes near the end become a counter: distinct elements, same length

    def variant(i: int) -> bytes:
        return element[:stamp] + b"%08d" % i + element[stamp + 8:]

    def fill(layout: str) -> None:
        for start in range(0, n, 1000):
            pipe = client.pipeline(transaction=False)
            for i in range(start, min(n, start + 1000)):
                if layout == "list":
                    pipe.lpush("floor", variant(i))
                elif layout == "zset member":
                    pipe.zadd("floor", {variant(i): i})
                else:
                    pipe.hset("floor:h", "%036d" % i, variant(i))
                    pipe.zadd("floor:z", {"%036d" % i: i})
            pipe.execute()

    per = {}
    for layout in FLOOR_LAYOUTS:
        client.flushdb()
        before = used_memory(client)
        fill(layout)
        per[layout] = (used_memory(client) - before) / n
    client.flushdb()
    return per


def main() -> None:
    p = parser(__doc__)
    results_file.add_argument(p)
    args = p.parse_args()
    n = 2000 if args.quick else 20000
    server = RedisServer().start()
    try:
        import redis
        print(f"machine: {machine()}, redis-server {redis_server_version(redis.Redis.from_url(server.url))}")
        print(f"{n} retries waiting 1 hour, worker -P prefork -c 2 (after a warm-up of {WARMUP})\n")
        results = {}
        original: dict[str, bytes] = {}
        for mode in ("celery", "dlq"):
            results[mode] = r = one_run(server, mode, n, original)
            print(f"  {mode:<7} worker RSS +{r['rss_growth'] / MB:8.2f} MiB (now {r['rss_after'] / MB:.1f} MiB), "
                  f"redis +{r['redis_per']:7.0f} B per waiting retry, message {r['size']} B, "
                  f"{r['seconds']:.1f} s to get all {n} waiting", flush=True)
            for key, size in r["keys"].items():
                if key.startswith("(one"):
                    print(f"           {key:<32} {size:>12,} B")
                else:
                    print(f"           {key:<32} {size:>12,} B  ({size / n:8.1f} B per retry)")
            print(f"           {'(keys in the database)':<32} {r['dbsize']:>12,}")
        original["minimal"] = minimal_element(original["message"], original["parked"])
        client = redis.Redis.from_url(server.url)
        floors = {what: floor(client, original[what], n) for what in ELEMENTS}
        client.close()
    finally:
        server.stop()
    c, d = results["celery"], results["dlq"]
    print()
    print_table(["", "worker RSS growth", "per retry", "Redis B per retry", "message B"], [
        ["Celery retry(countdown=3600)", f"{c['rss_growth'] / MB:.2f} MiB", f"{c['rss_growth'] / n:.0f} B",
         f"{c['redis_per']:.0f}", c["size"]],
        ["celery-dlq (parked in Redis)", f"{d['rss_growth'] / MB:.2f} MiB", f"{d['rss_growth'] / n:.0f} B",
         f"{d['redis_per']:.0f}", d["size"]],
    ])
    grow_ok = d["rss_growth"] < MB
    store_keys = ("delayed", "leases", "payloads", "queues", "parked")
    store_per = sum(size for key, size in d["keys"].items() if key in store_keys) / n
    parked = d["keys"].get("(one parked payload, bytes)", 0)
    print(f"\ncelery-dlq store per parked retry (delayed + payloads + queues + parked; the archive apart): "
          f"{store_per:.0f} B = parked payload {parked} B + {store_per - parked:.0f} B of bookkeeping; "
          f"against the original message ({d['size']} B): +{store_per - d['size']:.0f} B "
          f"(target <= +200): {'MET' if store_per - d['size'] <= 200 else 'MISSED'}")
    overhead = d["redis_per"] - d["size"]
    print(f"\ncelery-dlq worker growth {d['rss_growth'] / MB:.2f} MiB (target < 1 MB): "
          f"{'MET' if grow_ok else 'MISSED'}")
    print(f"celery-dlq Redis bytes per parked retry {d['redis_per']:.0f} = message {d['size']} + {overhead:.0f} "
          f"(target <= message + 200): {'MET' if overhead <= 200 else 'MISSED'}")
    size = d["size"]
    print(f"\nThe floor: {n} distinct elements alone in an empty Redis, nothing else stored "
          f"(used_memory growth per element; message {size} B, target {size + 200} B):")
    print_table(["element", "bytes"] + list(FLOOR_LAYOUTS), [
        [what, len(original[what])] + [f"{per:.0f} (+{per - size:.0f})" for per in floors[what].values()]
        for what in ELEMENTS])
    for what, said in (("parked", "the parked element"),
                       ("minimal", "the message with only delivery count, first failure and last exception")):
        tightest = min(floors[what].values())
        print(f"{said}, in the tightest layout with no bookkeeping: {tightest:.0f} B = message + "
              f"{tightest - size:.0f}: the target {'is' if tightest - size <= 200 else 'is NOT'} reachable with it")
    print(f"worker growth ratio Celery / celery-dlq: "
          f"{c['rss_growth'] / max(d['rss_growth'], 1):.0f}x")
    results_file.write(args.results, "memory", {
        "retries": n, "rss_growth_mib.celery": round(c["rss_growth"] / MB, 2),
        "rss_growth_mib.dlq": round(d["rss_growth"] / MB, 2), "redis_bytes_per_retry.celery": round(c["redis_per"]),
        "redis_bytes_per_retry.dlq": round(d["redis_per"]), "store_bytes_per_retry": round(store_per)},
        results_file.ENGINE)


if __name__ == "__main__":
    main()
