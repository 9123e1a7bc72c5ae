"""The unit tests that take ``any_redis``, run again on the test run's redis-server (tests/integration/conftest.py)."""
