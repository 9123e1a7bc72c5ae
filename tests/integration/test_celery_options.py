"""Celery's own retry options become the task's policy; ``celery dlq policy`` says where each field came from."""
from __future__ import annotations

import json
import subprocess
import sys

from celery_dlq import headers as H
from celery_dlq.policy import FIELD_PATHS

CONF = {"dlq_default_policy": {"max_delivery_attempts": 3, "max_redelivery_delay": 5}}


def test_max_retries_and_autoretry_for_under_an_app_default_of_three_attempts_give_two_deliveries(harness):
    harness.worker(DLQ_TEST_CONF=json.dumps(CONF))
    result = harness.send("proj.celery_options")
    harness.wait_until(lambda: len(harness.dead_letters()) == 1, message="dead-lettered")
    harness.after_a_mover_pass()   # a third delivery (the app default of 3 attempts) would have run by now
    assert [d["delivery"] for d in harness.deliveries(result.id)] == [1, 2]
    headers = harness.dead_letters()[0]["headers"]
    assert headers[H.DELIVERY_COUNT] == 2 and headers[H.EXCEPTION_TYPE] == "ValueError"


def test_the_worker_warns_at_start_of_a_tasks_delay_capped_by_a_cap_it_did_not_set(harness):
    worker = harness.worker(DLQ_TEST_CONF=json.dumps(CONF))
    lines = [line for line in worker.log().splitlines() if "capped" in line]
    assert any("WARNING" in line and "'proj.waits_an_hour'" in line and "redelivery_delay=3600" in line
               and "task redelivery_policy" in line and "capped to 5 s by max_redelivery_delay from "
               "dlq_default_policy" in line for line in lines), lines
    assert not any("proj.celery_options" in line or "proj.flaky" in line for line in lines), lines


def _policy(harness, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "celery", "-A", "tests.integration.proj", "dlq", "policy", *args],
                          cwd=harness.workers[0].root() if harness.workers else None,
                          env=harness.env(DLQ_TEST_CONF=json.dumps(CONF)), capture_output=True, text=True,
                          timeout=60)


def test_celery_dlq_policy_shows_every_fields_value_and_origin(harness):
    run = _policy(harness, "proj.celery_options", "--json")
    assert run.returncode == 0, run.stderr
    rows = {row["field"]: (row["value"], row["from"]) for row in json.loads(run.stdout)}
    assert rows["max_delivery_attempts"] == (2, "task Celery option max_retries=1")
    assert rows["retry_on"] == (["ValueError"], "task Celery option autoretry_for=(ValueError,)")
    assert rows["max_redelivery_delay"] == (5.0, "dlq_default_policy")
    assert rows["redelivery_delay"] == (0.0, "built-in default")
    assert set(rows) == set(FIELD_PATHS)
    assert rows["breaker.enabled"] == (False, "built-in default") and rows["breaker.window"] == (60.0, "built-in default")
    text = _policy(harness, "proj.waits_an_hour", "-Q", harness.queue)
    assert text.returncode == 0, text.stderr
    assert "task redelivery_policy" in text.stdout and "dlq_default_policy" in text.stdout
    assert "capped to 5 s" in text.stderr
    unknown = _policy(harness, "proj.celery_option")
    assert unknown.returncode == 2 and "did you mean 'proj.celery_options'?" in unknown.stderr
