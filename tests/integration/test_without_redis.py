"""An app that installs celery-dlq can be unit-tested without Redis; a worker without one stops with one line."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "tests" / "projects" / "eager"


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DLQ_", "PYTEST_"))}
    env.update(extra)
    return env


def test_a_projects_own_eager_suite_runs_green_with_a_memory_broker_and_no_redis(tmp_path):
    project = tmp_path / "shop"
    shutil.copytree(PROJECT, project)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          "-W", "error", "tests"],
                         cwd=project, env=_env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "4 passed" in run.stdout


def test_a_worker_without_any_redis_stops_at_start_with_one_line_naming_dlq_redis_url(tmp_path):
    project = tmp_path / "shop"
    shutil.copytree(PROJECT, project)
    run = subprocess.run([sys.executable, "-m", "celery", "-A", "shopapp", "worker", "-P", "solo",
                          "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "INFO"],
                         cwd=project, env=_env(PYTHONPATH=str(project)), capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 1, run.stdout + run.stderr
    lines = [line for line in (run.stdout + run.stderr).splitlines() if "dlq_redis_url" in line]
    assert lines == ["celery-dlq: the worker cannot start: dlq_redis_url is required when the broker is not "
                     "Redis (broker_url is 'memory:///')"]
    assert "Traceback" not in run.stderr
