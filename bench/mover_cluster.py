"""Benchmark 4, cluster mode (``bench/mover.py --cluster``): mover throughput over a store on 1 vs 3 masters.

The store is a Redis Cluster (``dlq_redis_cluster``) split into 6 shards
(``dlq_store_shards = 6``), the broker a plain redis-server, as the
deployment the sharded store is for. N parked retries (30,000; 6,000 with
--quick; ``--tasks``), spread over the shards by task id as the engine parks
them (the publish format, since the store is not the broker), all due, are
moved back to their queue by ``--movers`` movers, each in its own process
(as that many workers), in interleaved rounds (3; 1 with --quick), medians
reported. One mover (the default) is what a deployment runs: only the
holder of the mover lease (``dlq_mover_lease``, worker/park/mover.py) moves,
whatever the number of workers; 3 is how the tenth round measured it,
before the lease (three workers' movers sharing the store):

- 1 master: a one-node cluster holding every slot (all 6 shards on it);
- 3 masters: ``redis-cli --cluster create`` over 3 nodes (2 shards each).

A store on more masters spreads the Redis work; whether that shows depends
on the cores left for it: on a 2-core machine the mover processes, the
broker and the masters share two cores, so expect little or no gain.
"""
from __future__ import annotations

import base64
import json
import multiprocessing
import time
from typing import Any

from bench import results as results_file
from bench.common import RedisServer, machine, median, print_table, redis_server_version
from tests.redis_server import RedisClusterServers

QUEUE = "bench4c"
SHARDS = 6
PREFIX = "b4c"


def make_app(broker: str, store: str) -> Any:
    from celery import Celery

    import celery_dlq

    app = Celery("bench4c", broker=broker, set_as_current=False)
    app.conf.update(task_default_queue=QUEUE, dlq_key_prefix=PREFIX, dlq_redis_url=store, dlq_redis_cluster=True,
                    dlq_store_shards=SHARDS, dlq_mover_batch_size=100)
    celery_dlq.install(app)
    return app


def park_all(broker: str, store: str, n: int) -> int:
    """Park n real noop messages as the engine does with a store of its own (publish format), due now."""
    import redis

    from celery_dlq.message import Envelope
    from celery_dlq.worker.runtime import runtime_of

    app = make_app(broker, store)
    runtime = runtime_of(app)
    client = redis.Redis.from_url(broker)
    app.send_task("bench.noop", args=(1,), queue="bench.sample")
    msg = json.loads(client.rpop("bench.sample"))
    due = time.time() - 1
    for i in range(n):
        task_id = f"bench-{i:06d}"
        envelope = Envelope(body=base64.b64decode(msg["body"]), content_type=msg["content-type"],
                            content_encoding=msg["content-encoding"], headers=dict(msg["headers"], id=task_id),
                            properties={"correlation_id": task_id}, exchange="", routing_key=QUEUE, queue=QUEUE)
        assert runtime.redis().shard(task_id).store.park(f"{task_id}:2", envelope.dumps(), QUEUE, due, task="bench.noop")
    size = len(envelope.dumps())
    client.close()
    app.close()
    return size


def _mover(broker: str, store: str, ready: Any, go: Any, spent: Any) -> None:
    from celery_dlq.worker.park.mover import MoverThread
    from celery_dlq.worker.runtime import runtime_of

    app = make_app(broker, store)
    runtime = runtime_of(app)
    mover = MoverThread(app, runtime.config, runtime.redis())
    runtime.redis().sharded.all          # connect and read the layout before the clock starts
    with app.producer_or_acquire():
        pass
    ready.release()
    go.wait()
    cpu = time.process_time()
    while mover.move_due():
        pass
    spent.put(time.process_time() - cpu)
    app.close()


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes ``pids`` have used so far."""
    import psutil

    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)


def run(broker: str, cluster: RedisClusterServers, n: int, redis_pids: list[int],
        movers: int) -> tuple[float, float, float]:
    """Seconds for ``movers`` mover processes to move n due retries, and the CPU seconds they and the Redis
    servers used meanwhile."""
    import redis

    client = redis.Redis.from_url(broker)
    client.flushdb()
    cluster.flush()
    park_all(broker, cluster.url, n)
    ctx = multiprocessing.get_context("spawn")
    ready, go, spent = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    processes = [ctx.Process(target=_mover, args=(broker, cluster.url, ready, go, spent)) for _ in range(movers)]
    for mover in processes:
        mover.start()
    for _ in processes:
        ready.acquire()
    servers = cpu_seconds(redis_pids)
    t0 = time.perf_counter()
    go.set()
    mover_cpu = sum(spent.get(timeout=600) for _ in processes)   # each mover's CPU from "go" to drained
    seconds = time.perf_counter() - t0
    servers = cpu_seconds(redis_pids) - servers
    for mover in processes:
        mover.join()
    assert all(mover.exitcode == 0 for mover in processes)
    assert client.llen(QUEUE) == n, (client.llen(QUEUE), n)
    client.flushdb()
    client.close()
    return seconds, mover_cpu, servers


def main(quick: bool, movers: int = 1, n: int | None = None, results_path: str | None = None) -> None:
    if movers < 1:
        raise SystemExit(f"--movers must be at least 1, got {movers}")
    default, rounds = (6000, 1) if quick else (30000, 3)
    n = n or default
    broker = RedisServer().start()
    clusters = {1: RedisClusterServers(masters=1), 3: RedisClusterServers(masters=3)}
    times: dict[int, list[float]] = {masters: [] for masters in clusters}
    cpu: dict[int, list[tuple[float, float]]] = {masters: [] for masters in clusters}
    try:
        for cluster in clusters.values():
            cluster.start()
        import redis

        server_version = redis_server_version(redis.Redis.from_url(broker.url))
        print(f"machine: {machine()}, redis-server {server_version}")
        lease = "one mover, as the lease lets run" if movers == 1 else "as before the mover lease"
        print(f"{n} parked and due over {SHARDS} shards, {movers} mover process(es) ({lease}), broker a plain "
              f"Redis, {rounds} interleaved round(s)\n")
        for r in range(rounds):
            for masters, cluster in clusters.items():
                pids = [broker._proc.pid, *(node._proc.pid for node in cluster.nodes)]
                seconds, movers_cpu, redis_cpu = run(broker.url, cluster, n, pids, movers)
                times[masters].append(seconds)
                cpu[masters].append((movers_cpu, redis_cpu))
                print(f"  round {r + 1}: {masters} master(s) {seconds:7.2f} s  {n / seconds:9.0f} msg/s  "
                      f"CPU: movers {movers_cpu:.2f} s, redis-servers {redis_cpu:.2f} s", flush=True)
    finally:
        for cluster in clusters.values():
            cluster.stop()
        broker.stop()
    one, three = median(times[1]), median(times[3])
    print()
    rows = []
    for masters, t in ((1, one), (3, three)):
        movers_cpu = median([m for m, _ in cpu[masters]])
        redis_cpu = median([r for _, r in cpu[masters]])
        rows.append([f"cluster, {masters} master{'s' if masters > 1 else ''}", f"{t:.2f}", f"{n / t:.0f}",
                     f"{movers_cpu:.2f}", f"{redis_cpu:.2f}"])
    print_table(["store (median)", "seconds", "msg/s", f"{movers} mover(s)' CPU s", "redis-servers' CPU s"], rows)
    print(f"3 masters vs 1: {one / three:.2f}x the throughput")
    split = {}
    for masters, t in ((1, one), (3, three)):
        movers_cpu, redis_cpu = median([m for m, _ in cpu[masters]]), median([r for _, r in cpu[masters]])
        split.update({f"seconds.masters{masters}": round(t, 2), f"mover_cpu_s.masters{masters}": round(movers_cpu, 2),
                      f"redis_cpu_s.masters{masters}": round(redis_cpu, 2),
                      f"mover_busy_pct.masters{masters}": round(100 * movers_cpu / t)})
    results_file.write(results_path, "mover_cluster", {
        "due": n, "movers": movers, "msg_s.masters1": round(n / one), "msg_s.masters3": round(n / three),
        "masters3_over_masters1": round(one / three, 2), **split},
        ["celery_dlq/worker/park/mover.py", "celery_dlq/worker/park/turns.py", "celery_dlq/storage/"], server_version)
