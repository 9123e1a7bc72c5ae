from __future__ import annotations

import os
import uuid

import pytest
import redis

from tests.redis_server import RedisServer


def pytest_configure(config):
    """pytest-xdist's workers set COLUMNS=80 and LINES=24; the CLI takes $COLUMNS as the operator's width.

    Drop them so that a test sees what a pipe gets, with or without xdist.

    And load tests/ci_skips.py as a plugin of the whole run (a conftest's own
    hooks do not hear every report, a skip in a sub-directory's conftest for
    one): with ``CI=true`` a run that skipped anything fails.
    """
    if not config.pluginmanager.has_plugin("tests.ci_skips"):
        config.pluginmanager.import_plugin("tests.ci_skips")
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


# ``any_redis`` and ``emptied_any_redis``: fakeredis (with Lua) under tests/unit, the test run's
# redis-server under tests/integration, where tests/integration/on_redis runs the same tests again.


@pytest.fixture
def unique():
    """A short unique suffix for key prefixes and queue names of one test."""
    return uuid.uuid4().hex[:8]
