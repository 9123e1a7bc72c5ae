"""One park, alone: ``ParkedStore.park`` called in a loop, this checkout against an earlier one, in one run.

    python bench/park_call.py [--parks 5000] [--rounds 3] --before DIR [--results PATH]

The failure path's main thread waits for ``park.lua`` once per failed
attempt. This times that call with nothing else in the process (no worker,
no other threads): a fresh redis-server, a 900-byte payload, an event
appended, ``--parks`` calls per side, the sides alternating in separate
processes over ``--rounds`` (``DIR`` holds an earlier ``celery_dlq``
package: ``git archive <commit> celery_dlq | tar -x -C DIR``). Prints wall
and CPU time per call, medians of the rounds. What a park costs inside a
worker beyond this is the worker's own (its other threads, the pool).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import results as results_file  # noqa: E402
from bench.common import RedisServer, machine, median, parser  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

#: Run in a child process with the side's package first on sys.path: prints wall and CPU us per park.
CHILD = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
import redis
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.store import ParkedStore
store = ParkedStore(redis.Redis(port=int(sys.argv[2])), Keys(f"park{os.getpid()}"))
n, payload = int(sys.argv[3]), b"x" * 900
wall, cpu = time.perf_counter(), time.process_time()
for i in range(n):
    store.park(f"e{i}", payload, "q", time.time() + 3600, event={"type": "parked", "task_id": f"t{i}"},
               events_max_length=1000)
print(json.dumps({"wall_us": (time.perf_counter() - wall) / n * 1e6, "cpu_us": (time.process_time() - cpu) / n * 1e6}))
"""


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--parks", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--before", required=True, help="a directory holding an earlier celery_dlq package")
    results_file.add_argument(p)
    args = p.parse_args()
    print(machine())
    sides = {"dlq": str(ROOT), "dlq_before": args.before}
    times: dict[str, dict[str, list[float]]] = {s: {"wall_us": [], "cpu_us": []} for s in sides}
    server = RedisServer().start()
    try:
        for r in range(args.rounds):
            for side, tree in sides.items():
                out = subprocess.run([sys.executable, "-c", CHILD, tree, str(server.port), str(args.parks)],
                                     capture_output=True, text=True, check=True)
                got = json.loads(out.stdout)
                for k in ("wall_us", "cpu_us"):
                    times[side][k].append(got[k])
                print(f"  round {r + 1}: {side:10s} {got['wall_us']:6.1f} us wall, {got['cpu_us']:6.1f} us CPU")
    finally:
        server.stop()
    figures: dict[str, float] = {"parks": args.parks, "rounds": args.rounds}
    for side in sides:
        for k in ("wall_us", "cpu_us"):
            figures[f"{k}.{side}"] = round(median(times[side][k]), 1)
    print(f"\nmedians: {figures}")
    results_file.write(args.results, "park_call", figures, results_file.ENGINE)


if __name__ == "__main__":
    main()
