"""A worker whose library moved an internal starts, warns once naming it, and runs tasks on the fallback."""
from __future__ import annotations

import re

import pytest

from celery_dlq import headers as H
from celery_dlq.internals.features import every_internal
from celery_dlq.internals.kombu_redis import FETCH
from tests.internals_hiding import key

pytestmark = pytest.mark.integration

ALL = every_internal()


@pytest.mark.parametrize("feature,internal", ALL, ids=[i.path for _, i in ALL])
def test_a_worker_without_one_internal_starts_warns_once_and_keeps_its_guarantees(harness, feature, internal):
    if feature.predates():
        pytest.skip(f"{feature.name} needs {feature.since}: off without a warning here")
    worker = harness.worker(concurrency=1, DLQ_TEST_HIDE_INTERNAL=key(internal))
    ok = harness.send("proj.noop", args=(1,))
    failing = harness.send("proj.always_fails", args=(7,))
    harness.wait_until(lambda: harness.deliveries(ok.id) and len(harness.dead_letters()) == 1, timeout=60,
                       message="the noop ran and the failing task reached its DLQ")
    assert [row["delivery"] for row in harness.deliveries(failing.id)] == [1, 2, 3]
    letter = harness.dead_letters()[0]["headers"]
    assert (letter["id"], letter[H.REASON], letter[H.DELIVERY_COUNT]) == (failing.id, "max_delivery_attempts", 3)
    log = worker.log()
    warnings = [line for line in log.splitlines() if "WARNING" in line and internal.path in line]
    assert len(warnings) == 1, log[-3000:]
    assert feature.fallback in warnings[0]
    fetches_ours = re.search(r"the worker fetches with celery_dlq\.worker", log) is not None
    assert fetches_ours is (feature is not FETCH), "the fetch falls back to kombu's only when its internals moved"
    assert worker.proc.poll() is None
