"""tests/unit/test_metrics.py again, on a real redis-server."""
from tests.unit.test_metrics import *  # noqa: F403  (its tests and fixtures)
