"""The release as users get it: sdist and wheel built, checked by twine, the wheel installed into a fresh
virtualenv outside the checkout, and the demo and the CLI run from there (catches missing package data)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import celery_dlq

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def run(cmd, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_the_wheel_installs_in_a_fresh_virtualenv_and_runs_the_demo_and_the_cli(tmp_path):
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", dist, ROOT], timeout=600)
    wheel = next(dist.glob("celery_dlq-*.whl"))
    sdist = next(dist.glob("celery_dlq-*.tar.gz"))
    assert wheel.name.startswith(f"celery_dlq-{celery_dlq.__version__}-")
    run([sys.executable, "-m", "twine", "check", "--strict", wheel, sdist], timeout=120)
    names = set(zipfile.ZipFile(wheel).namelist())
    lua = {p.name for p in (ROOT / "celery_dlq" / "storage" / "lua").glob("*.lua")}
    assert {Path(n).name for n in names if n.startswith("celery_dlq/storage/lua/")} == lua
    assert "celery_dlq/web/templates/base.html" in names or any(n.startswith("celery_dlq/web/templates/")
                                                                for n in names)
    assert "celery_dlq/py.typed" in names

    venv = tmp_path / "venv"   # not --system-site-packages: only what the wheel asks for
    run([sys.executable, "-m", "venv", venv], timeout=120)
    python = venv / "bin" / "python"
    run([python, "-m", "pip", "install", "-q", f"{wheel}[web]"], timeout=900)

    work = tmp_path / "outside"          # away from the checkout: the installed package is what imports
    shutil.copytree(ROOT / "examples", work / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "REDIS_URL") and not k.startswith("DLQ_")}
    where = run([python, "-c", "import celery_dlq, sys; print(celery_dlq.__file__)"], cwd=work, env=env)
    assert str(venv) in where.stdout and str(ROOT) not in where.stdout
    helped = run([venv / "bin" / "celery", "-A", "examples.shop", "dlq", "--help"], cwd=work, env=env, timeout=60)
    for verb in ("queues", "list", "replay", "purge", "parked", "stats", "policy", "exporter", "web"):
        assert verb in helped.stdout
    demo = run([python, "-m", "examples.demo"], cwd=work, env=env, timeout=300)
    assert "dead-lettered" in demo.stdout.lower() or "DLQ." in demo.stdout
