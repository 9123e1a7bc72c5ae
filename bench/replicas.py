"""What ``dlq_store_min_replicas`` (``WAIT 1``) costs a park: a master and a replica on loopback ports.

Parks N entries (a 1 kB payload, with an archive event, as the engine parks
them) through ``ParkedStore.park`` with no WAIT and with ``WAIT 1 1000``
after each park, in interleaved rounds (3; 1 with --quick), and prints the
medians of both sides, per park, and their ratio. The replica runs on the
same 2-core machine, so the round trip WAIT adds is a loopback one: across a
network it is that network's round trip.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from bench import results as results_file  # noqa: E402
from bench.common import median, parser, print_table  # noqa: E402
from celery_dlq.storage.keys import Keys  # noqa: E402
from celery_dlq.storage.replication import Replication  # noqa: E402
from celery_dlq.storage.store import ParkedStore  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402

PAYLOAD = b"x" * 1000


def park_all(store: ParkedStore, n: int, round_no: int, side: str) -> float:
    started = time.perf_counter()
    due = time.time() + 3600
    for i in range(n):
        store.park(f"{side}-{round_no}-{i}", PAYLOAD, "orders", due, event={"type": "parked", "queue": "orders"},
                   events_max_length=10_000, task="shop.charge")
    return (time.perf_counter() - started) / n * 1e6


def main() -> None:
    p = parser(__doc__)
    results_file.add_argument(p)
    args = p.parse_args()
    n, rounds = (1000, 1) if args.quick else (5000, 3)
    master = RedisServer().start()
    replica = RedisServer(None, "--replicaof", "127.0.0.1", str(master.port)).start()
    try:
        client = redis.Redis(port=master.port)
        while redis.Redis(port=replica.port).info("replication").get("master_link_status") != "up":
            time.sleep(0.05)
        keys = Keys("bench")
        plain = ParkedStore(client, keys)
        waiting = ParkedStore(client, keys, replication=Replication(client, 1, 1.0))
        results: dict[str, list[float]] = {"no WAIT": [], "WAIT 1": []}
        for r in range(rounds):
            for side, store in (("no WAIT", plain), ("WAIT 1", waiting)) if r % 2 == 0 else \
                    (("WAIT 1", waiting), ("no WAIT", plain)):
                results[side].append(park_all(store, n, r, side))
            client.flushdb()
        short = waiting.replication.short
        a, b = median(results["no WAIT"]), median(results["WAIT 1"])
        print(f"{n} parks x {rounds} interleaved rounds, master + 1 replica on loopback "
              f"(WAITs short of the replica: {short})")
        print_table(["side", "us per park (median)", "rounds"],
                    [["no WAIT", f"{a:.0f}", " ".join(f"{v:.0f}" for v in results["no WAIT"])],
                     ["WAIT 1 1000", f"{b:.0f}", " ".join(f"{v:.0f}" for v in results["WAIT 1"])]])
        print(f"WAIT costs +{b - a:.0f} us per park ({b / a:.2f}x)")
        results_file.write(args.results, "replicas", {
            "parks": n, "rounds": rounds, "park_us.no_wait": round(a), "park_us.wait": round(b),
            "wait_cost_us": round(b - a)}, ["celery_dlq/storage/"], client.info("server")["redis_version"])
    finally:
        replica.stop()
        master.stop()


if __name__ == "__main__":
    main()
