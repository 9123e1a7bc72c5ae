"""The version-contract suite: the installed celery-dlq with a real prefork worker on a real redis-server.

``noxfile.py`` runs it against the built wheel on every supported Python,
Celery/kombu and redis-py (docs/versions.md); the normal suite runs it once on
the development versions. To stay fast, a module starts ONE redis-server and
its workers once (:func:`stack`), and each test keeps to its own task ids.
"""
from __future__ import annotations

import uuid

import pytest

from tests.integration.conftest import Harness, Worker
from tests.redis_server import RedisServer

#: Seconds a worker may take to log "ready.": on a 2-core machine shared with other test runs (load average 16)
#: one took longer than the integration tests' 30 s just to import Celery. Not a measurement: a hang detector.
READY_TIMEOUT = 180


class PatientWorker(Worker):
    """tests/integration/proj.py's worker, given READY_TIMEOUT to start."""

    def start(self, wait_ready: bool = True) -> "PatientWorker":
        super().start(wait_ready=False)
        if wait_ready:
            self.wait_for_log("ready.", timeout=READY_TIMEOUT)
        return self


class ContractWorker(PatientWorker):
    """The contract suite's app (tests/contract/proj.py: the integration tasks and a few of its own)."""

    app = "tests.contract.proj"


def contract_harness(server, tmp_path, unique: str) -> Harness:
    h = Harness(server, tmp_path, unique)
    h.worker_cls = ContractWorker
    return h


@pytest.fixture
def harness(redis_server, tmp_path, unique):
    """tests/integration's harness, its workers given READY_TIMEOUT to start."""
    h = contract_harness(redis_server, tmp_path, unique)
    yield h
    h.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A redis-server and two prefork workers (two processes each) on one queue, for a whole module."""
    server = RedisServer().start()
    h = contract_harness(server, tmp_path_factory.mktemp("contract"), uuid.uuid4().hex[:8])
    try:
        h.worker(name="a")
        h.worker(name="b")
        yield h
    finally:
        h.close()
        server.stop()
