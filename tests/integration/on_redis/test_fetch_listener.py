"""tests/unit/test_fetch_listener.py again, on a real redis-server."""
from tests.unit.test_fetch_listener import *  # noqa: F403  (its tests and fixtures)
