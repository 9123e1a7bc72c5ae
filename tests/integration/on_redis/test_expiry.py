"""tests/unit/test_expiry.py again, on a real redis-server."""
from tests.unit.test_expiry import *  # noqa: F403  (its tests and fixtures)
