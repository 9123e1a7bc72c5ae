"""The seam for library internals: every assumption holds on the installed versions, and a broken one is named."""
from __future__ import annotations

import inspect
import logging
import os
import types
from pathlib import Path

import pytest
from kombu.transport import redis as kombu_redis

from celery_dlq.internals import base
from celery_dlq.internals.base import ATTRIBUTE, INSTANCE_ATTRIBUTE, METHOD, Feature, Internal
from celery_dlq.internals.billiard_einfo import formats_identically
from celery_dlq.internals.celery_worker import half_done_io
from celery_dlq.internals.features import FEATURES, OPTIONAL, every_internal
from celery_dlq.internals.kombu_redis import (
    FETCH,
    FETCH_HEALTH,
    bounded_wait,
    existing_qos,
    flush_reauth,
    forget_settled,
    held_tags,
    hold_in_memory,
    set_in_poll,
    unsettled_tags,
)
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
    if feature.predates():   # a newer release's (fetch health: kombu >= 5.7): missing here, as it should be
        assert internal.missing()
        return
    assert internal.problem() is None, f"{feature.name}: {internal.problem()} (used for: {internal.used_for})"


@pytest.mark.parametrize("feature", FEATURES, ids=[f.name for f in FEATURES])
def test_every_feature_is_usable_here(feature):
    assert feature.problems() == [] or feature.predates()


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
    newer = {f.name for f in FEATURES if f.predates()}   # off already: a newer release's
    hide(key(internal), monkeypatch)
    off = [f.name for f in FEATURES if not base.usable(f) and f.name not in newer]
    assert off == ([] if feature.name in newer else [feature.name])


def test_a_behaviour_check_that_crashes_counts_as_failed():
    def crashes():
        raise RuntimeError("boom")

    feature = Feature("toy", "toy", "none", (), behaves=crashes)
    assert feature.problems() == ["toy: its behaviour check raised RuntimeError: boom"]


def test_the_seam_is_the_only_module_that_names_private_attributes_of_these_libraries():
    import celery_dlq.worker.leader.inflight as inflight
    import celery_dlq.worker.park.parking as park
    import celery_dlq.worker.run.poolfix as poolfix
    import celery_dlq.worker.run.request as request
    import celery_dlq.worker.runtime as runtime
    import celery_dlq.worker.run.strategy as strategy
    import celery_dlq.worker.fetch.transport as transport

    private = ("._message", "._request_dict", "._context", "._already_", "._raw", "._delivered", "._queue_cycle",
               "._deliver(", "._q_for_pri", "._in_poll", "._flush_brpop_reauth", "._fileno_to_", "._success_was",
               "einfo._", "._brpop_sent_at", "._qos", "virtual.QoS", ".reset =", ".register_with_event_loop =",
               ".readers", ".writers")
    for module in (inflight, park, poolfix, request, runtime, strategy, transport):
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


class HealthChannel:
    """The attributes of a kombu Redis channel the fetch health functions read."""

    brpop_timeout, health_check_interval = 1, 3
    _in_poll = None
    _brpop_sent_at = None


def test_kombus_health_check_of_a_blocked_fetch_behaves_as_the_bound_assumes():
    problem = FETCH_HEALTH.problems()
    if FETCH_HEALTH.predates():       # kombu < 5.7: no check, nothing stamped, no bound
        assert not hasattr(kombu_redis.MultiChannelPoller, "maybe_check_brpop_health")
        assert bounded_wait(HealthChannel(), 60.0) == 60.0
        return
    assert problem == []


def test_a_fetch_is_stamped_where_kombu_checks_it_and_idle_again_is_not(monkeypatch):
    monkeypatch.setattr(base, "_reported", {FETCH_HEALTH.name: []})   # kombu >= 5.7 behaviour, on any kombu
    channel, connection = HealthChannel(), object()
    set_in_poll(channel, connection)
    assert channel._in_poll is connection and channel._brpop_sent_at is not None
    stamp = channel._brpop_sent_at
    set_in_poll(channel, None)
    assert channel._in_poll is None and channel._brpop_sent_at == stamp


def test_without_the_health_feature_a_fetch_is_not_stamped(monkeypatch):
    monkeypatch.setattr(base, "_reported", {FETCH_HEALTH.name: ["moved"]})
    channel = HealthChannel()
    set_in_poll(channel, object())
    assert channel._brpop_sent_at is None


@pytest.mark.parametrize("interval,timeout,wait,expected", [
    (3, 1, 10.0, 3.0),       # window 4 s: ends a second before it
    (3, 1, 2.5, 2.5),        # below: as configured
    (25, 1, 30.0, 25.0),     # kombu's default window, 26 s
    (1, 0.5, 5.0, 0.75),     # a window of 1.5 s: half of it
    (0, 1, 30.0, 30.0),      # health_check_interval 0: kombu checks nothing
])
def test_the_fallback_wait_ends_before_kombus_health_check(monkeypatch, caplog, interval, timeout, wait, expected):
    monkeypatch.setattr(base, "_reported", {FETCH_HEALTH.name: []})
    channel = HealthChannel()
    channel.health_check_interval, channel.brpop_timeout = interval, timeout
    with caplog.at_level(logging.WARNING, logger="celery_dlq.internals"):
        assert bounded_wait(channel, wait) == expected
        bounded_wait(channel, wait)
    assert len(caplog.records) == (1 if expected < wait else 0)


def test_without_the_health_feature_the_wait_is_as_configured(monkeypatch):
    monkeypatch.setattr(base, "_reported", {FETCH_HEALTH.name: ["moved"]})
    assert bounded_wait(HealthChannel(), 30.0) == 30.0


def test_a_feature_of_a_newer_release_is_off_without_a_warning_only_when_all_of_it_is_missing(caplog):
    newer = Feature("newer", "a newer thing", "the old way", (
        Internal(f"{__name__}:Toy", "gone", METHOD, "", ("self",)),
        Internal(f"{__name__}:Gone", "x", ATTRIBUTE, "")), since="toy 2.0")
    half = Feature("half", "a half thing", "the old way", (
        Internal(f"{__name__}:Toy", "fetch", METHOD, "", ("self", "timeout")),
        Internal(f"{__name__}:Toy", "gone", METHOD, "", ("self",))), since="toy 2.0")
    with caplog.at_level(logging.WARNING, logger="celery_dlq.internals"):
        assert base.usable(newer) is False
        assert base.usable(half) is False
    assert [r.getMessage() for r in caplog.records if "a newer thing" in r.getMessage()] == []
    assert len([r for r in caplog.records if "a half thing" in r.getMessage()]) == 1


def test_a_half_done_pipe_read_is_a_generator_entry_of_the_hubs_table():
    from kombu.asynchronous import Hub

    def reading():
        yield

    hub, generator = Hub(), reading()
    r, w = os.pipe()
    try:
        hub.add_reader(r, generator)
        hub.add_writer(w, print)
        assert half_done_io(hub, {r, w}) == {r: (generator, ())}
        assert half_done_io(hub, {r, w}, writers=True) == {}
        assert half_done_io(hub, {w}) == {}
    finally:
        hub.close()
        os.close(r)
        os.close(w)


def test_our_qos_hold_and_settle_skip_kombus_unacked_records():
    from kombu.transport.virtual.base import QoS as VirtualQoS

    class Recording(kombu_redis.QoS):
        def __init__(self):
            VirtualQoS.__init__(self, channel=types.SimpleNamespace(do_restore=False))   # nothing at exit

        def _remove_from_indices(self, *args, **kwargs):
            raise AssertionError("kombu's unacked records are not touched")

    qos = Recording()
    hold_in_memory(qos, "message", "tag")
    assert held_tags(qos) == ["tag"] and unsettled_tags(qos) == {"tag"}
    forget_settled(qos, "tag")
    assert unsettled_tags(qos) == set()
    assert unsettled_tags(None) == set() and existing_qos(object()) is None
