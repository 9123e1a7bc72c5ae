from __future__ import annotations

import uuid

import fakeredis
import pytest
import redis

from tests.redis_server import RedisServer


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


@pytest.fixture(params=["fakeredis", "redis-server"])
def any_redis(request):
    """Run a test once on fakeredis (with Lua) and once on the real server."""
    if request.param == "fakeredis":
        client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    else:
        client = redis.Redis.from_url(request.getfixturevalue("redis_server").url)
    yield client
    client.close()


@pytest.fixture
def unique():
    """A short unique suffix for key prefixes and queue names of one test."""
    return uuid.uuid4().hex[:8]
