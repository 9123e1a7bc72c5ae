"""A benchmark run's results file: its figures with the commit, date and machine they belong to.

Every benchmark whose figures README.md or docs/ quote writes one JSON file
per run (``--results PATH``; by default ``bench/results/<name>-<UTC
time>.json``)::

    {"benchmark": "storm", "commit": "<40 hex>", "dirty": false, "date": "2026-12-01T13:05:00Z",
     "machine": {"cores": 2, "cpu_model": "...", "python": "3.11.7", "redis_server": "7.0.15", ...},
     "command": "bench/storm.py --rounds 3",
     "measures": ["celery_dlq/worker/", "celery_dlq/storage/"],
     "figures": {"healthy_p99_ms.breaker": 9.2, ...}}

``measures`` names the repository paths whose change makes the figures
stale; ``tests/unit/test_figures.py`` compares every figure a document cites
(``<!-- fig: FILE NAME -->`` right after it) with the file, and fails when
the last commit that changed a ``measures`` path is not an ancestor of the
file's commit, unless the document says the figure is stale. A figure is a
plain number, or a short text when the document prints a list or a range.
Files transcribed from BENCHMARKS.md's recorded rounds carry an ``origin``
field saying so; a fresh run never writes one.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"

#: What the engine's figures depend on: the worker's code, the store and its Lua, the seams into kombu.
ENGINE = ["celery_dlq/worker/", "celery_dlq/storage/", "celery_dlq/internals/"]

__all__ = ["RESULTS_DIR", "ENGINE", "add_argument", "write", "machine_info"]


def add_argument(p: argparse.ArgumentParser) -> None:
    """``--results PATH``: where this run's results file goes (default: a new file under bench/results/)."""
    p.add_argument("--results", default=None, metavar="PATH",
                   help="write this run's figures here (default bench/results/<benchmark>-<UTC time>.json)")


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _redis_server_version() -> str:
    binary = shutil.which("redis-server")
    if not binary:
        return ""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    for word in out.split():
        if word.startswith("v="):
            return word[2:]
    return out.strip()


def machine_info(redis_server: str | None = None) -> dict[str, Any]:
    """Cores, CPU model, Python, redis-server and the libraries the figures ran on, and the load at writing."""
    import celery
    import kombu
    import redis

    return {"cores": os.cpu_count(), "cpu_model": _cpu_model(), "python": platform.python_version(),
            "redis_server": redis_server or _redis_server_version(), "celery": celery.__version__,
            "kombu": kombu.__version__, "redis_py": redis.__version__,
            "load_average_at_write": round(os.getloadavg()[0], 2)}


def write(path: str | None, benchmark: str, figures: dict[str, Any], measures: list[str],
          redis_server: str | None = None) -> Path:
    """Write the run's results file and print where; ``figures`` as the benchmark printed them (rounded)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = Path(path) if path else RESULTS_DIR / f"{benchmark}-{stamp}.json"
    commit = _git("rev-parse", "HEAD")
    record = {
        "benchmark": benchmark,
        "commit": commit,
        # Uncommitted changes under the measured paths: the figures then belong to no commit.
        "dirty": bool(_git("status", "--porcelain", "--", *measures)),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(redis_server),
        "command": " ".join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]]),
        "measures": list(measures),
        "figures": figures,
    }
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(record, indent=2, sort_keys=False) + "\n")
    print(f"\nresults: {target}")
    return target
