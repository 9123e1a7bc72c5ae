"""Benchmark 1: success-path overhead of RedeliveryTask against plain Celery.

N no-op tasks (10,000; 2,000 with --quick) through a real prefork worker
(-c 2), for each of: plain Celery (default, acks early), plain Celery with
acks_late, RedeliveryTask with persist_delivery_count_before_delivery off,
and on. The messages are published before the worker starts and released at
once (see bench/common.py); the time runs from the release until the queue
and kombu's ``unacked`` hash are both empty. Variants are interleaved over
several rounds and the median is reported, since the machine is shared.

Targets: within 3% of plain Celery with persist off, within 10% with it on
(celery-dlq's fetch transport included). The ``dlq_kombufetch`` variant is
the default with kombu's own fetch (``dlq_fetch_transport = False``), so the
cost of the atomic, validating fetch is its difference to ``dlq``.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import results as results_file  # noqa: E402
from bench.common import (  # noqa: E402
    BenchWorker,
    RedisServer,
    Stage,
    machine,
    median,
    parser,
    print_table,
    process_cpu,
    redis_server_version,
    unsettled,
    wait_until,
)

VARIANTS = ("celery", "celery_late", "dlq_nopersist", "dlq_kombufetch", "dlq")
LABELS = {
    "celery": "plain Celery (acks early, default)",
    "celery_late": "plain Celery, acks_late",
    "dlq_nopersist": "RedeliveryTask, persist off",
    "dlq_kombufetch": "RedeliveryTask, persist on, kombu's fetch",
    "dlq": "RedeliveryTask, persist on, celery-dlq's fetch (default)",
}


LEFTOVERS: dict[str, tuple[int, int]] = {}


def one_run(server: RedisServer, mode: str, n: int, run: int) -> tuple[float, float, float, float]:
    """Seconds to drain n no-op tasks through a fresh worker, and CPU us per task (main, children, redis)."""
    import redis
    from celery import Celery

    client = redis.Redis.from_url(server.url)
    client.flushdb()
    queue = f"bench1.{run}"
    app = Celery("client", broker=server.url, set_as_current=False)
    stage = Stage(app, client, queue)
    stage.publish("bench.noop", n)
    worker = BenchWorker(server.url, queue, mode, prefix=f"b1r{run}").wait_ready(client)
    try:
        main0, kids0 = worker.cpu()
        redis0 = process_cpu(server._proc.pid)
        t0 = stage.release()
        drained = lambda: client.llen(queue) == 0 and unsettled(client) == 0 \
            and not client.exists(stage.aside)  # noqa: E731
        t1 = wait_until(drained, timeout=600, what=f"{n} tasks of {mode} to drain")
        main1, kids1 = worker.cpu()
        redis1 = process_cpu(server._proc.pid)
        # What the successful deliveries left behind in Redis (delivery counters and their TTL).
        counters = list(client.scan_iter(match=f"{{b1r{run}}}:count:*", count=1000))
        ttl = client.ttl(counters[0]) if counters else -2
        LEFTOVERS[mode] = (len(counters), ttl)
        us = 1e6 / n
        return t1 - t0, (main1 - main0) * us, (kids1 - kids0) * us, (redis1 - redis0) * us
    finally:
        worker.stop()
        app.close()
        client.close()


def main() -> None:
    p = parser(__doc__)
    results_file.add_argument(p)
    args = p.parse_args()
    n, rounds = (2000, 1) if args.quick else (10000, 3)
    server = RedisServer().start()
    try:
        import redis
        print(f"machine: {machine()}, redis-server {redis_server_version(redis.Redis.from_url(server.url))}")
        print(f"{n} no-op tasks per run, {rounds} round(s), worker -P prefork -c 2, prefetch x4\n")
        times: dict[str, list[float]] = {v: [] for v in VARIANTS}
        cpu: dict[str, list[tuple[float, float, float]]] = {v: [] for v in VARIANTS}
        run = 0
        for r in range(rounds):
            for mode in VARIANTS:
                run += 1
                seconds, main_us, kids_us, redis_us = one_run(server, mode, n, run)
                times[mode].append(seconds)
                cpu[mode].append((main_us, kids_us, redis_us))
                print(f"  round {r + 1}: {mode:<14} {seconds:7.3f} s  {n / seconds:8.0f} tasks/s   CPU per task: "
                      f"worker main {main_us:5.0f} us, pool {kids_us:5.0f} us, redis {redis_us:4.0f} us "
                      f"(load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        server.stop()
    base = median(times["celery"])
    base_late = median(times["celery_late"])
    rows = []
    for mode in VARIANTS:
        t = median(times[mode])
        rows.append([LABELS[mode], f"{t:.3f}", f"{n / t:.0f}", f"{(t / base - 1) * 100:+.1f}%",
                     f"{(t / base_late - 1) * 100:+.1f}%", " ".join(f"{x:.2f}" for x in times[mode])])
    print()
    print_table(["variant", "median s", "tasks/s", "vs Celery", "vs Celery acks_late", "runs (s)"], rows)
    print("\nCPU per task (median over rounds): the figure other load on the machine disturbs least")
    crow = []
    med = {m: tuple(median(c[i] for c in cpu[m]) for i in range(3)) for m in VARIANTS}
    total = {m: sum(med[m]) for m in VARIANTS}
    for mode in VARIANTS:
        main_us, kids_us, redis_us = med[mode]
        crow.append([LABELS[mode], f"{main_us:.0f}", f"{kids_us:.0f}", f"{redis_us:.0f}", f"{total[mode]:.0f}",
                     f"{(total[mode] / total['celery'] - 1) * 100:+.1f}%",
                     f"{(med[mode][0] / med['celery'][0] - 1) * 100:+.1f}%"])
    print_table(["variant", "main us", "pool us", "redis us", "total us", "total vs Celery",
                 "main vs Celery"], crow)
    off = (median(times["dlq_nopersist"]) / base - 1) * 100
    on = (median(times["dlq"]) / base - 1) * 100
    cpu_off = (total["dlq_nopersist"] / total["celery"] - 1) * 100
    cpu_on = (total["dlq"] / total["celery"] - 1) * 100
    print(f"\nCPU per task: persist off {cpu_off:+.1f}% (target <= +3%): {'MET' if cpu_off <= 3 else 'MISSED'}; "
          f"persist on {cpu_on:+.1f}% (target <= +10%): {'MET' if cpu_on <= 10 else 'MISSED'}")
    print("wall time:")
    for mode, (count, ttl) in LEFTOVERS.items():
        if count:
            print(f"\n{mode}: {count} delivery-counter keys left in Redis after {n} successful tasks, "
                  f"TTL {ttl} s ({ttl / 86400:.1f} days)")
    print(f"\npersist off: {off:+.1f}% (target <= +3%): {'MET' if off <= 3 else 'MISSED'}")
    print(f"persist on:  {on:+.1f}% (target <= +10%): {'MET' if on <= 10 else 'MISSED'}")
    fetch_cpu = (total["dlq"] / total["dlq_kombufetch"] - 1) * 100
    fetch_time = (median(times["dlq"]) / median(times["dlq_kombufetch"]) - 1) * 100
    print(f"celery-dlq's fetch against kombu's (both persist on): CPU per task {fetch_cpu:+.1f}%, "
          f"wall time {fetch_time:+.1f}%")
    results_file.write(args.results, "success_overhead", {
        "tasks": n, "rounds": rounds, "cpu_vs_celery_pct.persist_on": round(cpu_on, 1),
        "cpu_vs_celery_pct.persist_off": round(cpu_off, 1), "time_vs_celery_pct.persist_on": round(on, 1),
        "time_vs_celery_pct.persist_off": round(off, 1), "fetch_cpu_vs_kombu_pct": round(fetch_cpu, 1),
        **{f"cpu_us_per_task.{mode}": round(total[mode]) for mode in VARIANTS}},
        results_file.ENGINE)


if __name__ == "__main__":
    main()
