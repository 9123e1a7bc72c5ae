"""tests/unit/test_chords.py again, on a real redis-server."""
from tests.unit.test_chords import *  # noqa: F403  (its tests and fixtures)
