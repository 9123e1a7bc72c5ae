"""The chord ledger (redis/chords.py and its two scripts) and the pure chord model (workflow.py, policy)."""
from __future__ import annotations

import json

import pytest

from celery_dlq import headers as H
from celery_dlq.errors import ConfigurationError
from celery_dlq.policy import RedeliveryPolicy
from celery_dlq.storage.chords import SETTLED_TTL_S, ChordLedger, chord_fields, request_fields, take_chord
from celery_dlq.storage.keys import Keys
from celery_dlq.workflow import (
    CHORD_WAIT,
    chord_rule,
    describe_failure,
    is_placeholder,
    membership,
    placeholder,
    rule_of,
    summary,
)


def member(task_id="t1", group="g1", index=3):
    return {"id": task_id, "task": "proj.flaky", "group": group, "group_index": index,
            "chord": {"task": "proj.tsum", "args": [], "kwargs": {}, "options": {}}}


@pytest.fixture
def ledger(any_redis, unique):
    return ChordLedger(any_redis, Keys(f"chords{unique}"))


def test_a_waiting_member_never_expires_and_is_counted_in_its_chord_and_dlq(ledger):
    assert ledger.hold("t1", member(), state="waiting", rule="wait", dlq="DLQ.q", now=1.0) == ("", "")
    assert ledger.state("t1") == "waiting"
    assert ledger.client.ttl(ledger.keys.chord_member("t1")) == -1
    assert ledger.waiting("g1") == 1 and ledger.waiting_in("DLQ.q") == 1


def test_a_replay_and_a_purge_settle_a_waiting_member_once(ledger):
    ledger.hold("t1", member(), state="waiting", rule="wait", dlq="DLQ.q")
    assert ledger.settle("t1", "released") == (member(), "")
    assert ledger.settle("t1", "failed", only_in="DLQ.q") is None      # the purge lost the race
    assert ledger.state("t1") == "released"
    assert ledger.waiting("g1") == 0 and ledger.waiting_in("DLQ.q") == 0
    assert 0 < ledger.client.ttl(ledger.keys.chord_member("t1")) <= SETTLED_TTL_S


def test_a_purge_of_another_dlq_settles_nothing(ledger):
    ledger.hold("t1", member(), state="waiting", rule="wait", dlq="DLQ.q")
    assert ledger.settle("t1", "failed", only_in="DLQ.other") is None
    assert ledger.state("t1") == "waiting"


def test_a_settled_member_keeps_its_state_when_a_later_copy_fails_again(ledger):
    assert ledger.hold("t1", member(), state="continued", rule="continue", dlq="DLQ.q") == ("", "")
    assert ledger.hold("t1", member(), state="failed", rule="fail", dlq="DLQ.q") == ("continued", "")
    assert ledger.state("t1") == "continued" and ledger.waiting("g1") == 0


def test_a_waiting_member_dead_lettered_again_still_waits(ledger):
    ledger.hold("t1", member(), state="waiting", rule="wait", dlq="DLQ.q")
    assert ledger.hold("t1", member(), state="waiting", rule="wait", dlq="DLQ.q") == ("waiting", "")
    assert ledger.waiting("g1") == 1


def test_chord_unlock_is_parked_while_a_member_waits_and_handed_back_by_the_last_settle(ledger):
    call = {"args": ["g1", {"task": "proj.tsum"}], "kwargs": {"interval": 1}, "queue": "q"}
    assert ledger.park_or_settled("g1", call) == {}           # nobody waits: chord_unlock runs as usual
    ledger.dying("t1", "g1")                                   # the child, raising the last failure
    assert ledger.park_or_settled("g1", call) is None
    ledger.hold("t1", member("t1"), state="waiting", rule="wait", dlq="DLQ.q")
    ledger.hold("t2", member("t2"), state="waiting", rule="wait", dlq="DLQ.q")
    assert ledger.settle("t1", "released")[1] == ""            # t2 still waits: the call stays parked
    fields, unlock = ledger.settle("t2", "failed")
    assert json.loads(unlock) == call and fields["id"] == "t2"
    assert not ledger.client.exists(ledger.keys.chord_unlock("g1"))


def test_a_fail_or_continue_hold_hands_back_the_call_its_dying_member_parked(ledger):
    call = {"args": ["g1"], "kwargs": {}, "queue": "q"}
    ledger.dying("t1", "g1")
    assert ledger.park_or_settled("g1", call) is None
    assert ledger.hold("t1", member("t1"), state="continued", rule="continue", dlq="DLQ.q") == ("", json.dumps(call))


def test_a_settled_members_later_copy_failing_again_does_not_hold_its_chord_open(ledger):
    """At least once: a duplicate copy of a member whose letter was purged fails after the purge settled its
    chord. Counted waiting again, it would park every later chord_unlock with nothing left to settle it."""
    assert ledger.dying("t1", "g1") is True
    ledger.hold("t1", member("t1"), state="waiting", rule="wait", dlq="DLQ.q")
    ledger.settle("t1", "failed")
    assert ledger.dying("t1", "g1") is False and ledger.waiting("g1") == 0
    assert ledger.park_or_settled("g1", {"args": ["g1"], "kwargs": {}, "queue": "q"}) == {}


def test_a_body_and_errbacks_carrying_bytes_dates_and_uuids_round_trip(ledger):
    """What Celery's json serializer carries (kombu's JSON) is held as it is: a body errback with bytes in
    its arguments once left the chord untold (TypeError in json.dumps)."""
    import datetime
    import uuid
    errback = {"task": "proj.echo", "args": [b"\x00msg"], "kwargs": {"at": datetime.datetime(2026, 1, 2, 3, 4)},
               "options": {"task_id": uuid.UUID(int=7)}, "immutable": True}
    fields = {**member(), "chord": {**member()["chord"], "options": {"link_error": [errback]}}}
    ledger.dying("t1", "g1")
    assert ledger.park_or_settled("g1", {"args": ["g1", fields["chord"]], "kwargs": {}, "queue": "q"}) is None
    ledger.hold("t1", fields, state="waiting", rule="wait", dlq="DLQ.q")
    assert ledger.parked_unlock("g1")["args"][1] == fields["chord"]
    assert ledger.settle("t1", "failed")[0] == fields


def test_a_settled_slot_is_read_with_the_waiting_set_that_no_longer_holds_it(ledger):
    """What a fail or continue hold, or a purge's settle, decides for the slot is recorded in the same step:
    a chord_unlock polling before the part return is made finds it (written to the backend first)."""
    from celery import states

    from celery_dlq.errors import ChordMemberDeadLettered, ChordMemberPurged
    from celery_dlq.storage.chords import slot
    call = {"args": ["g1"], "kwargs": {}, "queue": "q"}
    ledger.hold("t1", member("t1"), state="failed", rule="fail", dlq="DLQ.q",
                outcome=slot(states.FAILURE, ChordMemberDeadLettered("t1 dead-lettered")))
    ledger.hold("t2", member("t2"), state="continued", rule="continue", dlq="DLQ.q",
                outcome=slot(states.SUCCESS, {"celery_dlq_dead_lettered": True, "task_id": "t2"}))
    ledger.hold("t3", member("t3"), state="waiting", rule="wait", dlq="DLQ.q")
    ledger.hold("t4", member("t4"), state="waiting", rule="wait", dlq="DLQ.q")
    assert ledger.park_or_settled("g1", call) is None                       # t3 and t4 wait
    ledger.settle("t3", "released")                                          # Celery stored its success itself
    ledger.settle("t4", "failed", failure=lambda fields: ChordMemberPurged(f"{fields['id']} purged"))
    slots = ledger.park_or_settled("g1", call)
    assert sorted(slots) == ["t1", "t2", "t4"]
    assert slots["t2"] == (states.SUCCESS, {"celery_dlq_dead_lettered": True, "task_id": "t2"})
    for task_id, kind, text in (("t1", ChordMemberDeadLettered, "t1 dead-lettered"),
                                ("t4", ChordMemberPurged, "t4 purged")):
        state, exc = slots[task_id]
        assert state == states.FAILURE and type(exc) is kind and str(exc) == text


def test_settled_slots_are_written_only_by_a_poll_that_joins(ledger):
    """A poll whose header is not ready polls again: it writes nothing to the backend; one that joins does."""
    from types import SimpleNamespace

    from celery import states

    from celery_dlq.errors import ChordMemberDeadLettered
    from celery_dlq.storage.chords import slot
    from celery_dlq.worker.features.chords import ChordMembers
    stored: list = []
    app = SimpleNamespace(backend=SimpleNamespace(store_result=lambda *a: stored.append(a)))
    members = ChordMembers(app, ledger.client, ledger.keys)
    ledger.hold("t1", member("t1"), state="failed", rule="fail", dlq="DLQ.q",
                outcome=slot(states.FAILURE, ChordMemberDeadLettered("t1 dead-lettered")))
    request = SimpleNamespace(delivery_info={"routing_key": "q"})
    assert not members.park_unlock(request, ("g1",), {}, joining=False) and stored == []
    assert not members.park_unlock(request, ("g1",), {})
    assert [(task_id, state, str(exc)) for task_id, exc, state in stored] == \
        [("t1", states.FAILURE, "t1 dead-lettered")]


def test_a_dead_lettered_member_is_a_chord_error_as_celery_fails_group_bodies_with_it():
    from celery.exceptions import ChordError

    from celery_dlq.errors import ChordMemberDeadLettered, ChordMemberPurged, DLQError
    for kind in (ChordMemberDeadLettered, ChordMemberPurged):
        assert issubclass(kind, ChordError) and issubclass(kind, DLQError)


def test_a_chain_step_standing_for_a_chord_member_is_released_by_the_member(ledger):
    ledger.hold("step1", member("t9"), state="waiting", rule="wait", dlq="DLQ.q")
    assert ledger.release("g1", "other") == [] and ledger.state("step1") == "waiting"
    assert ledger.release("g1", "t9") == [] and ledger.state("step1") == "released"


def test_chord_fields_of_a_member_and_of_the_first_step_of_a_chain_in_a_header():
    assert chord_fields(member()) == {**member(), "root_id": None, "parent_id": None}
    assert chord_fields({"id": "s1", "chain": None}) is None
    step = {"id": "s1", "root_id": "r", "chain": [
        {"task": "proj.last", "options": {"task_id": "t9", "group_id": "g1", "group_index": 2,
                                          "chord": {"task": "proj.tsum"}}},
        {"task": "proj.middle", "options": {"task_id": "t8"}}]}
    assert chord_fields(step) == {"id": "t9", "task": "proj.last", "group": "g1", "group_index": 2,
                                  "chord": {"task": "proj.tsum"}, "root_id": "r", "parent_id": "s1"}


def test_taking_the_chord_off_a_context_keeps_what_it_was():
    from celery.app.task import Context

    context = Context({"id": "s1", "chain": [{"task": "proj.last", "options": {
        "task_id": "t9", "group_id": "g1", "chord": {"task": "proj.tsum"}}}]})
    before = take_chord(context)
    assert "chord" not in context.chain[0]["options"]
    assert chord_fields(before)["id"] == "t9"
    assert take_chord(Context({"id": "x"})) is None


def test_request_fields_read_a_context_or_a_mapping():
    class Ctx:
        id, task, group, group_index, chord, root_id, parent_id = "t", "n", "g", 0, {"task": "b"}, "r", "p"
    assert request_fields(Ctx())["chord"] == {"task": "b"}
    assert request_fields({"id": "t"})["group"] is None


def test_the_chord_rule_is_a_validated_policy_field_defaulting_to_wait():
    assert RedeliveryPolicy().chord_rule == CHORD_WAIT
    assert RedeliveryPolicy.from_fields({"chord_rule": "continue"}).chord_rule == "continue"
    with pytest.raises(ConfigurationError, match="chord_rule must be 'wait' or 'fail' or 'continue'"):
        RedeliveryPolicy.from_fields({"chord_rule": "ignore"}, "dlq_task_policies['proj.*']")


def test_a_call_sets_its_own_rule_with_a_header():
    assert chord_rule("fail") == {H.CHORD_RULE: "fail"}
    with pytest.raises(ValueError):
        chord_rule("later")
    assert rule_of({H.CHORD_RULE: "continue"}, "wait") == "continue"
    assert rule_of({H.CHORD_RULE: "bogus"}, "fail") == "fail"
    assert rule_of(None, "wait") == "wait"


def test_the_placeholder_and_the_failure_name_the_dlq_and_the_letter():
    value = placeholder("t1", "proj.flaky", "DLQ.q", {"type": "ValueError", "message": "boom"})
    assert is_placeholder(value) and not is_placeholder({"task_id": "t1"}) and not is_placeholder(3)
    assert value["exception"] == "ValueError: boom"
    text = describe_failure("t1", "proj.flaky", "DLQ.q", 3, {"type": "ValueError", "message": "boom"})
    assert text == "chord member proj.flaky[t1] dead-lettered to DLQ.q (letter t1) after delivery 3: ValueError: boom"
    assert "dropped" in describe_failure("t1", None, None, 1, {})


def test_membership_of_a_chord_member_and_of_a_chain_step():
    info = membership({"group": "g", "group_index": 3}, {"chord": {"task": "proj.tsum"}})
    assert info == {"chord": {"group": "g", "member": 4, "body": "proj.tsum"}}
    assert summary(info) == "member 4 of chord g; body proj.tsum"
    chain = membership({}, {"chain": [{"task": "proj.last"}, {"task": "proj.record"}]})
    assert chain == {"chain": {"remaining": 2, "next": "proj.record"}}
    assert summary(chain) == "chain: next proj.record (2 step(s) left)"
    assert membership({}, None) is None and summary(None) == ""


class _Down:
    """A Redis client whose every command fails as a lost connection does."""

    def __getattr__(self, name):
        def fail(*args, **kwargs):
            from redis.exceptions import ConnectionError
            raise ConnectionError("redis is down")
        return fail


def test_redis_down_never_turns_a_members_outcome_into_another():
    from celery import Celery
    from celery.app.task import Context

    from celery_dlq.worker.features.chords import ChordMembers

    members = ChordMembers(Celery("t", set_as_current=False), _Down(), Keys("down"))
    failing = Context({"id": "t1", "group": "g1", "chord": {"task": "proj.tsum"}})
    members.withhold(failing)                   # the task's own exception is what the child raises
    assert failing.chord is None                # and Celery still does not tell the chord
    replayed = Context({"id": "t1", "group": "g1", "chord": {"task": "proj.tsum"}, H.REPLAY_COUNT: 1})
    members.before_success(replayed)            # a success stays a success: the chord is told
    assert replayed.chord == {"task": "proj.tsum"}
    members.after_success(replayed)
