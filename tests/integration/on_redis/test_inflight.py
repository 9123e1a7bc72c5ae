"""tests/unit/test_inflight.py again, on a real redis-server."""
from tests.unit.test_inflight import *  # noqa: F403  (its tests and fixtures)
