"""What ``celery dlq show`` adds to a letter's workflow from the result backend (celery_dlq/ops/workflows.py)."""
from __future__ import annotations

import json

import fakeredis
import pytest
from celery import Celery

from celery_dlq.ops.workflows import COUNT_AT_MOST, describe, steps_before
from celery_dlq.storage.chords import ChordLedger
from celery_dlq.storage.keys import Keys
from celery_dlq.workflow import summary


class Results:
    """A result backend that knows some tasks' metas (every other task PENDING, as Celery says of unknown ids)."""

    def __init__(self, metas: dict[str, dict]):
        self.metas = metas
        self.reads = 0

    def get_task_meta(self, task_id: str) -> dict:
        self.reads += 1
        return self.metas.get(task_id, {"status": "PENDING"})


def test_the_summary_says_the_chords_size_and_progress_and_the_chain_steps_number():
    chord = {"group": "66d7", "member": 4, "size": 4, "done": 3, "body": "tsum", "state": "waiting", "waiting": 1}
    assert summary({"chord": chord}) == ("member 4 of 4 of chord 66d7; 3 done; body tsum; the chord waits for "
                                         "this letter's replay (1 member(s) in DLQs)")
    assert summary({"chain": {"remaining": 1, "next": "record", "step": 2, "steps": 3, "exact": True}}) == \
        "step 2 of 3 of a chain; next record"
    assert summary({"chain": {"remaining": 1, "next": "record", "step": 3, "steps": 4, "exact": False}}) == \
        "step at least 3 of at least 4 of a chain; next record"
    assert summary({"chord": dict(chord, size=None, done=None, state=None)}) == "member 4 of chord 66d7; body tsum"


def test_a_chain_steps_number_is_counted_through_its_parents_results():
    results = Results({"b": {"status": "SUCCESS", "parent_id": "a"}, "a": {"status": "SUCCESS"}})
    assert steps_before(results, "b") == (2, True)
    assert steps_before(results, None) == (0, True)
    assert steps_before(Results({"b": {"status": "SUCCESS", "parent_id": "gone"}}), "b") == (2, False)


def test_a_chord_on_a_polling_backend_counts_the_succeeded_members_of_its_parked_chord_unlock(tmp_path):
    client, keys = fakeredis.FakeRedis(), Keys("p")
    ledger = ChordLedger(client, keys)
    app = Celery("t", backend=f"db+sqlite:///{tmp_path}/results.sqlite", set_as_current=False)
    backend = app.backend
    backend.store_result("m1", 1, "SUCCESS")
    backend.store_result("m2", None, "FAILURE")
    header = [[["m1", None], None], [["m2", None], None], [["m3", None], None]]
    client.set(keys.chord_unlock("g"), json.dumps({"args": ["g"], "kwargs": {"result": header}}))
    workflow = {"chord": {"group": "g", "member": 3, "body": "tsum"}}
    describe(workflow, {}, ledger, backend, "m3")
    assert (workflow["chord"]["size"], workflow["chord"]["done"]) == (3, 1)
    client.set(keys.chord_unlock("g"), json.dumps({"kwargs": {"result": header * COUNT_AT_MOST}}))
    describe(workflow, {}, ledger, backend, "m3")
    assert (workflow["chord"]["size"], workflow["chord"]["done"]) == (3 * COUNT_AT_MOST, None)


@pytest.mark.parametrize("backend", [None, "disabled"])
def test_without_a_result_backend_only_the_ledger_is_read(backend):
    ledger = ChordLedger(fakeredis.FakeRedis(), Keys("p"))
    app = Celery("t", set_as_current=False)
    workflow = {"chord": {"group": "g", "member": 1, "body": "tsum"}, "chain": {"remaining": 1, "next": "x"}}
    describe(workflow, {"parent_id": "a"}, ledger, None if backend is None else app.backend, "m")
    assert workflow == {"chord": {"group": "g", "member": 1, "body": "tsum", "state": None, "waiting": 0},
                        "chain": {"remaining": 1, "next": "x"}}


def test_a_result_backend_that_cannot_be_read_leaves_the_letters_own_workflow(caplog):
    class Down(Results):
        def get_task_meta(self, task_id):
            raise ConnectionError("backend down")

    workflow = {"chain": {"remaining": 1, "next": "x"}}
    describe(workflow, {"parent_id": "a"}, ChordLedger(fakeredis.FakeRedis(), Keys("p")), Down({}), "m")
    assert workflow == {"chain": {"remaining": 1, "next": "x"}}
    assert "backend down" in caplog.text
