"""Celery's retry options as policy levels, and where each effective field came from."""
from __future__ import annotations

import random

import pytest
from celery import Celery

from celery_dlq import RedeliveryPolicy, RedeliveryTask
from celery_dlq.policy import UNLIMITED, compute_delay
from celery_dlq.settings import DLQSettings
from celery_dlq.tasklevel import own_options, task_levels


@pytest.fixture
def app():
    app = Celery("t", broker="memory://", set_as_current=False)
    app.conf.dlq_default_policy = {"max_delivery_attempts": 3, "max_redelivery_delay": 5}
    app.conf.dlq_task_policies = {"shop.*": {"redelivery_delay": 7}}
    return app


def explain(app, task, queue="celery"):
    return DLQSettings.from_conf(app.conf).explain(task.name, queue, task_levels(task))


def test_only_options_the_task_sets_count_not_celerys_class_defaults(app):
    @app.task(base=RedeliveryTask, shared=False, name="shop.plain")
    def plain():
        pass

    @app.task(base=RedeliveryTask, shared=False, name="shop.own", max_retries=None, default_retry_delay=30)
    def own():
        pass

    assert own_options(plain) == {}
    assert own_options(own) == {"max_retries": None, "default_retry_delay": 30}
    policy, origins = explain(app, own)
    assert policy.max_delivery_attempts == UNLIMITED and origins["max_delivery_attempts"].endswith("max_retries=None")
    assert policy.redelivery_delay == 30 and origins["redelivery_delay"].endswith("default_retry_delay=30")
    policy, origins = explain(app, plain)
    assert (policy.max_delivery_attempts, policy.redelivery_delay) == (3, 7)
    assert origins["redelivery_delay"] == "dlq_task_policies['shop.*']"


def test_retry_backoff_maps_to_a_doubling_delay_capped_with_full_jitter_as_celery_computes(app):
    @app.task(base=RedeliveryTask, shared=False, name="shop.backoff", retry_backoff=2, retry_backoff_max=50, max_retries=5)
    def backoff():
        pass

    policy, origins = explain(app, backoff)
    assert (policy.redelivery_delay, policy.redelivery_multiplier, policy.max_redelivery_delay) == (2.0, 2.0, 50.0)
    assert policy.redelivery_full_jitter is True
    assert origins["redelivery_full_jitter"].startswith("Celery's default retry_jitter=True")
    assert origins["max_redelivery_delay"] == "task Celery option retry_backoff_max=50"
    rng = random.Random(1)
    waits = [policy.delay_after(n, rng) for n in range(1, 8)]
    assert all(0 <= w <= min(50, 2 * 2 ** (n - 1)) for n, w in zip(range(1, 8), waits))


def test_an_explicit_redelivery_policy_wins_over_celery_options_field_by_field(app):
    @app.task(base=RedeliveryTask, shared=False, name="shop.both", max_retries=1, default_retry_delay=9,
              redelivery_policy={"max_delivery_attempts": 6})
    def both():
        pass

    policy, origins = explain(app, both)
    assert (policy.max_delivery_attempts, origins["max_delivery_attempts"]) == (6, "task redelivery_policy")
    assert (policy.redelivery_delay, origins["redelivery_delay"]) == (9, "task Celery option default_retry_delay=9")


def test_a_delay_capped_by_a_lower_level_is_reported_and_a_cap_the_task_set_is_not(app):
    settings = DLQSettings.from_conf(app.conf)
    [warning] = settings.capped_delays("shop.x", "celery", [("task redelivery_policy", {"redelivery_delay": 3600})])
    assert "redelivery_delay=3600" in warning and "capped to 5 s" in warning and "dlq_default_policy" in warning
    assert settings.capped_delays("shop.x", "celery", [("task redelivery_policy",
                                                        {"redelivery_delay": 3600, "max_redelivery_delay": 7200})]) == []
    assert settings.capped_delays("shop.x", "celery", []) == []


def test_full_jitter_draws_below_the_capped_delay_and_none_without_it():
    rng = random.Random(3)
    assert compute_delay(3, delay=1, multiplier=2, cap=3, factor=0, rng=rng) == 3
    draws = [compute_delay(3, delay=1, multiplier=2, cap=3, factor=0, rng=rng, full_jitter=True) for _ in range(200)]
    assert all(0 <= d <= 3 for d in draws) and len(set(draws)) > 100


def test_a_tasks_breaker_options_merge_one_by_one_with_the_patterns_each_with_its_origin(app):
    app.conf.dlq_task_policies = {"shop.*": {"breaker": {"min_failures": 4, "window": 120}}}

    @app.task(base=RedeliveryTask, shared=False, name="shop.guarded", max_retries=2,
              redelivery_policy=RedeliveryPolicy(breaker={"enabled": True, "window": 30}))
    def guarded():
        pass

    assert task_levels(guarded)[0] == ("task redelivery_policy", {"breaker": {"enabled": True, "window": 30.0}})
    policy, origins = explain(app, guarded)
    assert (policy.breaker.enabled, policy.breaker.window, policy.breaker.min_failures) == (True, 30.0, 4)
    assert origins["breaker.window"] == origins["breaker.enabled"] == "task redelivery_policy"
    assert origins["breaker.min_failures"] == "dlq_task_policies['shop.*']"
    assert origins["max_delivery_attempts"] == "task Celery option max_retries=2"


def test_a_flat_breaker_name_on_a_task_warns_naming_the_task(app):
    @app.task(base=RedeliveryTask, shared=False, name="shop.old", redelivery_policy={"auto_redrive": True})
    def old():
        pass

    with pytest.warns(DeprecationWarning, match=r"task 'shop\.old' redelivery_policy: the policy field 'auto_redrive'"):
        levels = task_levels(old)
    assert levels == [("task redelivery_policy", {"breaker": {"auto_redrive": True}})]
