"""tests/unit/test_letter_lookup.py again, on a real redis-server."""
from tests.unit.test_letter_lookup import *  # noqa: F403  (its tests and fixtures)
