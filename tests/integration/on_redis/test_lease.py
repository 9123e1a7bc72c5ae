"""tests/unit/test_lease.py again, on a real redis-server: lease.lua and the lease index."""
from tests.unit.test_lease import *  # noqa: F403  (its tests and fixtures)
