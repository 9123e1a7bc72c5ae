"""The version grid's results file, from the nox logs of one run of it.

    CONTRACT_SESSION=contract CONTRACT_LOGS=DIR scripts/contract.sh
    python bench/grid.py DIR [--results PATH]

Reads each job's log that ``scripts/contract.sh`` kept in ``DIR`` (nox's
output: every session's installed versions, pytest's summary line, the
rolling deploy's duplicate count where it prints one, and the session's
seconds) and writes one results file (``bench/results.py``) whose figures
docs/versions.md quotes: sessions, passed, and per session its versions,
outcome, duplicates and seconds. The commit is the checkout's: run it from
the clone the grid ran in, or pass the commit the grid ran at.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import results as results_file  # noqa: E402

SESSION = re.compile(r"^nox > Running session (contract\S*)")
VERSIONS = re.compile(r"^versions: python (\S+) celery (\S+) kombu (\S+) billiard (\S+) redis (\S+)")
SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed|errors?)\b.*?) in [\d.]+s")
DUPLICATED = re.compile(r"rolling deploy without Producer\.batch: (\d+) duplicated deliveries of (\d+)")
SECONDS = re.compile(r"^nox > contract seconds: (\d+)")
OUTCOME = re.compile(r"^nox > Session (contract\S*) (was successful|failed)")


def sessions(log: str) -> list[dict]:
    """Every session of one job's log, in order, with what it printed."""
    found: list[dict] = []
    for line in log.splitlines():
        if m := SESSION.match(line):
            found.append({"session": m.group(1)})
        elif not found:
            continue
        elif m := VERSIONS.match(line):
            found[-1].update(zip(("python", "celery", "kombu", "billiard", "redis_py"), m.groups()))
        elif m := SUMMARY.match(line):
            found[-1]["summary"] = m.group(1)
        elif m := DUPLICATED.search(line):
            found[-1]["duplicated"] = f"{m.group(1)} of {m.group(2)}"
        elif m := SECONDS.match(line):
            found[-1]["seconds"] = int(m.group(1))
        elif m := OUTCOME.match(line):
            found[-1]["passed"] = m.group(2) == "was successful"
    return found


def row_order(run: dict) -> tuple:
    """docs/versions.md's order: Python, Celery, kombu, redis-py, each by version."""
    return tuple(tuple(int(x) for x in str(run.get(k, "0")).split(".") if x.isdigit())
                 for k in ("python", "celery", "kombu", "redis_py"))


def markdown_row(run: dict) -> str:
    """One session as a row of docs/versions.md's results table."""
    python = ".".join(str(run.get("python", "?")).split(".")[:2])
    result = ("pass" if run.get("passed") else "FAIL") + f" ({run.get('summary', '?')})"
    if "duplicated" in run:
        result += f"; rolling deploy: {run['duplicated']} deliveries duplicated"
    return (f"| {python} | {run.get('celery')} | {run.get('kombu')} | {run.get('redis_py')} | {run.get('billiard')} "
            f"| {result} | {run.get('seconds', '?')} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logs", type=Path, help="the CONTRACT_LOGS directory of the grid's run")
    p.add_argument("--commit", default=None, help="the commit the grid ran at (default: this checkout's HEAD)")
    results_file.add_argument(p)
    args = p.parse_args()
    runs = [s for log in sorted(args.logs.glob("*.log")) for s in sessions(log.read_text(errors="replace"))]
    if not runs:
        raise SystemExit(f"no session in {args.logs}/*.log")
    for run in runs:
        print(f"{run['session']}: {'pass' if run.get('passed') else 'FAIL'} ({run.get('summary', '?')})"
              f"{'; duplicated ' + run['duplicated'] if 'duplicated' in run else ''}, {run.get('seconds', '?')} s")
    print("\n| Python | Celery | kombu | redis-py | billiard | result (pytest's summary) | seconds |")
    print("|---|---|---|---|---|---|---|")
    for run in sorted(runs, key=row_order):
        print(markdown_row(run))
    passed = sum(1 for run in runs if run.get("passed"))
    print(f"\n{len(runs)} sessions, {passed} passed")
    figures = {"sessions": len(runs), "passed": passed,
               "seconds.range": f"{min(r.get('seconds', 0) for r in runs)} to {max(r.get('seconds', 0) for r in runs)}",
               "runs": runs}
    path = results_file.write(args.results, "grid", figures, ["celery_dlq/"])
    if args.commit:   # the grid ran in another clone, at this commit
        record = json.loads(path.read_text())
        record["commit"] = subprocess.check_output(["git", "rev-parse", args.commit], text=True).strip()
        path.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
