"""Benchmark 4: mover throughput against the raw limit of the same Redis.

N parked messages (100,000; 20,000 with --quick), all due, are moved back to
their queue, in interleaved rounds (3; 1 with --quick), medians reported:

- celery-dlq: the library's own mover (``MoverThread.move_due``, batch
  ``dlq_mover_batch_size`` = 100) in this process, on what the engine parks
  on a Redis broker (the direct format: kombu's own element): one
  ``move_due.lua`` call per batch LPUSHes the elements, deletes their
  bookkeeping, counts them and appends their ``redelivered`` events; with 1
  mover, and with 3 movers (3 threads, each with its own runtime and
  connection, as 3 workers would) sharing the store; for information, with
  the archive off, and with every message sent with Celery's ``expires``
  (its expiry stored beside the entry, looked up and deleted by the move);
- raw: a Lua script written here that moves a batch of the same size from
  the sorted set + hash straight onto the queue list in one call (no
  bookkeeping, no events, no counting): the most this Redis can do per round
  trip.

Target: celery-dlq >= 50% of raw, with 1 and with 3 workers.

``--cluster``: the store on a Redis Cluster, 6 shards, 1 vs 3 masters
(``bench/mover_cluster.py``), moved by ``--movers`` processes (1, as the
mover lease lets one worker move; 3 as before the lease) and ``--tasks``
parked retries.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import results as results_file  # noqa: E402
from bench.common import RedisServer, machine, median, parser, print_table, redis_server_version  # noqa: E402

QUEUE = "bench4"
BATCH = 100

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


def make_app(url: str, prefix: str, **conf):
    from celery import Celery

    import celery_dlq

    app = Celery("bench4", broker=url, set_as_current=False)
    app.conf.update(task_default_queue=QUEUE, dlq_key_prefix=prefix, dlq_mover_batch_size=BATCH, **conf)
    celery_dlq.install(app)
    return app


def sample_payload(app, client) -> bytes:
    """A parked copy as the engine writes it on a Redis broker: a real noop element with redelivery headers."""
    from celery_dlq import headers as H
    from celery_dlq.element import redelivery_element
    from celery_dlq.storage.store import DirectPayload

    app.send_task("bench.noop", args=(1,), queue="bench.sample")
    raw = json.loads(client.rpop("bench.sample"))
    failure = {"type": "ConnectionError", "message": "transient", "traceback": ""}
    headers = H.redelivery_headers(raw["headers"], delivery=2, queue=QUEUE, exchange="", routing_key=QUEUE,
                                   failure=failure, now=time.time())
    element = redelivery_element(raw, headers, tag="t" * 36, source_tag=raw["properties"]["delivery_tag"])
    return DirectPayload(QUEUE, QUEUE, "bench.noop", json.dumps(element).encode()).dumps()


def park_all(dlq, n: int, payload: bytes, expires: bool = False) -> None:
    """Park n entries due one second ago through the library's own park (``ParkedStore.park_many``, pipelined,
    and ``park`` for entries with an expiry: each builds ``park.lua``'s KEYS and ARGV), before the clock starts.

    ``expires``: each entry has an expiry a day away (a message sent with Celery's ``expires``), so the
    move looks it up and deletes it with the entry.
    """
    store = dlq.redis().store
    due = time.time() - 1
    if not expires:
        for start in range(0, n, 2000):
            store.park_many([(f"bench-{i:06d}:2", payload, QUEUE, due) for i in range(start, min(n, start + 2000))])
        return
    for i in range(n):
        store.park(f"bench-{i:06d}:2", payload, QUEUE, due, expires=time.time() + 86400)


def run_library(url: str, n: int, payload: bytes, movers: int, archive: bool = True,
                expires: bool = False) -> float:
    import redis

    from celery_dlq.worker.park.mover import MoverThread
    from celery_dlq.worker.runtime import runtime_of

    conf = {} if archive else {"dlq_events_max_length": 0}
    apps = [make_app(url, "b4lib", **conf) for _ in range(movers)]
    runtimes = [runtime_of(app) for app in apps]
    assert all(runtime.config.direct for runtime in runtimes)
    client = redis.Redis.from_url(url)
    client.flushdb()
    park_all(runtimes[0], n, payload, expires)
    threads = [MoverThread(app, runtime.config, runtime.redis()) for app, runtime in zip(apps, runtimes)]
    for runtime in runtimes:
        runtime.redis().store.count()   # connect before the clock starts

    def drain(mover):
        while mover.move_due():
            pass

    import threading

    workers = [threading.Thread(target=drain, args=(mover,)) for mover in threads]
    t0 = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    seconds = time.perf_counter() - t0
    assert client.llen(QUEUE) == n, (client.llen(QUEUE), n)
    side = runtimes[0].redis()
    assert side.store.count() == 0 and client.hlen(side.keys.expiries) == 0
    assert int(client.hget(side.keys.stats, "redelivered")) == n
    client.flushdb()
    for app in apps:
        app.close()
    client.close()
    return seconds


def run_raw(url: str, n: int, payload: bytes) -> float:
    import redis

    from celery_dlq.storage.store import to_ms
    from celery_dlq.worker.runtime import runtime_of

    app = make_app(url, "b4raw")
    dlq = runtime_of(app)
    client = redis.Redis.from_url(url)
    client.flushdb()
    park_all(dlq, n, payload)
    move = client.register_script(RAW_MOVE)
    keys = [dlq.redis().keys.delayed, dlq.redis().keys.payloads, QUEUE]
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
    p = parser(__doc__)
    p.add_argument("--cluster", action="store_true", help="a store of 6 shards on a Redis Cluster: 1 vs 3 masters")
    p.add_argument("--movers", type=int, default=1, help="--cluster: mover processes (1: the lease's one mover)")
    p.add_argument("--tasks", type=int, default=None, help="--cluster: parked retries (30,000; 6,000 quick)")
    results_file.add_argument(p)
    args = p.parse_args()
    if args.cluster:
        from bench.mover_cluster import main as cluster_main

        return cluster_main(args.quick, movers=args.movers, n=args.tasks, results_path=args.results)
    n, rounds = (20000, 1) if args.quick else (100000, 3)
    server = RedisServer().start()
    times: dict[str, list[float]] = {"raw": [], "lib1": [], "lib3": [], "lib1_noarchive": [], "lib1_expires": []}
    try:
        import redis
        from celery import Celery

        client = redis.Redis.from_url(server.url)
        server_version = redis_server_version(client)
        print(f"machine: {machine()}, redis-server {server_version}")
        payload = sample_payload(Celery("s", broker=server.url, set_as_current=False), client)
        print(f"{n} parked and due, batch {BATCH}, parked payload {len(payload)} B (direct format), "
              f"{rounds} interleaved round(s)\n")
        for r in range(rounds):
            for side in times:
                seconds = run_raw(server.url, n, payload) if side == "raw" else \
                    run_library(server.url, n, payload, movers=int(side[3]), archive=side != "lib1_noarchive",
                                expires=side == "lib1_expires")
                times[side].append(seconds)
                print(f"  round {r + 1}: {side:<14} {seconds:7.2f} s  {n / seconds:9.0f} msg/s", flush=True)
        client.close()
    finally:
        server.stop()
    raw = median(times["raw"])
    rows = [["raw Lua move (benchmark's own)", f"{raw:.2f}", f"{n / raw:.0f}", "100%"]]
    shares = {}
    for side, label in (("lib1", "celery-dlq mover, 1 worker"), ("lib3", "celery-dlq movers, 3 workers"),
                        ("lib1_noarchive", "celery-dlq mover, 1 worker, archive off (information)"),
                        ("lib1_expires", "celery-dlq mover, 1 worker, every message with expires (information)")):
        t = median(times[side])
        shares[side] = raw / t * 100
        rows.append([label, f"{t:.2f}", f"{n / t:.0f}", f"{shares[side]:.0f}%"])
    print()
    print_table(["variant (median)", "seconds", "msg/s", "% of raw"], rows)
    for side, label in (("lib1", "1 worker"), ("lib3", "3 workers")):
        print(f"celery-dlq mover, {label}: {shares[side]:.0f}% of raw (target >= 50%): "
              f"{'MET' if shares[side] >= 50 else 'MISSED'}")
    results_file.write(args.results, "mover", {"due": n, "raw_msg_s": round(n / raw),
                                               **{f"share_of_raw_pct.{side}": round(v) for side, v in shares.items()},
                                               **{f"msg_s.{side}": round(n / median(times[side])) for side in shares}},
                       MEASURES)


#: The mover and the store's move script.
MEASURES = ["celery_dlq/worker/park/mover.py", "celery_dlq/worker/park/turns.py", "celery_dlq/storage/"]


if __name__ == "__main__":
    main()
