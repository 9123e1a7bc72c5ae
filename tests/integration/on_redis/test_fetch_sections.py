"""tests/unit/test_fetch_sections.py again, on a real redis-server."""
from tests.unit.test_fetch_sections import *  # noqa: F403  (its tests and fixtures)
