"""tests/unit/test_keys.py again, on a real redis-server."""
from tests.unit.test_keys import *  # noqa: F403  (its tests and fixtures)
