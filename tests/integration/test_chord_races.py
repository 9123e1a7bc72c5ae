"""Exactly once (docs/workflows.md): a waiting chord member's replay racing its purge runs the body at most once.

The replay and the purge each move or remove a letter atomically, so the
race that matters is a copy of the member arriving on either side of the
purge's settling of the ledger: the purge of a letter whose replay already
succeeded (the purge read it first), and a copy of the member succeeding
after the purge failed its chord (the letter back in the DLQ, as a stale
read or a killed replay leaves it, and replayed). Same chord and tasks as
tests/integration/test_chords.py.
"""
from __future__ import annotations

import json

import pytest

from tests.integration.test_chords import _chords, apply_chord, member_state, settled

pytestmark = pytest.mark.integration


@pytest.fixture(params=["redis", "sqlite"])
def races(request, harness):
    return _chords(harness, request.param)


def body_runs(h, body_id: str) -> list:
    runs = [json.loads(r) for r in h.redis.lrange(f"{h.prefix}:body", 0, -1)]
    return [run["values"] for run in runs if run["id"] == body_id]


def errbacks(h) -> list[str]:
    return [json.loads(r)["task_id"] for r in h.redis.lrange(f"{h.prefix}:errbacks", 0, -1)]


def letters(h) -> dict[str, bytes]:
    """The DLQ's raw letters by task id."""
    return {json.loads(raw)["headers"]["id"]: raw for raw in h.redis.lrange(f"DLQ.{h.queue}", 0, -1)}


def dlq(h, *args: str) -> None:
    done = h.dlq(*args, conf={"result_backend": h.backend})
    assert done.returncode == 0, done.stderr


def test_a_replay_racing_its_purge_runs_the_body_at_most_once(races):
    h = races
    h.worker()
    purge_first, member_p = apply_chord(h)      # the purge settles the ledger first
    replay_first, member_r = apply_chord(h)     # the replay's success settles it first
    h.wait_until(lambda: member_state(h, member_p) == member_state(h, member_r) == "waiting", message="both wait")
    h.wait_until(lambda: len(letters(h)) == 2, message="both letters")
    raw = letters(h)

    dlq(h, "purge", f"DLQ.{h.queue}", member_p, "--force")
    h.wait_until(lambda: errbacks(h) == [purge_first.id], message="the purged chord's errback")
    assert member_state(h, member_p) == "failed"

    h.redis.delete(f"{h.prefix}:broken")        # the fix deployed
    dlq(h, "replay", f"DLQ.{h.queue}", member_r)
    assert replay_first.get(timeout=30) == 4
    h.wait_until(lambda: member_state(h, member_r) == "released", message="the replayed member released")
    h.redis.lpush(f"DLQ.{h.queue}", raw[member_r])  # the purge that read it before the replay moved it
    dlq(h, "purge", f"DLQ.{h.queue}", member_r, "--force")

    h.redis.lpush(f"DLQ.{h.queue}", raw[member_p])  # a copy of the purged member, replayed: it succeeds
    dlq(h, "replay", f"DLQ.{h.queue}", member_p)
    settled(h, member_p, 3)
    settled(h, member_r, 3)

    assert body_runs(h, purge_first.id) == []
    assert body_runs(h, replay_first.id) == [[0, 1, 2, 1]]
    assert errbacks(h) == [purge_first.id]      # the purge failed one chord, once; the late purge none
    assert purge_first.state == "FAILURE" and "purged" in str(purge_first.result)
    assert member_state(h, member_p) == "failed" and member_state(h, member_r) == "released"
    assert h.dead_letters() == []
