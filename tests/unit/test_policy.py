"""RedeliveryPolicy: validation, the Artemis worked examples, and delay properties."""
from __future__ import annotations

import random
from dataclasses import fields

import pytest
from celery.exceptions import ImproperlyConfigured
from hypothesis import given
from hypothesis import strategies as st

from celery_dlq import ConfigurationError, RedeliveryPolicy
from celery_dlq import BreakerPolicy
from celery_dlq.policy import FLAT_BREAKER_NAMES, compute_delay, validate_fields


class ScriptedRandom(random.Random):
    """Returns the given draws in order; fails the test if more are asked for."""

    def __new__(cls, draws):   # Python 3.10's Random.__new__ would seed itself with ``draws``
        return super().__new__(cls)

    def __init__(self, draws):
        super().__init__(0)
        self.draws = list(draws)

    def random(self):
        assert self.draws, "more random numbers drawn than scripted"
        return self.draws.pop(0)


class NoRandom(random.Random):
    def random(self):
        raise AssertionError("no random number may be drawn")


NEG, POS = 0.1, 0.9  # the first draw picks the sign: < 0.5 is minus


def test_artemis_backoff_example_with_cap():
    policy = RedeliveryPolicy(redelivery_delay=5, redelivery_multiplier=2, max_redelivery_delay=15)
    assert [policy.delay_after(n, NoRandom()) for n in (1, 2, 3, 4)] == [5.0, 10.0, 15.0, 15.0]


def test_artemis_collision_avoidance_example():
    policy = RedeliveryPolicy(redelivery_delay=1, redelivery_multiplier=1,
                              max_redelivery_delay=15, redelivery_collision_avoidance_factor=0.5)
    rng = ScriptedRandom([NEG, 0.25, POS, 0.75, NEG, 0.05])
    assert [policy.delay_after(n, rng) for n in (1, 2, 3)] == [0.875, 1.375, 0.975]
    assert rng.draws == []


def test_multiplier_one_is_constant():
    policy = RedeliveryPolicy(redelivery_delay=0.3)
    assert {policy.delay_after(n) for n in range(1, 50)} == {0.3}


def test_max_redelivery_delay_defaults_to_ten_times_delay():
    policy = RedeliveryPolicy(redelivery_delay=2, redelivery_multiplier=3)
    assert policy.max_redelivery_delay == 20.0
    assert policy.delay_after(2) == 6.0
    assert policy.delay_after(3) == 18.0
    assert policy.delay_after(4) == 20.0


def test_cap_applies_after_jitter():
    policy = RedeliveryPolicy(redelivery_delay=10, max_redelivery_delay=10,
                              redelivery_collision_avoidance_factor=1.0)
    assert policy.delay_after(1, ScriptedRandom([POS, 0.99])) == 10.0
    assert policy.delay_after(1, ScriptedRandom([NEG, 0.5])) == 5.0


def test_huge_attempt_numbers_do_not_overflow():
    policy = RedeliveryPolicy(redelivery_delay=1, redelivery_multiplier=10, max_redelivery_delay=3600)
    assert policy.delay_after(10_000) == 3600.0


def test_factor_zero_draws_no_random_numbers():
    policy = RedeliveryPolicy(redelivery_delay=1, redelivery_multiplier=2)
    assert policy.delay_after(3, NoRandom()) == 4.0


def test_zero_delay_draws_nothing_and_is_zero():
    policy = RedeliveryPolicy(redelivery_collision_avoidance_factor=0.5)
    assert policy.delay_after(1, NoRandom()) == 0.0


def test_n_must_count_from_one():
    with pytest.raises(ValueError, match="from 1"):
        RedeliveryPolicy().delay_after(0)


def test_defaults():
    policy = RedeliveryPolicy()
    assert policy.redelivery_delay == 0.0
    assert policy.redelivery_multiplier == 1.0
    assert policy.max_redelivery_delay == 0.0
    assert policy.max_delivery_attempts == 10
    assert policy.dead_letter is True
    assert policy.dead_letter_queue("orders") == "DLQ.orders"
    assert policy.retry_on == (Exception,)
    assert policy.dead_letter_on == ()
    assert policy.persist_delivery_count_before_delivery is True
    assert policy.explicit_fields == frozenset()


@pytest.mark.parametrize("field, value", [
    ("redelivery_delay", -1),
    ("redelivery_delay", float("nan")),
    ("redelivery_delay", float("inf")),
    ("redelivery_delay", "5"),
    ("redelivery_delay", True),
    ("redelivery_multiplier", 0.99),
    ("redelivery_multiplier", float("inf")),
    ("max_redelivery_delay", -0.1),
    ("redelivery_collision_avoidance_factor", -0.1),
    ("redelivery_collision_avoidance_factor", 1.01),
    ("max_delivery_attempts", 0),
    ("max_delivery_attempts", -2),
    ("max_delivery_attempts", 2.5),
    ("max_delivery_attempts", True),
    ("dead_letter", ""),
    ("dead_letter", 1),
    ("dead_letter_queue_prefix", None),
    ("dead_letter_queue_suffix", 3),
    ("retry_on", ValueError("not a type")),
    ("retry_on", int),
    ("retry_on", "no.such.module:Error"),
    ("dead_letter_on", [KeyError, "x"]),
    ("persist_delivery_count_before_delivery", "yes"),
    ("dead_letter_ttl", -5),
    ("dead_letter_max_length", 0),
])
def test_each_field_is_validated_and_named(field, value):
    with pytest.raises(ConfigurationError) as info:
        RedeliveryPolicy(**{field: value})
    message = str(info.value)
    assert field in message
    shown = value[-1] if isinstance(value, list) else value
    assert repr(shown) in message
    assert isinstance(info.value, ImproperlyConfigured)


@pytest.mark.parametrize("field, value, expected", [
    ("max_delivery_attempts", -1, -1),
    ("max_delivery_attempts", 1, 1),
    ("dead_letter", False, False),
    ("dead_letter", "failed-payments", "failed-payments"),
    ("retry_on", KeyError, (KeyError,)),
    ("retry_on", ["builtins.KeyError", OSError], (KeyError, OSError)),
    ("redelivery_collision_avoidance_factor", 1, 1.0),
])
def test_valid_values_are_normalized(field, value, expected):
    assert getattr(RedeliveryPolicy(**{field: value}), field) == expected


def test_unknown_field_is_refused_with_a_suggestion():
    with pytest.raises(ConfigurationError, match="redelivery_delai.*did you mean 'redelivery_delay'"):
        RedeliveryPolicy(redelivery_delai=1)


def test_empty_dlq_prefix_and_suffix_would_loop():
    with pytest.raises(ConfigurationError, match="dead_letter_queue_prefix"):
        RedeliveryPolicy(dead_letter_queue_prefix="")
    assert RedeliveryPolicy(dead_letter_queue_prefix="", dead_letter_queue_suffix=".dead") \
        .dead_letter_queue("orders") == "orders.dead"
    assert RedeliveryPolicy(dead_letter_queue_prefix="", dead_letter=False).dead_letter_queue("x") is None


def test_unlimited_attempts():
    policy = RedeliveryPolicy(max_delivery_attempts=-1)
    assert policy.attempts_left(10**9)


def test_attempts_left_counts_the_first_delivery():
    policy = RedeliveryPolicy(max_delivery_attempts=3)
    assert [policy.attempts_left(n) for n in (1, 2, 3)] == [True, True, False]


def test_dead_letter_on_wins_over_retry_on():
    policy = RedeliveryPolicy(retry_on=(LookupError,), dead_letter_on=(KeyError,))
    assert policy.is_retryable(IndexError())
    assert not policy.is_retryable(KeyError())
    assert not policy.is_retryable(ValueError())


def test_dead_letter_to_a_named_queue():
    assert RedeliveryPolicy(dead_letter="graveyard").dead_letter_queue("orders") == "graveyard"


def test_explicit_fields_are_remembered():
    policy = RedeliveryPolicy(redelivery_delay=0.0, max_delivery_attempts=3)
    assert policy.explicit_fields == {"redelivery_delay", "max_delivery_attempts"}
    assert policy.as_fields() == {"redelivery_delay": 0.0, "max_delivery_attempts": 3}


def test_policy_is_frozen():
    with pytest.raises(AttributeError):
        RedeliveryPolicy().redelivery_delay = 3  # type: ignore[misc]


# -- the breaker: one nested field ------------------------------------------

def test_the_breaker_is_one_nested_field_off_by_default():
    policy = RedeliveryPolicy()
    assert policy.breaker == BreakerPolicy() and policy.breaker.enabled is False
    assert not policy.breaker.opens_on_failures
    assert (policy.breaker.window, policy.breaker.min_failures, policy.breaker.failure_ratio) == (60.0, 20, 0.5)
    assert (policy.breaker.cooldown, policy.breaker.cooldown_multiplier, policy.breaker.max_cooldown) \
        == (10.0, 2.0, 300.0)
    assert (policy.breaker.release_rate, policy.breaker.max_release_rate, policy.breaker.auto_redrive) \
        == (10.0, 500.0, False)


def test_the_breaker_is_given_as_a_mapping_and_remembers_the_options_set():
    policy = RedeliveryPolicy(breaker={"enabled": True, "min_failures": 5, "window": 30})
    assert policy.breaker.opens_on_failures and policy.breaker.min_failures == 5 and policy.breaker.window == 30.0
    assert policy.breaker.cooldown == 10.0                         # an option left out keeps its default
    assert policy.breaker.explicit_fields == {"enabled", "min_failures", "window"}
    assert policy.as_fields() == {"breaker": {"enabled": True, "min_failures": 5, "window": 30.0}}
    assert RedeliveryPolicy(breaker=BreakerPolicy(cooldown=3)).breaker.as_fields() == {"cooldown": 3.0}


@pytest.mark.parametrize("short", [True, "manual", False])
def test_true_manual_or_false_is_short_for_enabled(short):
    policy = RedeliveryPolicy(breaker=short)
    assert policy.breaker.enabled == short and policy.breaker.as_fields() == {"enabled": short}
    assert policy.breaker.opens_on_failures is (short is True)
    assert validate_fields({"breaker": short}, "here") == {"breaker": {"enabled": short}}


@pytest.mark.parametrize("option, value", [
    ("enabled", "yes"), ("enabled", 1),
    ("window", 0), ("window", float("inf")),
    ("min_failures", 0), ("min_failures", 2.5), ("min_failures", True),
    ("failure_ratio", 0.0), ("failure_ratio", 1.5),
    ("cooldown", -1),
    ("cooldown_multiplier", 0.5),
    ("max_cooldown", 0),
    ("release_rate", 0),
    ("max_release_rate", "fast"),
    ("auto_redrive", "yes"),
])
def test_each_breaker_option_is_validated_and_named(option, value):
    for build in (lambda: RedeliveryPolicy(breaker={option: value}), lambda: BreakerPolicy(**{option: value})):
        with pytest.raises(ConfigurationError) as info:
            build()
        assert f"breaker.{option}" in str(info.value) and repr(value) in str(info.value)
    with pytest.raises(ConfigurationError, match=rf"dlq_task_policies\['shop\.\*'\]: breaker\.{option} "):
        validate_fields({"breaker": {option: value}}, "dlq_task_policies['shop.*']")


def test_an_unknown_breaker_option_is_refused_with_a_suggestion():
    with pytest.raises(ConfigurationError, match=r"unknown breaker option 'breaker\.treshold'"):
        RedeliveryPolicy(breaker={"treshold": 5})
    with pytest.raises(ConfigurationError, match=r"'breaker\.min_failure' \(did you mean 'min_failures'\?\)"):
        validate_fields({"breaker": {"min_failure": 5}}, "dlq_default_policy")
    with pytest.raises(ConfigurationError, match="unknown breaker option 'windw'.*did you mean 'window'"):
        BreakerPolicy(windw=1)   # type: ignore[call-arg]
    with pytest.raises(ConfigurationError, match="breaker must be a mapping of breaker options"):
        RedeliveryPolicy(breaker=5)   # type: ignore[arg-type]


@pytest.mark.parametrize("flat, option, value", [
    ("breaker_window", "window", 30.0),
    ("breaker_min_failures", "min_failures", 5),
    ("breaker_failure_ratio", "failure_ratio", 0.25),
    ("breaker_cooldown", "cooldown", 3.0),
    ("breaker_cooldown_multiplier", "cooldown_multiplier", 1.5),
    ("breaker_max_cooldown", "max_cooldown", 90.0),
    ("breaker_release_rate", "release_rate", 4.0),
    ("breaker_max_release_rate", "max_release_rate", 40.0),
    ("auto_redrive", "auto_redrive", True),
])
def test_each_flat_breaker_name_still_works_with_a_deprecation_warning_naming_the_new_spelling(flat, option, value):
    assert FLAT_BREAKER_NAMES[flat] == option
    with pytest.warns(DeprecationWarning, match=rf"'{flat}' is deprecated.*'breaker': {{'{option}': {value!r}}}"):
        policy = RedeliveryPolicy(breaker=True, **{flat: value})
    assert policy.breaker.as_fields() == {"enabled": True, option: value}
    assert getattr(policy.breaker, option) == value
    with pytest.warns(DeprecationWarning, match=rf"dlq_default_policy: the policy field '{flat}'"):
        fields = validate_fields({flat: value}, "dlq_default_policy")
    assert fields == {"breaker": {option: value}}
    with pytest.warns(DeprecationWarning, match=rf"policy\.breaker\.{option}"):
        assert getattr(policy, flat) == value     # reading the flat attribute, likewise for one release


def test_the_flat_list_covers_every_option_but_enabled():
    assert set(FLAT_BREAKER_NAMES.values()) | {"enabled"} == {f.name for f in fields(BreakerPolicy) if f.init}
    with pytest.warns(DeprecationWarning, match=r"policy\.breaker\.opens_on_failures"):
        assert RedeliveryPolicy(breaker=True).breaker_counts


@pytest.mark.parametrize("nested", [{"window": 5}, BreakerPolicy(window=5)])
def test_setting_one_option_both_ways_is_an_error(nested):
    with pytest.raises(ConfigurationError, match=r"'breaker_window' and 'breaker' both set breaker\.window"):
        RedeliveryPolicy(breaker=nested, breaker_window=6)
    with pytest.raises(ConfigurationError, match=r"dlq_default_policy: 'breaker_window' and 'breaker'"):
        validate_fields({"breaker": nested, "breaker_window": 5}, "dlq_default_policy")


def test_unknown_attributes_still_raise_attribute_error():
    with pytest.raises(AttributeError, match="breaker_windw"):
        RedeliveryPolicy().breaker_windw   # noqa: B018


delays = st.floats(min_value=0, max_value=1e6, allow_nan=False)
multipliers = st.floats(min_value=1, max_value=100, allow_nan=False)
factors = st.floats(min_value=0, max_value=1)


@given(delay=delays, multiplier=multipliers, cap=delays, factor=factors,
       n=st.integers(min_value=1, max_value=2000), seed=st.integers())
def test_delay_is_never_negative_nor_above_the_cap(delay, multiplier, cap, factor, n, seed):
    value = compute_delay(n, delay=delay, multiplier=multiplier, cap=cap, factor=factor,
                          rng=random.Random(seed))
    assert 0.0 <= value <= cap


@given(delay=st.floats(min_value=0, max_value=1e3), multiplier=st.floats(min_value=1, max_value=4),
       factor=factors, n=st.integers(min_value=1, max_value=30), seed=st.integers())
def test_jitter_stays_within_factor_of_base_before_the_cap(delay, multiplier, factor, n, seed):
    base = delay * multiplier ** (n - 1)
    value = compute_delay(n, delay=delay, multiplier=multiplier, cap=float("inf"), factor=factor,
                          rng=random.Random(seed))
    tolerance = 1e-9 * max(1.0, base)
    assert base * (1 - factor) - tolerance <= value <= base * (1 + factor) + tolerance
