"""tests/unit/test_shards.py again, on a real redis-server."""
from tests.unit.test_shards import *  # noqa: F403  (its tests and fixtures)
