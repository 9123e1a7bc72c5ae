"""redis-server restarted on the same port (AOF, appendfsync always) while retries are parked and the workers busy:
every task still succeeds, the worker never exits, nothing is left behind. One round (tests/integration/
test_fetch_path.py runs ten on the development versions)."""
from __future__ import annotations

import time
import uuid

import pytest

from celery_dlq.storage.keys import Keys
from celery_dlq.storage.store import ParkedStore
from tests.contract.conftest import contract_harness
from tests.redis_server import RedisServer

pytestmark = [pytest.mark.contract, pytest.mark.integration]

TASKS = 200


def test_a_broker_restart_loses_nothing(tmp_path):
    server = RedisServer(None, "--appendonly", "yes", "--appendfsync", "always").start()
    harness = contract_harness(server, tmp_path, uuid.uuid4().hex[:8])
    try:
        worker = harness.worker(concurrency=2)
        pid = worker.proc.pid
        ids = [harness.send("proj.flaky", args=(1, "restart")).id for _ in range(TASKS)]   # succeeds on delivery 2
        store = ParkedStore(harness.redis, Keys(harness.prefix))
        harness.wait_until(lambda: store.count() > 0 and len(harness.deliveries()) > TASKS // 4, timeout=60,
                           message="retries parked and the worker busy")
        server.shutdown()
        time.sleep(1)        # down for a second; Celery reconnects after 2 s, its first retry interval
        server.start()
        done = lambda: {d["id"] for d in harness.deliveries() if d["delivery"] >= 2} >= set(ids)  # noqa: E731
        harness.wait_until(done, timeout=120, message=f"all {TASKS} tasks succeeded after the restart")
        harness.wait_until(lambda: harness.in_flight() == 0 and store.count() == 0
                           and harness.redis.llen(harness.queue) == 0, timeout=30, message="nothing left behind")
        assert worker.proc.poll() is None and worker.proc.pid == pid, "the worker never exits"
        assert harness.dead_letters() == []
        assert "Unrecoverable error" not in worker.log()
    finally:
        harness.close()
        server.stop()
