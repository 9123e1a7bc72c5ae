"""tests/unit/test_dlq_lists.py again, on a real redis-server."""
from tests.unit.test_dlq_lists import *  # noqa: F403  (its tests and fixtures)
