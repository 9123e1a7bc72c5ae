"""tests/unit/test_worker_breaker.py again, on a real redis-server."""
from tests.unit.test_worker_breaker import *  # noqa: F403  (its tests and fixtures)
