"""Redeliveries inside Redis: every delivery number once, upgrades and rolling deploys lose nothing."""
from __future__ import annotations

import subprocess
import sys
import time
from collections import defaultdict

import pytest
from kombu import Producer

from celery_dlq.storage.keys import Keys
from celery_dlq.storage.store import ParkedStore
from tests.integration.conftest import Worker
from tests.integration.test_mover import park_noop_messages
from tests.services import missing

pytestmark = pytest.mark.integration

#: The last commit before the direct format: its package is the "old worker" of a rolling deploy.
OLD = "0286e091ca39645166604ef784b4d96d91e649b4"


def deliveries_by_id(harness) -> dict[str, list[int]]:
    seen: dict[str, list[int]] = defaultdict(list)
    for row in harness.deliveries():
        seen[row["id"]].append(row["delivery"])
    return {task_id: sorted(numbers) for task_id, numbers in seen.items()}


@pytest.mark.slow
def test_three_workers_3000_tasks_failing_twice_log_deliveries_1_2_3_exactly(harness):
    for name in ("a", "b", "c"):
        harness.worker(name=name, concurrency=2)
    ids = [harness.send("proj.flaky", args=(2,)).id for _ in range(3000)]
    harness.wait_until(lambda: len(harness.deliveries()) >= 9000, timeout=300, message="9000 deliveries")
    store = ParkedStore(harness.redis, Keys(harness.prefix))
    redelivered, queues = int(harness.redis.hget(store.keys.stats, "redelivered")), harness.redis.hlen(store.keys.queues)
    harness.after_a_mover_pass()   # then any duplicate would have shown up
    seen = deliveries_by_id(harness)
    assert set(seen) == set(ids)
    assert {tuple(numbers) for numbers in seen.values()} == {(1, 2, 3)}, "no double publish, no skipped number"
    assert store.count() == 0 and harness.redis.hlen(store.keys.payloads) == 0
    assert redelivered == 6000
    assert queues == 0, "direct-format entries keep no queues field"


def test_entries_parked_before_an_upgrade_are_moved_by_the_new_mover(harness):
    """Park with the old (publish) format, then the new worker moves them: through kombu, each once."""
    old_ids = park_noop_messages(harness, 200, due=time.time() + 0.5)
    harness.worker()
    flaky = [harness.send("proj.flaky", args=(1,)).id for _ in range(50)]     # parked in the new format
    harness.wait_until(lambda: len(harness.deliveries()) >= 300, timeout=60, message="300 deliveries")
    harness.after_a_mover_pass()
    seen = deliveries_by_id(harness)
    assert {tuple(seen[i]) for i in old_ids} == {(1,)}     # the noop logs its (header) delivery once
    assert {tuple(seen[i]) for i in flaky} == {(1, 2)}
    assert ParkedStore(harness.redis, Keys(harness.prefix)).count() == 0


@pytest.fixture
def old_package(tmp_path):
    """celery-dlq as of commit OLD (the package and the test app), unpacked into a directory of its own."""
    root = tmp_path / "old"
    root.mkdir()
    paths = ["celery_dlq", "tests/__init__.py", "tests/integration/__init__.py", "tests/integration/proj.py"]
    archive = subprocess.run(["git", "archive", OLD, *paths], cwd=Worker.root(), capture_output=True)
    if archive.returncode != 0:   # a shallow clone: fetch that one commit from origin
        subprocess.run(["git", "fetch", "--depth=1", "origin", OLD], cwd=Worker.root(), capture_output=True)
        archive = subprocess.run(["git", "archive", OLD, *paths], cwd=Worker.root(), capture_output=True)
    if archive.returncode != 0:
        missing(f"commit {OLD} (the previous release)", "clone with history, or let `git fetch origin` reach it: "
                f"{archive.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    return root


def test_a_rolling_deploy_loses_nothing_and_duplicates_only_without_publish_batches(harness, old_package):
    old = Worker(harness.env(PYTHONPATH=str(old_package)), 2, "old", harness.tmp_path / "old.log", cwd=old_package)
    harness.workers.append(old.start())
    probe = subprocess.run([sys.executable, "-c", "import celery_dlq, os; print(os.path.dirname(celery_dlq.__file__))"],
                           cwd=old_package, capture_output=True, text=True, env=harness.env(PYTHONPATH=str(old_package)))
    assert probe.stdout.strip() == str(old_package / "celery_dlq")      # the old worker runs the old code
    harness.worker(name="new")
    ids = [harness.send("proj.flaky", args=(2,)).id for _ in range(600)]
    harness.wait_until(lambda: all(3 in numbers for numbers in deliveries_by_id(harness).values())
                       and len(deliveries_by_id(harness)) == len(ids), timeout=240,
                       message="every task's third delivery")
    harness.after_a_mover_pass()
    seen = deliveries_by_id(harness)
    assert set(seen) == set(ids)
    if hasattr(Producer, "batch"):
        assert {tuple(numbers) for numbers in seen.values()} == {(1, 2, 3)}
    else:
        # kombu < 5.7 has no publish batches: the OLD mover, failing on a direct-format entry it claimed,
        # gives back a batch it had partly published (docs/versions.md). At least once: nothing lost or skipped,
        # and only moved deliveries (2 and 3) repeat.
        assert {tuple(sorted(set(numbers))) for numbers in seen.values()} == {(1, 2, 3)}
        assert all(numbers.count(1) == 1 for numbers in seen.values()), "a first delivery (never moved) ran twice"
        print(f"\nrolling deploy on kombu without Producer.batch: "
              f"{sum(len(n) - 3 for n in seen.values())} duplicated deliveries of {3 * len(ids)}")
    assert ParkedStore(harness.redis, Keys(harness.prefix)).count() == 0
    assert harness.dead_letters() == []
    pids = {row["pid"] for row in harness.deliveries()}
    assert len(pids) >= 3, "both workers' pools ran tasks"
