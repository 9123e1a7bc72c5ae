"""Fixtures shared by the operator-tool unit tests (manage.py, the CLI)."""
from __future__ import annotations

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
def app():
    """An operator's app; its broker URL is never dialled (tests pass fakeredis clients)."""
    app = Celery("ops", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.task_default_queue = "orders"   # DLQ.orders is configured; other DLQs are found in Redis
    return app
