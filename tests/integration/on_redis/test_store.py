"""tests/unit/test_store.py again, on a real redis-server."""
from tests.unit.test_store import *  # noqa: F403  (its tests and fixtures)
