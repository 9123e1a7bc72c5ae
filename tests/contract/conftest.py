"""The version-contract suite: the installed celery-dlq with a real prefork worker on a real redis-server.

``noxfile.py`` runs it against the built wheel on every supported Python,
Celery/kombu and redis-py (docs/versions.md); the normal suite runs it once on
the development versions. To stay fast, a module starts ONE redis-server and
its workers once (:func:`stack`), and each test keeps to its own task ids.
"""
from __future__ import annotations

import uuid

import pytest

from tests.integration.conftest import Harness, Worker, harness  # noqa: F401  (harness: a fixture)
from tests.redis_server import RedisServer


class ContractWorker(Worker):
    app = "tests.contract.proj"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A redis-server and two prefork workers (two processes each) on one queue, for a whole module."""
    server = RedisServer().start()
    h = Harness(server, tmp_path_factory.mktemp("contract"), uuid.uuid4().hex[:8])
    h.worker_cls = ContractWorker
    try:
        h.worker(name="a")
        h.worker(name="b")
        yield h
    finally:
        h.close()
        server.stop()
