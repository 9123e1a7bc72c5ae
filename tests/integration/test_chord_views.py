"""Operators see the workflow (docs/workflows.md#operators): ``celery dlq show``, ``--json`` and the dashboard.

A chord of three ``proj.noop`` and one ``proj.fixed_by_flag`` (dead-lettered,
its chord waiting) and a chain ``noop, fixed_by_flag, noop`` (its middle
dead-lettered), on each result backend: the chord's size and how many of its
members are done come from the backend (Redis: its chord keys; SQLite: the
parked ``chord_unlock``), the chain step's number from its parents' results.
Then their failure group is replayed, which resumes both workflows.
"""
from __future__ import annotations

import pytest
from celery import Celery, chain
from starlette.testclient import TestClient

from celery_dlq.storage.keys import Keys
from celery_dlq.web import create_app
from tests.integration.test_chords import _chords, apply_chord, dead_lettered, member_state

pytestmark = pytest.mark.integration


@pytest.fixture(params=["redis", "sqlite"])
def views(request, harness):
    return _chords(harness, request.param)


def dashboard(h) -> TestClient:
    """The dashboard of an operator's app (the workers' broker, prefix and result backend), in this process."""
    app = Celery("ops", broker=h.broker, set_as_current=False)
    app.conf.update(task_default_queue=h.queue, dlq_key_prefix=h.prefix, result_backend=h.backend)
    client = TestClient(create_app(app, basic_auth=["alice:wonder"]), base_url="http://localhost")
    client.auth = ("alice", "wonder")
    return client


def test_show_and_the_dashboard_place_a_letter_in_its_workflow_and_a_group_replay_resumes_it(views):
    h = views
    h.worker()
    chord_result, member = apply_chord(h)
    dead_lettered(h, member, "waiting")
    group = h.redis.hget(Keys(h.prefix).chord_member(member), "group").decode()
    sig = h.app.signature
    chain_result = chain(sig("proj.noop", args=(5,)), sig("proj.fixed_by_flag"), sig("proj.noop")).apply_async()
    h.wait_until(lambda: len(h.dead_letters()) == 2, message="the chain's middle dead-lettered")
    step = next(letter["headers"]["id"] for letter in h.dead_letters() if letter["headers"]["id"] != member)
    if h.backend.startswith("db+"):   # the size is the parked chord_unlock's header
        h.wait_until(lambda: h.redis.exists(Keys(h.prefix).chord_unlock(group)), message="chord_unlock parked")
    conf = {"result_backend": h.backend}

    [chord_letter] = h.dlq_json("show", member, conf=conf)
    chord = chord_letter["workflow"]["chord"]
    assert (chord["member"], chord["size"], chord["done"], chord["body"]) == (4, 4, 3, "proj.tsum")
    assert chord["state"] == "waiting" and chord["waiting"] == 1
    assert chord["group"] == group
    [chain_letter] = h.dlq_json("show", step, conf=conf)
    assert chain_letter["workflow"] == {"chain": {"remaining": 1, "next": "proj.noop", "step": 2, "steps": 3,
                                                  "exact": True}}
    chord_line = f"member 4 of 4 of chord {group}; 3 done; body proj.tsum"
    chain_line = "step 2 of 3 of a chain; next proj.noop"
    assert chord_line in h.dlq("show", member, conf=conf).stdout.replace("\n", " ")
    assert chain_line in h.dlq("show", step, conf=conf).stdout

    web = dashboard(h)
    page = web.get(f"/dlq/DLQ.{h.queue}/letters/{member}")
    assert page.status_code == 200 and chord_line in page.text, page.text
    assert chain_line in web.get(f"/dlq/DLQ.{h.queue}/letters/{step}").text
    groups = web.get("/groups").text
    assert "chords held open" in groups
    assert f'data-chords-waiting="{chord_letter["group"]}">1<' in groups
    assert member_state(h, member) == "waiting"

    # Replaying the failure group (both letters: one failure) resumes both workflows.
    assert chord_letter["group"] == chain_letter["group"]
    h.redis.delete(f"{h.prefix}:broken")
    done = h.dlq("replay", f"DLQ.{h.queue}", "--group", chord_letter["group"], conf=conf)
    assert done.returncode == 0, done.stderr
    assert chord_result.get(timeout=30) == 0 + 1 + 2 + 1
    assert chain_result.get(timeout=30) == 1
    assert h.dead_letters() == []
