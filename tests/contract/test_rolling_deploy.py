"""A rolling deploy: a worker of the previous release and one of this release share a queue and the parked store.

Every task fails twice: nothing is lost or skipped, whichever worker parks or
moves it, and where kombu has publish batches (``Producer.batch``, kombu 5.7)
deliveries 1, 2 and 3 each run exactly once. Without them (kombu 5.4 to 5.6)
the old release's mover, failing on a direct-format entry it claimed, gives
back a batch it had partly published, so some moved deliveries (2 and 3) run
twice: at least once, and the first delivery still exactly once, as
tests/integration/test_fast_path.py and docs/versions.md say; the duplicates
are counted, printed and bounded (the new mover takes what the old one gives
back once it is due). The old
worker is celery-dlq at the last commit before the direct parking format (the
release users upgrade from), unpacked from the checkout's git history; it
runs on the session's Celery, kombu and redis-py like the new one.
"""
from __future__ import annotations

import os
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from kombu import Producer

from celery_dlq.storage.keys import Keys
from celery_dlq.storage.store import ParkedStore
from tests.contract.conftest import PatientWorker
from tests.integration.conftest import ROOT
from tests.services import missing

pytestmark = [pytest.mark.contract, pytest.mark.integration]

#: The last commit before the direct format (tests/integration/test_fast_path.py's previous release).
OLD = "0286e091ca39645166604ef784b4d96d91e649b4"
TASKS = 200
#: At most this many duplicated deliveries without publish batches (docs/versions.md has the grid's counts).
MAX_DUPLICATED = 60


@pytest.fixture
def old_release(tmp_path) -> Path:
    """The previous release's package and test app, from the git history of the checkout (under nox: the
    checkout the wheel was built from, CELERY_DLQ_CONTRACT_CHECKOUT)."""
    checkout = os.environ.get("CELERY_DLQ_CONTRACT_CHECKOUT") or str(ROOT)
    paths = ["celery_dlq", "tests/__init__.py", "tests/integration/__init__.py", "tests/integration/proj.py"]
    archive = subprocess.run(["git", "archive", OLD, *paths], cwd=checkout, capture_output=True)
    if archive.returncode != 0:   # a shallow clone: fetch that one commit from origin
        subprocess.run(["git", "fetch", "--depth=1", "origin", OLD], cwd=checkout, capture_output=True)
        archive = subprocess.run(["git", "archive", OLD, *paths], cwd=checkout, capture_output=True)
    if archive.returncode != 0:
        missing(f"commit {OLD} (the previous release) in {checkout}",
                "clone with history, or let `git fetch origin` reach it: "
                f"{archive.stderr.decode(errors='replace').strip()}")
    root = tmp_path / "old"
    root.mkdir()
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    return root


def test_a_rolling_deploy_loses_nothing_and_duplicates_only_without_publish_batches(harness, old_release):
    old = PatientWorker(harness.env(PYTHONPATH=str(old_release)), 2, "old", harness.tmp_path / "old.log",
                        cwd=old_release)
    harness.workers.append(old.start())
    harness.worker(name="new")
    ids = [harness.send("proj.flaky", args=(2, "deploy")).id for _ in range(TASKS)]
    harness.wait_until(lambda: {row["id"] for row in harness.deliveries() if row["delivery"] == 3} >= set(ids),
                       timeout=120, message=f"delivery 3 of all {TASKS} tasks")
    harness.after_a_mover_pass()           # a duplicate would have run by now
    store = ParkedStore(harness.redis, Keys(harness.prefix))
    if not hasattr(Producer, "batch"):     # a duplicated delivery 2 that failed parked a copy of its own: let it run
        harness.wait_until(lambda: store.count() == 0, timeout=60, message="the duplicates' parked copies ran")
        harness.after_a_mover_pass()
    seen: dict[str, list[int]] = defaultdict(list)
    for row in harness.deliveries():
        seen[row["id"]].append(row["delivery"])
    runs = Counter(tuple(sorted(seen[i])) for i in ids)
    if hasattr(Producer, "batch"):
        assert runs == {(1, 2, 3): TASKS}, f"deliveries per task (a repeated number ran twice): {runs}"
    else:
        assert {tuple(sorted(set(seen[i]))) for i in ids} == {(1, 2, 3)}, f"lost or skipped: {runs}"
        assert all(seen[i].count(1) == 1 for i in ids), f"a first delivery (never moved) ran twice: {runs}"
        duplicated = sum(len(seen[i]) - 3 for i in ids)
        print(f"\nrolling deploy without Producer.batch: {duplicated} duplicated deliveries of {3 * TASKS}")
        # The new mover moves what the old one gave back as soon as it is due: it is woken by the new worker's
        # parks though the old worker's sit ahead of them (park.lua, due_wake_until).
        assert duplicated <= MAX_DUPLICATED, f"{duplicated} duplicated deliveries: the new mover left the old one alone"
        # A duplicate that ran late may have parked a copy of its own since: it runs in its turn.
        harness.wait_until(lambda: store.count() == 0, timeout=60, message="the late duplicates' copies ran")
    assert store.count() == 0
    assert harness.dead_letters() == []
