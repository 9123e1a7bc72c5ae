"""The report on a real Spark standalone cluster, submitted with spark-submit as docs/analytics.md tells a user.

The ``cluster`` fixture starts a master and a worker (pyspark's spark-class,
loopback only, see standalone.py) and stops them; the test runs
docs/analytics.md's spark-submit line over the hand-built archive, checks
that the report ran on the cluster, printed what the docs say, and holds
every number test_report.py checks in local mode; and that nothing was left
running. The docs show exactly these commands.
"""
from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest

from tests.analytics import test_report
from tests.analytics.standalone import COMMANDS, WORKER_CORES, StandaloneCluster

#: One test starts the cluster: the xdist groups of tests/conftest.py do not hold under pytest 9 (xdist 3.8 renames
#: items through an attribute pytest 9 no longer reads), so a cluster shared by several tests could start on each
#: worker.
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark")]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cluster(tmp_path):
    """A master and a worker on free loopback ports (every process in TZ=America/New_York), stopped after the test."""
    cluster = StandaloneCluster(tmp_path, extra_env={"TZ": "America/New_York"})
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.mark.slow
def test_the_report_submitted_to_a_standalone_cluster_is_the_hand_computed_one(cluster, hand_archive, tmp_path):
    assert len(cluster.listening()) >= 4      # the master's and the worker's RPC and web UI ports at least
    assert [a for a in cluster.listening() if not a.startswith("127.0.0.1:")] == []

    out = tmp_path / "report"
    proc = cluster.submit(hand_archive, out)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-6000:]
    # the report's two lines come last (pyspark may warn first, e.g. about an installed pandas >= 3)
    summary, wrote = proc.stdout.splitlines()[-2:]
    assert re.fullmatch(r"6 dead letters in 13 events; replay plan: 3 selected \(2 poison excluded\) in \d+\.\d s",
                        summary), summary
    assert wrote == f"wrote {out}/report.html, report.json, tables/, replay_plan/"
    # The driver registered an application with the master, which ran it to the end on the worker's cores ...
    master, worker = cluster.master_state(), cluster.worker_state()
    (app,) = master["completedapps"]
    assert (app["name"], app["state"], app["cores"]) == ("celery-dlq-report", "FINISHED", WORKER_CORES)
    assert master["activeapps"] == []
    (registered,) = master["workers"]
    assert registered["host"] == "127.0.0.1" and registered["state"] == "ALIVE"
    # ... in an executor the worker launched: the report's tasks did not run in the driver (no local fallback).
    assert [e["appid"] for e in worker["finishedexecutors"]] == [app["id"]]

    # Every number, as test_report.py checks the local report.
    report = json.loads((out / "report.json").read_text())
    for check in test_report.HAND_REPORT_CHECKS:
        check((report, out))

    assert cluster.stop() == []                # nothing of the cluster left running, executors included


def test_the_cluster_test_runs_every_check_of_the_local_report():
    takes_the_report = {f for name, f in inspect.getmembers(test_report, inspect.isfunction)
                        if name.startswith("test_") and "hand_report" in inspect.signature(f).parameters}
    assert set(test_report.HAND_REPORT_CHECKS) == takes_the_report


def shell_blocks(markdown: str) -> list[list[str]]:
    """The page's ``bash`` blocks as lines: continuations (``\\``) joined, spaces collapsed, a trailing ``&`` dropped."""
    return [[" ".join(line.split()).removesuffix(" &") for line in re.sub(r"\\\n\s*", " ", block).splitlines()
             if line.strip()]
            for block in re.findall(r"```bash\n(.*?)```", markdown, flags=re.S)]


def test_the_docs_show_the_commands_the_test_runs_word_for_word():
    blocks = shell_blocks((ROOT / "docs" / "analytics.md").read_text())
    assert [" ".join(command.split()) for command in COMMANDS] in blocks
