from __future__ import annotations

import os
import uuid

import fakeredis
import pytest
import redis

from tests.redis_server import RedisServer


def pytest_configure(config):
    """pytest-xdist's workers set COLUMNS=80 and LINES=24; the CLI takes $COLUMNS as the operator's width.

    Drop them so that a test sees what a pipe gets, with or without xdist.
    """
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ.pop("COLUMNS", None)
        os.environ.pop("LINES", None)


def pytest_collection_modifyitems(config, items):
    """Order and group the run for pytest-xdist (``-n 2 --dist loadgroup``, as scripts/test.sh runs it).

    Every Spark test goes to one xdist worker, so the run starts one JVM and
    one SparkSession (a session fixture is per worker). Tests marked ``slow``
    are handed out first, so that no worker is left with a long one at the end.
    The order is the same on every worker, as xdist requires.
    """
    for item in items:
        if item.get_closest_marker("spark") or item.nodeid.startswith("tests/analytics/"):
            item.add_marker(pytest.mark.xdist_group("spark"))
    items.sort(key=lambda item: 0 if item.get_closest_marker("slow") else 1)


@pytest.fixture(scope="session")
def redis_server():
    """A real redis-server the test run owns, on a free port."""
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server):
    return redis_server.url


@pytest.fixture
def real_redis(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


def _fake_or_real(request) -> redis.Redis:
    if request.param == "fakeredis":
        return fakeredis.FakeRedis(server=fakeredis.FakeServer())
    return redis.Redis.from_url(request.getfixturevalue("redis_server").url)


@pytest.fixture(params=["fakeredis", "redis-server"])
def any_redis(request):
    """Run a test once on fakeredis (with Lua) and once on the real server."""
    client = _fake_or_real(request)
    yield client
    client.close()


@pytest.fixture(params=["fakeredis", "redis"])
def emptied_any_redis(request):
    """As ``any_redis``, for tests that read the whole database: the real server's is emptied after the test."""
    client = _fake_or_real(request)
    yield client
    if request.param == "redis":
        client.flushdb()
    client.close()


@pytest.fixture
def unique():
    """A short unique suffix for key prefixes and queue names of one test."""
    return uuid.uuid4().hex[:8]
