"""An error raised while a valid message is handled is a bug to log, never an invalid_message dead letter."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration

FAST_RESTORE = json.dumps({"broker_transport_options": {
    "visibility_timeout": 1, "unacked_restore_interval": 1, "unacked_restore_throttle": 1}})


def test_a_bug_in_the_strategy_leaves_a_valid_message_unacknowledged_and_it_runs_once_fixed(harness):
    harness.extra_env["DLQ_TEST_CONF"] = FAST_RESTORE
    buggy = harness.worker(concurrency=1, name="buggy", DLQ_TEST_STRATEGY_BUG="proj.noop")
    victim = harness.send("proj.noop", args=(1,))
    buggy.wait_for_log("an injected bug in the strategy")
    other = harness.send("proj.flaky", args=(0,))
    harness.wait_until(lambda: harness.deliveries(other.id), message="another task still runs")
    assert "error while handing message" in buggy.log() and buggy.proc.poll() is None
    assert harness.dead_letters() == [], "a valid message is never dead-lettered for our own bug"
    assert harness.deliveries(victim.id) == []
    buggy.stop()
    fixed = harness.worker(concurrency=1, name="fixed")
    harness.wait_until(lambda: harness.deliveries(victim.id), message="the message, given back, runs once fixed")
    assert harness.dead_letters() == [] and fixed.proc.poll() is None
    # it ran once; kombu gave it back marked redelivered, so it counts as delivery 2 (at least once)
    assert [row["delivery"] for row in harness.deliveries(victim.id)] == [2]
