"""tests/unit/test_trends.py again, on a real redis-server."""
from tests.unit.test_trends import *  # noqa: F403  (its tests and fixtures)
