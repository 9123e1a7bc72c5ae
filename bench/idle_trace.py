"""What one idle worker sends Redis, command by command: this checkout against an earlier one, in one run.

    python bench/idle_trace.py [--seconds 120] [--before DIR] [--rounds 2] [--results PATH]

Starts a redis-server, then a solo ``celery -A bench.app worker`` on an empty
queue (celery-dlq's side, ``BENCH_MODE=dlq``: it holds the leader's lease, so
it renews it and runs every leader duty), waits out its start-up (40 s: the
first 30 s of short waits included), and records ``MONITOR`` for
``--seconds``. Each command is counted as the client sent it (a round trip)
or as a script ran it (``[0 lua]``: no round trip of its own, but counted by
``INFO commandstats``). ``--before DIR`` runs the same with ``DIR``'s
``celery_dlq`` package (``git archive <commit> celery_dlq | tar -x -C DIR``),
the sides alternating over ``--rounds``. Prints commands and round trips per
second per side and the per-command counts of the last round; the figures are
medians of the rounds.
"""
from __future__ import annotations

import collections
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import results as results_file  # noqa: E402
from bench.common import BenchWorker, RedisServer, machine, median, parser  # noqa: E402

SETTLE_S = 40.0


def trace(package: str | None, seconds: float) -> collections.Counter:
    """Counts of ``("client" | "lua", command)`` one idle worker caused in ``seconds``."""
    server = RedisServer().start()
    try:
        worker = BenchWorker(server.url, "idle", "dlq", "idle", concurrency=1, pool="solo", package=package)
        try:
            time.sleep(SETTLE_S)
            with tempfile.TemporaryFile("w+") as out:
                monitor = subprocess.Popen(["redis-cli", "-p", str(server.port), "monitor"], stdout=out)
                time.sleep(seconds)
                monitor.terminate()
                monitor.wait()
                out.seek(0)
                return count(out)
        finally:
            worker.stop()
    finally:
        server.stop()


def count(lines) -> collections.Counter:
    """MONITOR's lines (``<time> [<db> <client>] "CMD" "arg" ...``) counted by origin and command."""
    counts: collections.Counter = collections.Counter()
    for line in lines:
        parts = line.split('"')
        if len(parts) < 2 or "[" not in parts[0]:
            continue
        origin = "lua" if " lua]" in parts[0] else "client"
        name = parts[1].upper()
        if name in ("EVALSHA", "EVAL") and len(parts) > 3:
            name += " " + parts[3][:8]
        counts[(origin, name)] += 1
    return counts


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--before", default=None, help="a directory holding an earlier celery_dlq package")
    p.add_argument("--rounds", type=int, default=2)
    results_file.add_argument(p)
    args = p.parse_args()
    print(machine())
    sides = {"dlq": None, **({"dlq_before": args.before} if args.before else {})}
    rates: dict[str, dict[str, list[float]]] = {s: {"commands": [], "round_trips": []} for s in sides}
    last: dict[str, collections.Counter] = {}
    for r in range(args.rounds):
        for side, package in sides.items():
            counts = last[side] = trace(package, args.seconds)
            total, trips = sum(counts.values()), sum(n for (o, _), n in counts.items() if o == "client")
            rates[side]["commands"].append(total / args.seconds)
            rates[side]["round_trips"].append(trips / args.seconds)
            print(f"  round {r + 1}: {side:10s} {total / args.seconds:5.2f} commands/s, "
                  f"{trips / args.seconds:5.2f} round trips/s")
    figures: dict[str, float] = {"seconds": args.seconds, "rounds": args.rounds}
    for side in sides:
        figures[f"commands_s.{side}"] = round(median(rates[side]["commands"]), 2)
        figures[f"round_trips_s.{side}"] = round(median(rates[side]["round_trips"]), 2)
        print(f"\n{side}: {figures[f'commands_s.{side}']} commands/s, {figures[f'round_trips_s.{side}']} "
              "round trips/s (medians); the last round by command:")
        for (origin, name), n in sorted(last[side].items(), key=lambda kv: -kv[1]):
            print(f"  {n:5d}  {origin:6s} {name}")
            figures[f"last_round.{side}.{origin}.{name}"] = n
    results_file.write(args.results, "idle_trace", figures, results_file.ENGINE)


if __name__ == "__main__":
    main()
