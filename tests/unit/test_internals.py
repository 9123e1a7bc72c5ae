"""The seam for library internals: every assumption holds on the installed versions, and a broken one is named."""
from __future__ import annotations

import inspect
import logging
from pathlib import Path

import pytest
from kombu.transport import redis as kombu_redis

from celery_dlq.internals import base
from celery_dlq.internals.base import ATTRIBUTE, INSTANCE_ATTRIBUTE, METHOD, Feature, Internal
from celery_dlq.internals.billiard_einfo import formats_identically
from celery_dlq.internals.features import FEATURES, OPTIONAL, every_internal
from celery_dlq.internals.kombu_redis import FETCH, flush_reauth
from celery_dlq.storage.keys import QueueLists
from tests.internals_hiding import hide, key

ALL = every_internal()


@pytest.fixture(autouse=True)
def fresh_reports():
    base.forget()
    yield
    base.forget()


@pytest.mark.parametrize("feature,internal", ALL, ids=[i.path for _, i in ALL])
def test_every_internal_holds_on_the_installed_versions(feature, internal):
    assert internal.problem() is None, f"{feature.name}: {internal.problem()} (used for: {internal.used_for})"


@pytest.mark.parametrize("feature", FEATURES, ids=[f.name for f in FEATURES])
def test_every_feature_is_usable_here(feature):
    assert feature.problems() == []


def test_the_compact_traceback_formats_as_billiards_own():
    assert formats_identically() is None


def test_optional_internals_are_either_there_with_their_signature_or_missing():
    for internal in OPTIONAL:
        problem = internal.problem()
        assert problem is None or problem.endswith("is missing"), problem


def test_flush_reauth_calls_kombus_method_where_it_exists():
    calls = []

    class Channel:
        def _flush_brpop_reauth(self):
            calls.append(1)

    flush_reauth(Channel())
    flush_reauth(object())       # kombu < 5.7: nothing to flush, no error
    assert calls == [1]


@pytest.mark.parametrize("priority", [0, 1, 3, 4, 6, 9])
def test_our_priority_list_names_are_kombus(priority):
    channel = object.__new__(kombu_redis.Channel)    # only class attributes are read
    assert QueueLists().key("orders", priority) == kombu_redis.Channel._q_for_pri(channel, "orders", priority)


def test_kombus_ack_record_names_are_the_ones_our_scripts_take():
    assert (kombu_redis.Channel.unacked_key, kombu_redis.Channel.unacked_index_key) == ("unacked", "unacked_index")


class Toy:
    def __init__(self):
        self.held = {}

    def fetch(self, timeout=None):
        return timeout


class Renamed:
    def __init__(self):
        self.kept = {}

    def fetch(self, timeout, deadline):
        return timeout, deadline


@pytest.mark.parametrize("internal,problem", [
    (Internal(f"{__name__}:Toy", "fetch", METHOD, "", ("self", "timeout")), None),
    (Internal(f"{__name__}:Toy", "gone", METHOD, "", ("self",)), "tests.unit.test_internals.Toy.gone is missing"),
    (Internal(f"{__name__}:Renamed", "fetch", METHOD, "", ("self", "timeout")),
     "tests.unit.test_internals.Renamed.fetch takes a new required parameter 'deadline'"),
    (Internal(f"{__name__}:Toy", "fetch", METHOD, "", ("self", "wait")),
     "tests.unit.test_internals.Toy.fetch takes (self, timeout), expected (self, wait)"),
    (Internal(f"{__name__}:Toy", "held", INSTANCE_ATTRIBUTE, ""), None),
    (Internal(f"{__name__}:Renamed", "held", INSTANCE_ATTRIBUTE, ""),
     "tests.unit.test_internals.Renamed.held is no longer assigned in Renamed.__init__"),
    (Internal(f"{__name__}:Gone", "x", ATTRIBUTE, ""), "tests.unit.test_internals:Gone is gone"),
])
def test_a_broken_assumption_is_named(internal, problem):
    found = internal.problem()
    assert found == problem or (problem is not None and found.startswith(problem)), found


def test_a_feature_with_a_moved_internal_warns_once_naming_it(caplog, monkeypatch):
    internal = hide(key(FETCH.internals[0]), monkeypatch)
    with caplog.at_level(logging.WARNING, logger="celery_dlq.internals"):
        assert base.usable(FETCH) is False
        assert base.usable(FETCH) is False
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and internal.path in warnings[0] and "kombu's own BRPOP" in warnings[0]


@pytest.mark.parametrize("feature,internal", ALL, ids=[i.path for _, i in ALL])
def test_hiding_any_internal_switches_off_its_feature_and_only_it(feature, internal, monkeypatch):
    hide(key(internal), monkeypatch)
    assert [f.name for f in FEATURES if not base.usable(f)] == [feature.name]


def test_a_behaviour_check_that_crashes_counts_as_failed():
    def crashes():
        raise RuntimeError("boom")

    feature = Feature("toy", "toy", "none", (), behaves=crashes)
    assert feature.problems() == ["toy: its behaviour check raised RuntimeError: boom"]


def test_the_seam_is_the_only_module_that_names_private_attributes_of_these_libraries():
    import celery_dlq.worker.park as park
    import celery_dlq.worker.poolfix as poolfix
    import celery_dlq.worker.request as request
    import celery_dlq.worker.runtime as runtime
    import celery_dlq.worker.strategy as strategy
    import celery_dlq.worker.transport as transport

    private = ("._message", "._request_dict", "._context", "._already_", "._raw", "._delivered", "._queue_cycle",
               "._deliver(", "._q_for_pri", "._in_poll", "._flush_brpop_reauth", "._fileno_to_", "._success_was",
               "einfo._")
    for module in (park, poolfix, request, runtime, strategy, transport):
        source = inspect.getsource(module)
        assert [name for name in private if name in source] == [], module.__name__


def test_docs_internals_names_every_internal():
    text = (Path(__file__).resolve().parents[2] / "docs" / "internals.md").read_text()
    assert [i.path for _, i in ALL if f"`{i.path}`" not in text] == []


NO_SOURCE: dict = {}
exec("class Compiled:\n    def __init__(self):\n        self.held = {}\n", NO_SOURCE)
Compiled = NO_SOURCE["Compiled"]


def test_an_instance_attribute_without_readable_source_is_taken_to_hold():
    assert Internal(f"{__name__}:Compiled", "held", INSTANCE_ATTRIBUTE, "").problem() is None
