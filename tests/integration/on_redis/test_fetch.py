"""tests/unit/test_fetch.py again, on a real redis-server."""
from tests.unit.test_fetch import *  # noqa: F403  (its tests and fixtures)
