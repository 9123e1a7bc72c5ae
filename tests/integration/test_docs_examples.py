"""The README's quick start and the policy page's examples, executed as written.

The quick start runs against a real redis-server with a real worker: the task
is delivered four times, 1, 2 and 4 s apart (the worker log's timestamps), and
its message is in ``DLQ.celery``, as the README says.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import redis

from tests.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]
#: Celery's worker log line for each delivery of a task: ``[2026-11-27 11:51:05,427: INFO/MainProcess] Task ...``.
RECEIVED = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): INFO/MainProcess\] "
                      r"Task shop\.charge\[.*\] received$", flags=re.M)


def delivery_gaps(log: str) -> list[float]:
    """Seconds between consecutive deliveries of the task, from the worker log's millisecond timestamps."""
    times = [datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f") for stamp in RECEIVED.findall(log)]
    return [(later - earlier).total_seconds() for earlier, later in zip(times, times[1:])]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_the_policy_pages_examples_run_and_their_assertions_hold(tmp_path):
    """In a process of their own: the page's ``@app.task`` tasks are Celery shared tasks, bound to every app."""
    blocks = python_blocks(ROOT / "docs" / "policies.md")
    assert len(blocks) >= 2
    script = tmp_path / "policies.py"
    script.write_text("\n\n".join(blocks) + "\nprint('all examples ran')\n")
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stdout + run.stderr
    assert "all examples ran" in run.stdout


def test_the_readme_quick_start_delivers_four_times_1_2_4_s_apart_then_dead_letters(tmp_path):
    module, send = python_blocks(ROOT / "README.md")[:2]
    assert module.startswith("# shop.py\n")
    server = RedisServer().start()
    url = server.url
    try:
        (tmp_path / "shop.py").write_text(module.replace("redis://localhost:6379/0", url))
        env = {**{k: v for k, v in os.environ.items() if not k.startswith(("DLQ_", "PYTEST_"))},
               "PYTHONPATH": str(tmp_path)}
        log = open(tmp_path / "worker.log", "wb")
        worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "shop", "worker", "-P", "solo",
                                   "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "INFO"],
                                  cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            subprocess.run([sys.executable, "-c", send], cwd=tmp_path, env=env, check=True, timeout=60)
            client = redis.Redis.from_url(url)
            deadline = time.monotonic() + 40
            while client.llen("DLQ.celery") < 1 and time.monotonic() < deadline:
                assert worker.poll() is None, (tmp_path / "worker.log").read_text()
                time.sleep(0.2)
            assert client.llen("DLQ.celery") == 1, (tmp_path / "worker.log").read_text()
            listed = subprocess.run([sys.executable, "-m", "celery", "-A", "shop", "dlq", "list", "DLQ.celery", "--json"],
                                    cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
            assert listed.returncode == 0, listed.stderr
            assert '"shop.charge"' in listed.stdout and "max_delivery_attempts" in listed.stdout
            assert "payment gateway down for order 42" in listed.stdout
            shown = subprocess.run([sys.executable, "-m", "celery", "-A", "shop", "dlq", "list", "DLQ.celery"],
                                   cwd=tmp_path, env={**env, "COLUMNS": "130"}, capture_output=True, text=True,
                                   timeout=60)
            (tmp_path / "list.txt").write_text(shown.stdout)
            print(shown.stdout)
            text = (tmp_path / "worker.log").read_text()
            gaps = delivery_gaps(text)
            assert len(gaps) == 3, f"4 deliveries expected: {text}"
            # Each delivery is received before its failure parks the next, so a gap is at least its delay (less
            # the log's millisecond rounding); below twice the delay tells 1/2/4 s from a missing multiplier
            # (1/1/1), an exponent off by one (2/4/8 or 0.5/1/2) or a hot loop.
            for gap, delay in zip(gaps, (1, 2, 4)):
                assert delay - 0.002 <= gap < 2 * delay, f"delays {gaps}, expected 1, 2, 4 s"
        finally:
            worker.terminate()
            worker.wait(timeout=30)
            log.close()
    finally:
        server.stop()
