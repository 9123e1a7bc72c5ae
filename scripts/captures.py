#!/usr/bin/env python3
"""Regenerate the console captures the docs include (docs/captures/*.txt), or check they are current.

    python scripts/captures.py           # rewrite docs/captures/
    python scripts/captures.py --check   # exit 1, with a diff, when a capture would change

Starts a redis-server of its own on a free port, runs the demo against it
(``examples/demo.py``: a real prefork worker of the example shop, orders and
payments that succeed, fail, are declined and kill their worker), then runs
the operator commands on what it left and saves their output, 180 columns
wide. Task ids and times differ from run to run, so they are replaced by
placeholders of the same width (tables stay aligned); everything else is the
commands' real output.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "captures"

#: capture name -> the ``celery -A examples.shop dlq`` arguments.
CAPTURES = {
    "queues": ["queues"],
    "list-payments": ["list", "DLQ.payments"],
    "stats": ["stats"],
    "policy": ["policy", "shop.payments.charge", "-Q", "payments"],
}

UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
STAMP = re.compile(r"\b\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ\b")
UNIX = re.compile(r'("(?:dead_lettered_at|x-dlq-dead-lettered-at|x-dlq-first-failure-at|due)": )\d+(\.\d+)?')
WORKER = re.compile(r"celery@[\w.-]+")


def normalize(text: str) -> str:
    ids: dict[str, str] = {}
    text = UUID.sub(lambda m: ids.setdefault(m.group(0), f"00000000-0000-4000-8000-{len(ids) + 1:012d}"), text)
    text = STAMP.sub("2026-01-01 12:00:00Z", text)
    text = UNIX.sub(lambda m: m.group(1) + "1767268800.0", text)
    return WORKER.sub("celery@worker", text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def capture() -> dict[str, str]:
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no", "--dir", tmp], stdout=subprocess.DEVNULL)
        try:
            url = f"redis://127.0.0.1:{port}/0"
            env = {**os.environ, "REDIS_URL": url, "COLUMNS": "180", "PYTHONPATH": str(ROOT)}
            deadline = time.monotonic() + 10
            while subprocess.run(["redis-cli", "-p", str(port), "PING"], capture_output=True).returncode:
                if time.monotonic() > deadline:
                    raise SystemExit("redis-server did not start")
                time.sleep(0.1)
            subprocess.run([sys.executable, "-m", "examples.demo"], cwd=ROOT, env=env, check=True,
                           stdout=subprocess.DEVNULL)
            out = {}
            for name, args in CAPTURES.items():
                done = subprocess.run([sys.executable, "-m", "celery", "-A", "examples.shop", "dlq", *args],
                                      cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
                shown = " ".join(["celery -A examples.shop dlq", *args])
                out[name] = normalize(f"$ {shown}\n{done.stdout}{done.stderr}")
            return out
        finally:
            server.terminate()
            server.wait(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with docs/captures/ instead of writing")
    args = parser.parse_args()
    captured = capture()
    stale = 0
    for name, text in captured.items():
        path = OUT / f"{name}.txt"
        if args.check:
            old = path.read_text() if path.exists() else ""
            if old != text:
                stale += 1
                sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                                           str(path), "now"))
        else:
            OUT.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"{stale} capture(s) out of date: run python scripts/captures.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
