"""The report on a real Spark standalone cluster, submitted with spark-submit as docs/analytics.md tells a user.

conftest.standalone_run starts a master and a worker (pyspark's spark-class,
loopback only), runs docs/analytics.md's spark-submit line over the
hand-built archive, and stops the cluster. Every number of its report is
checked by test_report.py (``hand_report[standalone]``); here: that it ran on
the cluster, bound to loopback, printed what the docs say, left nothing
running, and that the docs show exactly these commands.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.analytics.standalone import COMMANDS, WORKER_CORES

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]


def test_the_report_runs_on_the_cluster_and_prints_two_lines(standalone_run):
    run = standalone_run
    assert run.proc.returncode == 0, run.proc.stdout + run.proc.stderr[-6000:]
    summary, wrote = run.proc.stdout.splitlines()
    assert re.fullmatch(r"6 dead letters in 13 events; replay plan: 3 selected \(2 poison excluded\) in \d+\.\d s",
                        summary), summary
    assert wrote == f"wrote {run.out}/report.html, report.json, tables/, replay_plan/"
    # The driver registered an application with the master, which ran it to the end on the worker's cores ...
    (app,) = run.master["completedapps"]
    assert (app["name"], app["state"], app["cores"]) == ("celery-dlq-report", "FINISHED", WORKER_CORES)
    assert run.master["activeapps"] == []
    # ... in an executor the worker launched: the report's tasks did not run in the driver (no local fallback).
    (worker,) = run.master["workers"]
    assert worker["host"] == "127.0.0.1" and worker["state"] == "ALIVE"
    assert [e["appid"] for e in run.worker["finishedexecutors"]] == [app["id"]]


def test_the_cluster_listened_on_loopback_only_and_was_stopped(standalone_run):
    assert len(standalone_run.listening) >= 4      # the master's and the worker's RPC and web UI ports at least
    assert [a for a in standalone_run.listening if not a.startswith("127.0.0.1:")] == []
    assert standalone_run.left_running == []


def shell_blocks(markdown: str) -> list[list[str]]:
    """The page's ``bash`` blocks as lines: continuations (``\\``) joined, spaces collapsed, a trailing ``&`` dropped."""
    return [[" ".join(line.split()).removesuffix(" &") for line in re.sub(r"\\\n\s*", " ", block).splitlines()
             if line.strip()]
            for block in re.findall(r"```bash\n(.*?)```", markdown, flags=re.S)]


def test_the_docs_show_the_commands_the_test_runs_word_for_word():
    blocks = shell_blocks((ROOT / "docs" / "analytics.md").read_text())
    assert [" ".join(command.split()) for command in COMMANDS] in blocks
