#!/usr/bin/env python3
"""Benchmark: a Sentinel failover in the middle of a run, repeated.

Runs ``tests/integration/test_sentinel.py`` (a master, a replica and three
sentinels on loopback, a real prefork worker, 60 tasks failing twice, the
master SIGKILLed mid-run) ``--runs`` times, each in a pytest process of its
own, and reads the figures the test prints: tasks lost, deliveries
duplicated, seconds from the kill to the promotion and to the first
delivery after it. A run whose test fails is counted as failed and its
figures are kept; the results file says how many passed.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import results as results_file  # noqa: E402
from common import parser  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEST = "tests/integration/test_sentinel.py"
LINE = re.compile(r"sentinel failover: (?P<tasks>\d+) tasks, \d+ deliveries before the kill; lost (?P<lost>\d+), "
                  r"duplicated deliveries (?P<duplicated>\d+), promotion (?P<promotion>[\d.]+) s, first delivery "
                  r"after the kill (?P<first>[\d.]+) s")


def one_run() -> tuple[dict[str, float] | None, bool, float]:
    """(the printed figures or None, whether the test passed, seconds) of one pytest process."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "no:xdist",
                           TEST], cwd=ROOT, capture_output=True, text=True)
    found = LINE.search(done.stdout)
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-2000:], sep="\n", file=sys.stderr)
    figures = None
    if found:
        figures = {k: float(v) for k, v in found.groupdict().items()}
    return figures, done.returncode == 0, time.monotonic() - started


def span(values: list[float], unit: str) -> str:
    low, high = min(values), max(values)
    return f"{low:.2f} {unit}" if low == high else f"{low:.2f} to {high:.2f} {unit}"


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--runs", type=int, default=None, help="failovers (default 5; 1 with --quick)")
    results_file.add_argument(p)
    args = p.parse_args()
    if args.runs is None:
        args.runs = 1 if args.quick else 5
    runs: list[dict[str, float]] = []
    passed = 0
    for n in range(args.runs):
        figures, ok, seconds = one_run()
        passed += ok
        print(f"run {n + 1}: {'passed' if ok else 'FAILED'} in {seconds:.0f} s: {figures}", flush=True)
        if figures:
            runs.append(figures)
    if not runs:
        print("no run printed its figures", file=sys.stderr)
        return 1
    lost = [int(r["lost"]) for r in runs]
    duplicated = [int(r["duplicated"]) for r in runs]
    promotion = [r["promotion"] for r in runs]
    first = [r["first"] for r in runs]
    figures = {"runs": len(runs), "passed": passed,
               "lost": ", ".join(map(str, lost)), "duplicated": ", ".join(map(str, duplicated)),
               "lost_total": sum(lost), "duplicated_total": sum(duplicated),
               "promotion_s": span(promotion, "s"), "first_delivery_s": span(first, "s")}
    print(f"\n{len(runs)} runs ({passed} passed): lost {figures['lost']}; duplicated {figures['duplicated']}; "
          f"promotion {figures['promotion_s']}; first delivery after the kill {figures['first_delivery_s']}")
    results_file.write(args.results, "failover", figures, results_file.ENGINE)
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
