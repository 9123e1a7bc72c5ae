"""Exactly once (docs/workflows.md): a waiting chord member's replay racing its purge runs the body at most once.

The replay and the purge each move or remove a letter atomically. The
first test races them for real: two threads, each with its own operator,
released together by a barrier, round after round, and checks that exactly
one wins each round with the chord settled the winner's way. The second
plays the interleavings a real race can leave, one after the other: a copy
of the member arriving on either side of the purge's settling of the
ledger (the purge of a letter whose replay already succeeded, the purge
having read it first; a copy of the member succeeding after the purge
failed its chord, the letter back in the DLQ as a stale read or a killed
replay leaves it, and replayed). Same chord and tasks as
tests/integration/test_chords.py.
"""
from __future__ import annotations

import json
import threading

import pytest
from celery import Celery

from celery_dlq.ops import Operator, TaskIds
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


#: Rounds of the race: each round is one chord whose waiting member's letter a replay and a purge race for.
ROUNDS = 6


def operator(h) -> Operator:
    """An operator of its own (its own app and Redis clients), as a second ``celery dlq`` process has."""
    app = Celery("ops", broker=h.broker, set_as_current=False)
    app.conf.update(task_default_queue=h.queue, dlq_key_prefix=h.prefix, result_backend=h.backend)
    return Operator(app)


def race(replayer: Operator, purger: Operator, dlq_name: str, member: str) -> tuple[int, int]:
    """Replay and purge ``member``'s letter from two threads released together; (replayed, purged)."""
    barrier, done = threading.Barrier(2, timeout=30), {}

    def run(name, action):
        barrier.wait()
        done[name] = action()

    threads = [threading.Thread(target=run, args=("replay", lambda: replayer.queue(dlq_name).replay(
                   TaskIds([member])))),
               threading.Thread(target=run, args=("purge", lambda: purger.queue(dlq_name).purge(
                   TaskIds([member], every=True), force=True)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert set(done) == {"replay", "purge"} and not done["replay"].failed and not done["purge"].failed
    return done["replay"].done, done["purge"].done


def test_a_replay_and_its_purge_racing_for_real_settle_each_chord_once(races):
    h = races
    h.worker()
    chords = [apply_chord(h) for _ in range(ROUNDS)]
    h.wait_until(lambda: all(member_state(h, member) == "waiting" for _, member in chords), timeout=120,
                 message="every chord's member waiting")
    h.wait_until(lambda: len(letters(h)) == ROUNDS, message="every member's letter")
    h.redis.delete(f"{h.prefix}:broken")        # the fix deployed: a replayed member succeeds
    replayer, purger, dlq_name = operator(h), operator(h), f"DLQ.{h.queue}"
    winners = {}
    for result, member in chords:
        replayed, purged = race(replayer, purger, dlq_name, member)
        assert replayed + purged == 1, f"round of {member}: replayed {replayed}, purged {purged}"
        winners[result.id] = (member, "replay" if replayed else "purge")
    for member, winner in winners.values():
        state = "released" if winner == "replay" else "failed"
        h.wait_until(lambda m=member, s=state: member_state(h, m) == s, timeout=60,
                     message=f"the {winner} settling {member}")
        if winner == "replay":
            settled(h, member, 3)
    h.after_a_mover_pass()
    for body_id, (member, winner) in winners.items():
        if winner == "replay":   # the member ran again and the body once, with every result; no errback
            assert len(h.deliveries(member)) == 3 and body_runs(h, body_id) == [[0, 1, 2, 1]]
            assert body_id not in errbacks(h)
        else:                    # the chord failed once: its errback, never its body; the member not run again
            assert len(h.deliveries(member)) == 2 and body_runs(h, body_id) == []
            assert errbacks(h).count(body_id) == 1
    assert h.dead_letters() == [] and h.redis.llen(h.queue) == 0


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
