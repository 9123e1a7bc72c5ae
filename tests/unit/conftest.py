"""Fixtures of the unit tests: fakeredis only (a test that needs a redis-server lives in tests/integration)."""
from __future__ import annotations

import os

import fakeredis
import pytest
from celery import Celery


@pytest.fixture
def fake():
    """A fresh fakeredis server: broker lists and the extension's keys in one place."""
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    yield client
    client.close()


@pytest.fixture
def any_redis():
    """A fresh fakeredis server; tests/integration/on_redis runs the tests that take it on a real redis-server."""
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    yield client
    client.close()


@pytest.fixture
def emptied_any_redis(any_redis):
    return any_redis


@pytest.fixture
def app():
    """An operator's app; its broker URL is never dialled (tests pass fakeredis clients)."""
    app = Celery("ops", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.task_default_queue = "orders"   # DLQ.orders is configured; other DLQs are found in Redis
    return app


@pytest.fixture(autouse=True)
def _storage_owns_redis(request):
    """With DLQ_STORAGE_OWNS_REDIS=1 every unit test fails on a Redis command celery_dlq sent outside
    celery_dlq/storage/ (tests/redis_owner.py; tests/unit/test_storage_owns_redis.py runs a few test files so)."""
    if not os.environ.get("DLQ_STORAGE_OWNS_REDIS"):
        yield
        return
    from tests.redis_owner import guard

    with guard() as found:
        yield
    assert not found, f"Redis commands sent outside celery_dlq/storage/: {sorted(set(found))}"
