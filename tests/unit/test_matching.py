"""Artemis wildcard patterns and most-specific-first ordering."""
from __future__ import annotations

import itertools

import pytest

from celery_dlq import ConfigurationError
from celery_dlq.matching import Pattern, PatternMap, merge_fields


@pytest.mark.parametrize("pattern, name, expected", [
    ("news.europe.#", "news.europe", True),
    ("news.europe.#", "news.europe.sport", True),
    ("news.europe.#", "news.europe.politics.fr", True),
    ("news.europe.#", "news.usa", False),
    ("news.*", "news.europe", True),
    ("news.*", "news.europe.sport", False),
    ("news.*", "news", False),
    ("news.*.sport", "news.europe.sport", True),
    ("news.*.sport", "news.europe.politics", False),
    ("news.*.sport", "news.sport", False),
    ("#", "anything.at.all", True),
    ("#", "x", True),
    ("#.fr", "fr", True),
    ("#.fr", "news.politics.fr", True),
    ("news.#.fr", "news.fr", True),
    ("news.#.fr", "news.a.b.fr", True),
    ("news.#.fr", "news.a.b.de", False),
    ("orders", "orders", True),
    ("orders", "orders.eu", False),
    ("*", "orders", True),
    ("*", "orders.eu", False),
])
def test_match(pattern, name, expected):
    assert Pattern.parse(pattern).matches(name) is expected


@pytest.mark.parametrize("bad", ["", "news..sport", "news.eu*", "ne#ws", ".news", 3, None])
def test_bad_patterns_are_refused(bad):
    with pytest.raises(ConfigurationError, match="dlq_queue_policies"):
        Pattern.parse(bad, "dlq_queue_policies")


def ordered(*texts):
    return [p.text for p in sorted((Pattern.parse(t) for t in texts), key=Pattern.sort_key)]


def test_exact_beats_star_beats_hash():
    assert ordered("#", "news.*", "news.europe") == ["news.europe", "news.*", "#"]
    assert ordered("news.#", "*.europe") == ["*.europe", "news.#"]


def test_longer_literal_prefix_wins_within_a_kind():
    assert ordered("*.europe.sport", "news.*.sport", "news.europe.*") == \
        ["news.europe.*", "news.*.sport", "*.europe.sport"]
    assert ordered("#", "news.#", "news.europe.#") == ["news.europe.#", "news.#", "#"]


def test_ties_are_broken_by_more_literals_then_fewer_hashes_then_text():
    # Same kind and prefix; more literal words wins.
    assert ordered("news.*.*", "news.*.sport") == ["news.*.sport", "news.*.*"]
    # Same kind, prefix and literals; fewer '#' wins.
    assert ordered("news.#.#", "news.#") == ["news.#", "news.#.#"]
    # Identical shape: the text decides, so the order never depends on dict order.
    assert ordered("b.*", "a.*") == ["a.*", "b.*"]


def test_order_is_total_and_independent_of_input_order():
    texts = ["#", "news.#", "news.*", "*.europe", "news.europe", "news.*.sport", "#.sport", "a.*", "b.*"]
    expected = ordered(*texts)
    for perm in itertools.islice(itertools.permutations(texts), 200):
        assert ordered(*perm) == expected
    assert len(set(expected)) == len(texts)


def test_pattern_map_returns_matches_most_specific_first():
    pmap = PatternMap.from_mapping(
        {"#": "all", "news.#": "news", "news.*.sport": "sport", "news.europe.sport": "exact"}, "s")
    assert pmap.matching("news.europe.sport") == ["exact", "sport", "news", "all"]
    assert pmap.matching("weather") == ["all"]


def test_pattern_map_accepts_pairs_and_names_the_pattern_in_errors():
    def convert(value, where):
        if value == "bad":
            raise ConfigurationError(f"{where}: bad value")
        return value
    assert PatternMap.from_mapping([("a.*", 1)], "s").matching("a.b") == [1]
    with pytest.raises(ConfigurationError, match=r"dlq_task_policies\['x\.#'\]: bad value"):
        PatternMap.from_mapping({"x.#": "bad"}, "dlq_task_policies", convert)
    with pytest.raises(ConfigurationError, match="dlq_task_policies"):
        PatternMap.from_mapping(42, "dlq_task_policies")


def test_merge_fields_first_layer_wins_fieldwise():
    assert merge_fields([{"a": 1}, {"a": 2, "b": 2}, {"c": 3, "b": 9}]) == {"a": 1, "b": 2, "c": 3}


def test_merge_fields_merges_a_nested_mapping_key_by_key():
    task = {"breaker": {"window": 5.0}}
    pattern = {"breaker": {"min_failures": 3, "window": 60.0}, "redelivery_delay": 1.0}
    default = {"breaker": {"enabled": True, "min_failures": 9}}
    merged = merge_fields([task, pattern, default])
    assert merged == {"breaker": {"window": 5.0, "min_failures": 3, "enabled": True}, "redelivery_delay": 1.0}
    assert task == {"breaker": {"window": 5.0}}   # the layers are not changed


def test_merge_fields_a_value_set_higher_is_not_merged_with_a_lower_mapping():
    assert merge_fields([{"breaker": True}, {"breaker": {"window": 5.0}}]) == {"breaker": True}
    assert merge_fields([{"breaker": {"window": 5.0}}, {"breaker": True}]) == {"breaker": {"window": 5.0}}
