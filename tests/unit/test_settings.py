"""dlq_* settings: validation at install time, and policy resolution across levels."""
from __future__ import annotations

import pytest
from celery import Celery

import celery_dlq
from celery_dlq import ConfigurationError, RedeliveryPolicy, RedeliveryTask, resolve_policy
from celery_dlq.settings import DEFAULTS, DLQSettings
from celery_dlq.worker.steps import STEPS


def make_app(**conf):
    app = Celery("t", broker="redis://:s3cret@127.0.0.1:1/0", set_as_current=False)
    app.conf.update(conf)
    return app


def test_defaults_take_the_broker_url_and_sanitize_it():
    settings = DLQSettings.from_conf(make_app().conf)
    assert settings.redis_url == "redis://:s3cret@127.0.0.1:1/0"
    assert "s3cret" not in settings.safe_redis_url
    assert settings.key_prefix == "celery_dlq"
    assert settings.global_keyprefix == ""


@pytest.mark.parametrize("broker, expected", [
    ("redis://:a@h1:6379/0;redis://:b@h2:6379/0", "redis://:a@h1:6379/0"),   # kombu's failover list
    ("redis+socket:///run/redis.sock?virtual_host=2", "unix:///run/redis.sock?db=2"),
])
def test_broker_urls_kombu_accepts_become_one_url_redis_py_opens(broker, expected):
    import redis

    settings = DLQSettings.from_conf(make_app(broker_url=broker).conf)
    assert settings.redis_url == expected
    redis.Redis.from_url(settings.redis_url)   # redis-py accepts it (no connection is made)
    assert ":a@" not in settings.safe_redis_url and ";" not in settings.safe_redis_url


def test_global_keyprefix_is_honoured():
    app = make_app(broker_transport_options={"global_keyprefix": "tenant1:"})
    assert DLQSettings.from_conf(app.conf).global_keyprefix == "tenant1:"


def test_non_redis_broker_needs_dlq_redis_url_where_redis_is_used():
    app = make_app(broker_url="amqp://guest:pw@localhost//")
    settings = DLQSettings.from_conf(app.conf)   # install() validates without it (an app's eager tests)
    with pytest.raises(ConfigurationError, match="dlq_redis_url") as info:
        settings.redis_url
    assert "pw" not in settings.safe_redis_url
    assert "pw" not in str(info.value)
    app.conf.dlq_redis_url = "redis://127.0.0.1:1/3"
    assert DLQSettings.from_conf(app.conf).redis_url.endswith("/3")


@pytest.mark.parametrize("name, value", [
    ("dlq_mover_interval", 0),
    ("dlq_mover_interval", "fast"),
    ("dlq_mover_batch_size", 0),
    ("dlq_mover_batch_size", 1.5),
    ("dlq_claim_lease", -1),
    ("dlq_key_prefix", ""),
    ("dlq_key_prefix", "a{b}"),
    ("dlq_redis_url", "http://x"),
    ("dlq_default_policy", {"redelivery_delay": -1}),
    ("dlq_default_policy", {"no_such_field": 1}),
    ("dlq_default_policy", [1, 2]),
    ("dlq_queue_policies", {"orders.#": {"max_delivery_attempts": 0}}),
    ("dlq_queue_policies", {"orders..x": {}}),
    ("dlq_task_policies", {"proj.*": {"retry_on": "nope.Nope"}}),
    ("dlq_task_policies", "proj.*"),
])
def test_bad_settings_name_the_setting(name, value):
    with pytest.raises(ConfigurationError, match=name):
        DLQSettings.from_conf(make_app(**{name: value}).conf)


def test_bad_field_names_the_pattern_and_field():
    app = make_app(dlq_queue_policies={"orders.#": {"max_delivery_attempts": 0}})
    with pytest.raises(ConfigurationError, match=r"dlq_queue_policies\['orders\.#'\].*max_delivery_attempts"):
        DLQSettings.from_conf(app.conf)


def test_unknown_setting_is_refused_with_a_suggestion():
    with pytest.raises(ConfigurationError, match="dlq_mover_intervall.*dlq_mover_interval"):
        DLQSettings.from_conf(make_app(dlq_mover_intervall=1).conf)


def test_install_validates_at_once_when_configured():
    app = make_app(dlq_claim_lease=0)
    with pytest.raises(ConfigurationError, match="dlq_claim_lease"):
        celery_dlq.install(app)


def test_install_is_idempotent():
    app = make_app()
    assert celery_dlq.install(app) is celery_dlq.install(app)
    steps = [s for s in app.steps["consumer"] if s.__module__.startswith("celery_dlq")]
    assert len(steps) == len(STEPS)


def test_precedence_and_fieldwise_merge_across_levels():
    app = make_app(
        dlq_default_policy={"redelivery_delay": 1, "max_delivery_attempts": 5, "dead_letter_queue_prefix": "dead."},
        dlq_queue_policies={"orders.#": {"redelivery_delay": 2, "redelivery_multiplier": 3},
                            "orders.eu": {"max_delivery_attempts": 7}},
        dlq_task_policies={"shop.*": {"redelivery_delay": 4}, "shop.pay": {"max_redelivery_delay": 60}},
    )

    @app.task(shared=False, base=RedeliveryTask, name="shop.pay", redelivery_policy=RedeliveryPolicy(max_delivery_attempts=2))
    def pay():
        pass

    policy = resolve_policy(app, "shop.pay", "orders.eu")
    assert policy.max_delivery_attempts == 2           # task level
    assert policy.max_redelivery_delay == 60.0         # dlq_task_policies, exact pattern
    assert policy.redelivery_delay == 4.0              # dlq_task_policies, 'shop.*' fills in
    assert policy.redelivery_multiplier == 3.0         # dlq_queue_policies 'orders.#'
    assert policy.dead_letter_queue_prefix == "dead."  # dlq_default_policy
    assert policy.dead_letter_queue("orders.eu") == "dead.orders.eu"

    other = resolve_policy(app, "shop.ship", "orders.eu")
    assert other.max_delivery_attempts == 7            # 'orders.eu' beats 'orders.#' and the default
    assert other.redelivery_delay == 4.0
    assert other.max_redelivery_delay == 40.0          # derived: 10 x the merged delay

    plain = resolve_policy(app, "misc.job", "celery")
    assert (plain.redelivery_delay, plain.max_delivery_attempts) == (1.0, 5)


def test_task_policy_as_dict_and_unset_fields_fall_through():
    app = make_app(dlq_default_policy={"redelivery_delay": 9})

    @app.task(shared=False, base=RedeliveryTask, name="t.dict", redelivery_policy={"max_delivery_attempts": 3})
    def t():
        pass

    policy = resolve_policy(app, "t.dict", "celery")
    assert (policy.max_delivery_attempts, policy.redelivery_delay) == (3, 9.0)


def test_explicit_default_value_at_a_higher_level_still_wins():
    app = make_app(dlq_default_policy={"redelivery_delay": 9})

    @app.task(shared=False, base=RedeliveryTask, name="t.zero", redelivery_policy=RedeliveryPolicy(redelivery_delay=0))
    def t():
        pass

    assert resolve_policy(app, "t.zero", "celery").redelivery_delay == 0.0


def test_resolution_is_cached_per_pair():
    app = make_app(dlq_queue_policies={"q.*": {"redelivery_delay": 1}})
    first = resolve_policy(app, "a.task", "q.one")
    assert resolve_policy(app, "a.task", "q.one") is first
    assert resolve_policy(app, "a.task", "q.two") is not first


def test_bad_task_level_policy_fails_at_install():
    app = make_app()

    @app.task(shared=False, base=RedeliveryTask, name="t.bad", redelivery_policy={"redelivery_multiplier": 0.1})
    def t():
        pass

    with pytest.raises(ConfigurationError, match="t.bad.*redelivery_multiplier"):
        celery_dlq.install(app)


def test_cross_level_conflict_fails_at_install_for_configured_queues():
    app = make_app(task_default_queue="jobs",
                   dlq_queue_policies={"jobs": {"dead_letter_queue_prefix": ""}})

    @app.task(shared=False, base=RedeliveryTask, name="t.loop")
    def t():
        pass

    with pytest.raises(ConfigurationError, match="t.loop.*jobs.*dead_letter_queue_prefix"):
        celery_dlq.install(app)


def test_task_cls_string_makes_every_task_a_redelivery_task():
    app = Celery("t", broker="redis://127.0.0.1:1/0", task_cls="celery_dlq:RedeliveryTask",
                 set_as_current=False)

    @app.task(shared=False, name="t.any")
    def t():
        pass

    assert isinstance(app.tasks["t.any"], RedeliveryTask)
    assert app.tasks["t.any"].acks_late is True


def test_the_breaker_merges_option_by_option_across_levels():
    app = make_app(
        dlq_default_policy={"breaker": {"release_rate": 5.0, "min_failures": 50}},
        dlq_queue_policies={"orders.#": {"breaker": {"cooldown": 3.0}}},
        dlq_task_policies={"shop.*": {"breaker": {"min_failures": 5}}},
    )

    @app.task(shared=False, base=RedeliveryTask, name="shop.pay",
              redelivery_policy=RedeliveryPolicy(breaker={"enabled": True, "window": 30}))
    def pay():
        pass

    breaker = resolve_policy(app, "shop.pay", "orders.eu").breaker
    assert breaker.opens_on_failures and breaker.window == 30.0      # the task
    assert breaker.min_failures == 5                                  # 'shop.*' beats the default
    assert breaker.cooldown == 3.0                                    # 'orders.#'
    assert breaker.release_rate == 5.0                                # the default
    assert breaker.max_release_rate == 500.0                          # built in
    assert resolve_policy(app, "misc.job", "orders.eu").breaker.enabled is False   # options alone turn nothing on
    _, origins = DLQSettings.from_conf(app.conf).explain("shop.pay", "orders.eu", {"breaker": {"enabled": "manual"}})
    assert origins["breaker.enabled"] == "task redelivery_policy"
    assert origins["breaker.min_failures"] == "dlq_task_policies['shop.*']"
    assert origins["breaker.cooldown"] == "dlq_queue_policies['orders.#']"
    assert origins["breaker.release_rate"] == "dlq_default_policy"
    assert origins["breaker.max_cooldown"] == "built-in default"
    assert "breaker" not in origins


def test_a_bad_breaker_option_names_the_setting_the_pattern_and_the_option():
    with pytest.raises(ConfigurationError, match=r"dlq_queue_policies\['orders\.#'\]: breaker\.window must be"):
        DLQSettings.from_conf(make_app(dlq_queue_policies={"orders.#": {"breaker": {"window": 0}}}).conf)
    with pytest.raises(ConfigurationError, match=r"dlq_default_policy: unknown breaker option 'breaker\.treshold'"):
        DLQSettings.from_conf(make_app(dlq_default_policy={"breaker": {"treshold": 5}}).conf)


def test_flat_breaker_names_in_the_settings_warn_and_are_nested():
    app = make_app(dlq_task_policies={"shop.*": {"breaker": True, "breaker_cooldown": 2.0}},
                   dlq_default_policy={"breaker": {"window": 9.0}})
    with pytest.warns(DeprecationWarning, match=r"dlq_task_policies\['shop\.\*'\]: the policy field 'breaker_cooldown'"):
        settings = DLQSettings.from_conf(app.conf)
    breaker = settings.policy_for("shop.pay", "celery").breaker
    assert (breaker.enabled, breaker.cooldown, breaker.window) == (True, 2.0, 9.0)
    both = make_app(dlq_default_policy={"breaker": {"cooldown": 1.0}, "breaker_cooldown": 2.0})
    with pytest.raises(ConfigurationError, match="dlq_default_policy: 'breaker_cooldown' and 'breaker' both set"):
        DLQSettings.from_conf(both.conf)


def test_dlq_fetch_notifications_has_no_effect_and_says_so():
    app = make_app(dlq_fetch_notifications="auto")
    with pytest.warns(DeprecationWarning, match="dlq_fetch_notifications has no effect.*error in the next release"):
        DLQSettings.from_conf(app.conf)
    assert "dlq_fetch_notifications" not in DEFAULTS and not hasattr(DLQSettings, "fetch_notifications")
    with pytest.warns(DeprecationWarning, match="dlq_fetch_notifications"):
        DLQSettings.from_conf(make_app(dlq_fetch_notifications="anything").conf)   # no value is checked: none counts
