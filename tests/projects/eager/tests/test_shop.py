"""The project's own unit tests: eager calls, no broker, no Redis."""
import pytest
from shopapp import OutOfStock, app, charge, reserve


def test_an_eager_call_runs_the_task_body():
    assert reserve.delay("apple", 2).get() == {"sku": "apple", "reserved": 2}


def test_an_eager_failure_propagates_as_celery_would():
    result = reserve.apply(args=("apple", 9))
    assert result.failed() and isinstance(result.result, OutOfStock)
    app.conf.task_eager_propagates = True
    try:
        with pytest.raises(OutOfStock):
            reserve.delay("apple", 9)
    finally:
        app.conf.task_eager_propagates = False


def test_retry_in_an_eager_call_is_celerys_own_eager_retry():
    assert charge.apply(args=(12, [2])).get() == 12


def test_the_policy_is_still_validated_and_resolved_without_redis():
    from celery_dlq import resolve_policy
    policy = resolve_policy(app, "shopapp.reserve", "celery")
    assert (policy.redelivery_delay, policy.max_delivery_attempts) == (30.0, 3)
