"""tests/unit/test_breakers.py again, on a real redis-server."""
from tests.unit.test_breakers import *  # noqa: F403  (its tests and fixtures)
