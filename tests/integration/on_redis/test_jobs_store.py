"""tests/unit/test_jobs.py again, on a real redis-server: the job scripts (job_create, job_state, job_claim)."""
from tests.unit.test_jobs import *  # noqa: F403  (its tests and fixtures)
