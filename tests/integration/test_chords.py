"""Workflows and dead letters (docs/workflows.md): a chord whose member is dead-lettered, under each rule.

Real prefork worker, Redis broker and Redis result backend. The header is
three ``proj.noop`` (results 0, 1, 2) and one ``proj.fixed_by_flag``, which
fails while ``<prefix>:broken`` exists (2 deliveries, then dead-lettered)
and returns its delivery number once fixed (1 on a replay). The body
``proj.tsum`` logs each run's argument in ``<prefix>:body``; the body's
errback ``proj.chord_failed`` logs each run in ``<prefix>:errbacks``.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import celery
import pytest
from celery import chain, chord, group
from celery.exceptions import ChordError

from celery_dlq.errors import ChordMemberPurged
from celery_dlq.storage.chords import ChordLedger
from celery_dlq.storage.keys import Keys
from celery_dlq.workflow import chord_rule, is_placeholder

pytestmark = pytest.mark.integration


def result_backend(h, kind: str) -> str:
    return h.broker if kind == "redis" else f"db+sqlite:///{h.tmp_path}/results.sqlite"


@pytest.fixture
def chords(harness):
    """The harness with a Redis result backend on both sides."""
    return _chords(harness, "redis")


@pytest.fixture(params=["redis", "sqlite"])
def any_backend(request, harness):
    """The harness with the Redis result backend (parts counted by on_chord_part_return), then with
    SQLite (the database backend: chords joined by celery.chord_unlock)."""
    return _chords(harness, request.param)


def _chords(harness, kind: str):
    harness.backend = backend = result_backend(harness, kind)
    harness.app.conf.result_backend = backend
    harness.extra_env["DLQ_TEST_CONF"] = json.dumps({"result_backend": backend})
    harness.redis.set(f"{harness.prefix}:broken", 1)
    return harness


def body_runs(h) -> list:
    """The argument of each run of the body."""
    return [json.loads(r)["values"] for r in h.redis.lrange(f"{h.prefix}:body", 0, -1)]


def errbacks(h) -> list:
    return [json.loads(r) for r in h.redis.lrange(f"{h.prefix}:errbacks", 0, -1)]


def member_state(h, task_id: str) -> str | None:
    value = h.redis.hget(Keys(h.prefix).chord_member(task_id), "state")
    return value.decode() if value else None


def apply_chord(h, rule: str | None = None):
    """The chord; returns (the body's result, the failing member's id)."""
    sig = h.app.signature
    options = {"headers": chord_rule(rule)} if rule else {}
    header = [sig("proj.noop", args=(i,)) for i in range(3)] + [sig("proj.fixed_by_flag", args=(99,), **options)]
    result = chord(header)(sig("proj.tsum").on_error(sig("proj.chord_failed")))
    # A fresh handle on the body's result: the chord's own would re-raise a failed member's error.
    return h.app.AsyncResult(result.id), result.parent.results[-1].id


def dead_lettered(h, member: str, state: str) -> None:
    """Waits until the member is in the DLQ and its ledger entry is in ``state``; the other members done."""
    h.wait_until(lambda: member_state(h, member) == state, message=f"member {state}")
    assert [letter["headers"]["id"] for letter in h.dead_letters()] == [member]
    h.wait_until(lambda: len(h.deliveries()) == 3 + 2, message="the three noops ran, the member twice")


def replay(h) -> None:
    h.redis.delete(f"{h.prefix}:broken")   # the fix is deployed
    done = h.dlq("replay", f"DLQ.{h.queue}", "--all", conf={"result_backend": h.backend})
    assert done.returncode == 0, done.stderr


def settled(h, member: str, runs: int) -> None:
    """Positive signal before asserting what did NOT happen: the member ran ``runs`` times, the queue drained."""
    h.wait_until(lambda: len(h.deliveries(member)) == runs, message=f"{runs} runs of the member")
    time.sleep(0.3)
    h.after_a_mover_pass()


def test_wait_is_the_default_and_the_replay_runs_the_body_once_with_every_result(any_backend):
    h = any_backend
    h.worker()
    result, member = apply_chord(h)
    dead_lettered(h, member, "waiting")
    settled(h, member, 2)
    assert body_runs(h) == [] and errbacks(h) == []
    assert result.state == "PENDING"
    if h.backend.startswith("db+"):           # chord_unlock parked, not polling each second meanwhile
        group = h.redis.hget(Keys(h.prefix).chord_member(member), "group").decode()
        h.wait_until(lambda: h.redis.exists(Keys(h.prefix).chord_unlock(group)), message="chord_unlock parked")
        polls = h.workers[0].log().count("celery.chord_unlock")
        time.sleep(2.5)
        assert h.workers[0].log().count("celery.chord_unlock") == polls
    replay(h)
    assert result.get(timeout=30) == 0 + 1 + 2 + 1
    assert body_runs(h) == [[0, 1, 2, 1]]      # in header order, the replayed member's own result last
    assert member_state(h, member) == "released"
    assert errbacks(h) == []


def test_a_double_replay_runs_the_body_once(any_backend):
    """A replay killed after its publish and run again: two copies of the member succeed, one body."""
    h = any_backend
    h.worker()
    result, member = apply_chord(h, "wait")
    dead_lettered(h, member, "waiting")
    letter = h.redis.lrange(f"DLQ.{h.queue}", 0, -1)
    replay(h)
    assert result.get(timeout=30) == 4
    h.redis.lpush(f"DLQ.{h.queue}", *letter)          # the letter back, as a killed replay leaves it
    replay(h)
    settled(h, member, 4)
    assert body_runs(h) == [[0, 1, 2, 1]]
    assert errbacks(h) == []


def test_fail_fails_the_chord_now_naming_the_dlq_and_the_letter(any_backend):
    h = any_backend
    h.worker()
    result, member = apply_chord(h, "fail")
    dead_lettered(h, member, "failed")
    h.wait_until(lambda: len(errbacks(h)) == 1, message="the body's errback")
    h.wait_until(lambda: result.state == "FAILURE", message="the body failed")
    text = str(result.result)
    assert f"DLQ.{h.queue}" in text and f"letter {member}" in text and "ChordMemberDeadLettered" in text, text
    replay(h)                                       # the member succeeds; the chord was settled
    settled(h, member, 3)
    assert body_runs(h) == []
    assert len(errbacks(h)) == 1


@pytest.mark.skipif(celery.VERSION < (5, 7), reason="Celery 5.7 fails a group body's tasks and runs its errbacks "
                                                     "when a header member fails (celery/celery#8786); 5.4-5.6 do not")
def test_fail_fails_a_group_body_with_a_chord_error_and_runs_its_bytes_errback_per_task(any_backend):
    """As Celery fails a group body (each of its tasks) when a header member fails: under ``fail`` each task
    gets a ChordError naming the letter, and the body's errback, whose argument is bytes, runs once per task
    (Celery calls a group body's errbacks for each of its tasks)."""
    h = any_backend
    h.worker()
    sig = h.app.signature
    header = [sig("proj.noop", args=(1,)), sig("proj.fixed_by_flag", args=(99,), headers=chord_rule("fail"))]
    body = group(sig("proj.tsum"), sig("proj.tsum"))
    res = chord(header)(body.on_error(sig("proj.errback_bytes", args=(b"\x01chord",), immutable=True)))
    h.wait_until(lambda: len(h.dead_letters()) == 1, message="the member dead-lettered")
    h.wait_until(lambda: len(errbacks(h)) == 2, message="the errback, once per body task")
    for task in res.results:
        h.wait_until(lambda: h.app.AsyncResult(task.id).state == "FAILURE", message="each body task failed")
        with pytest.raises(ChordError, match=f"DLQ.{h.queue}"):
            h.app.AsyncResult(task.id).get(timeout=10)
    settled(h, h.dead_letters()[0]["headers"]["id"], 2)
    assert body_runs(h) == []
    assert errbacks(h) == [{"bytes": "\x01chord", "type": "bytes"}] * 2


def test_continue_runs_the_body_now_with_a_placeholder(any_backend):
    h = any_backend
    h.worker()
    result, member = apply_chord(h, "continue")
    dead_lettered(h, member, "continued")
    assert result.get(timeout=30) == 3
    [values] = body_runs(h)
    assert values[:3] == [0, 1, 2] and is_placeholder(values[3])
    assert values[3]["task_id"] == member and values[3]["dlq"] == f"DLQ.{h.queue}"
    assert values[3]["task"] == "proj.fixed_by_flag" and "RuntimeError" in values[3]["exception"]
    replay(h)
    settled(h, member, 3)
    assert len(body_runs(h)) == 1 and errbacks(h) == []


def test_purging_a_waiting_member_fails_its_chord_once(any_backend):
    h = any_backend
    h.worker()
    result, member = apply_chord(h, "wait")
    dead_lettered(h, member, "waiting")
    refused = h.dlq("purge", f"DLQ.{h.queue}", "--all", "--force")    # an operator app without the backend
    assert refused.returncode != 0 and "result_backend" in refused.stderr, refused.stderr
    assert len(h.dead_letters()) == 1 and member_state(h, member) == "waiting"
    done = h.dlq("purge", f"DLQ.{h.queue}", "--all", "--force", conf={"result_backend": h.backend})
    assert done.returncode == 0, done.stderr
    h.wait_until(lambda: len(errbacks(h)) == 1, message="the body's errback")
    assert member_state(h, member) == "failed"
    h.wait_until(lambda: result.state == "FAILURE", message="the body failed")
    assert "purged" in str(result.result) and f"DLQ.{h.queue}" in str(result.result)
    h.after_a_mover_pass()
    assert body_runs(h) == [] and len(errbacks(h)) == 1


def test_a_poll_between_a_purges_settle_and_its_part_return_joins_the_purged_slot(harness):
    """On a polling backend the purge settles the ledger, then stores the member's FAILURE: a chord_unlock
    running in between (a slow operator, a second copy of the poll) must join what the ledger decided, not
    the member's own error. The purge here stalls for good after its settle; the poll comes anyway."""
    h = _chords(harness, "sqlite")
    h.worker()
    result, member = apply_chord(h, "wait")
    dead_lettered(h, member, "waiting")
    ledger = ChordLedger(h.redis, Keys(h.prefix))
    group = ledger.entry(member)["group"]
    h.wait_until(lambda: ledger.parked_unlock(group) is not None, message="the chord_unlock parked")
    settled = ledger.settle(member, "failed", only_in=f"DLQ.{h.queue}",
                            failure=lambda fields: ChordMemberPurged(f"{fields['id']} purged by a stalled purge"))
    assert settled is not None and settled[1], "the settle took the parked chord_unlock"
    h.app.send_task("celery.chord_unlock", args=json.loads(settled[1])["args"],
                    kwargs=json.loads(settled[1])["kwargs"], queue=h.queue)   # no part return was made
    h.wait_until(lambda: result.state == "FAILURE", message="the body failed")
    assert "purged by a stalled purge" in str(result.result), result.result
    h.wait_until(lambda: len(errbacks(h)) == 1, message="the body's errback")
    h.after_a_mover_pass()
    assert body_runs(h) == [] and len(errbacks(h)) == 1


def test_a_waiting_chord_outlives_result_expires(chords):
    h = chords
    conf = {"result_backend": h.broker, "result_expires": 1}
    h.app.conf.result_expires = 1
    h.extra_env["DLQ_TEST_CONF"] = json.dumps(conf)
    h.worker()
    result, member = apply_chord(h)
    dead_lettered(h, member, "waiting")
    settled(h, member, 2)
    time.sleep(2.2)                                  # past every expiry the chord's keys were given
    group = h.redis.hget(Keys(h.prefix).chord_member(member), "group").decode()
    for suffix in (".j", ".s"):                     # Celery's layout (celery_dlq/internals/celery_backend.py)
        assert h.redis.ttl(f"celery-taskset-meta-{group}{suffix}") == -1, suffix
    replay(h)
    assert result.get(timeout=30) == 4
    assert body_runs(h) == [[0, 1, 2, 1]]


def test_a_chain_resumes_after_its_dead_lettered_step_is_replayed(chords):
    h = chords
    h.worker()
    sig = h.app.signature
    result = chain(sig("proj.noop", args=(5,)), sig("proj.fixed_by_flag"), sig("proj.noop")).apply_async()
    h.wait_until(lambda: len(h.dead_letters()) == 1, message="the middle step dead-lettered")
    replay(h)
    assert result.get(timeout=30) == 1              # the step's result on its replay, passed on by the last


def test_retention_dropping_a_waiting_member_fails_its_chord_once(chords):
    h = chords
    h.extra_env["DLQ_TEST_CONF"] = json.dumps({
        "result_backend": h.broker, "dlq_task_policies": {"proj.always_fails": {"dead_letter_max_length": 1}}})
    h.worker()
    result, member = apply_chord(h)
    dead_lettered(h, member, "waiting")
    h.send("proj.always_fails")                  # its dead letter trims the DLQ to one: the member's goes
    h.wait_until(lambda: len(errbacks(h)) == 1, message="the body's errback")
    assert member_state(h, member) == "failed"
    assert [letter["headers"]["task"] for letter in h.dead_letters()] == ["proj.always_fails"]
    h.wait_until(lambda: result.state == "FAILURE", message="the body failed")
    assert "dropped by retention (max_length)" in str(result.result)
    h.after_a_mover_pass()
    assert body_runs(h) == [] and len(errbacks(h)) == 1


def test_show_says_which_chord_a_letter_belongs_to_and_what_its_chord_waits_for(chords):
    h = chords
    h.worker()
    result, member = apply_chord(h)
    dead_lettered(h, member, "waiting")
    [details] = h.dlq_json("show", member)
    chord = details["workflow"]["chord"]
    assert chord["member"] == 4 and chord["body"] == "proj.tsum" and chord["state"] == "waiting"
    assert chord["waiting"] == 1
    assert chord["group"] == h.redis.hget(Keys(h.prefix).chord_member(member), "group").decode()
    text = h.dlq("show", member).stdout
    assert "member 4 of chord" in text and "the chord waits for this letter's replay" in text, text


def test_show_names_a_dead_lettered_chain_step_and_the_next(chords):
    h = chords
    h.worker()
    sig = h.app.signature
    chain(sig("proj.noop", args=(5,)), sig("proj.fixed_by_flag"), sig("proj.tsum")).apply_async()
    h.wait_until(lambda: len(h.dead_letters()) == 1, message="the middle step dead-lettered")
    [details] = h.dlq_json("show", h.dead_letters()[0]["headers"]["id"])
    assert details["workflow"] == {"chain": {"remaining": 1, "next": "proj.tsum"}}


def test_celery_dlq_policy_explains_the_chord_rule_and_where_it_comes_from(harness):
    conf = {"dlq_task_policies": {"proj.*": {"chord_rule": "continue"}}}
    run = subprocess.run([sys.executable, "-m", "celery", "-A", "tests.integration.proj", "dlq", "policy",
                          "proj.fixed_by_flag", "--json"], env=harness.env(DLQ_TEST_CONF=json.dumps(conf)),
                         cwd=harness.worker_cls.root(), capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    rows = {row["field"]: (row["value"], row["from"]) for row in json.loads(run.stdout)}
    assert rows["chord_rule"] == ("continue", "dlq_task_policies['proj.*']")
    bad = subprocess.run([sys.executable, "-m", "celery", "-A", "tests.integration.proj", "dlq", "policy",
                          "proj.fixed_by_flag"], env=harness.env(DLQ_TEST_CONF=json.dumps(
                              {"dlq_task_policies": {"proj.*": {"chord_rule": "later"}}})),
                         cwd=harness.worker_cls.root(), capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "chord_rule must be 'wait' or 'fail' or 'continue'" in bad.stderr, bad.stderr


def test_a_member_lost_with_its_worker_process_follows_its_rule_too(chords):
    """worker_lost: Celery's main process reports that FAILURE itself; the rule still decides (continue here)."""
    h = chords
    h.extra_env["DLQ_TEST_CONF"] = json.dumps({
        "result_backend": h.broker, "dlq_task_policies": {"proj.poison": {"max_delivery_attempts": 1}}})
    h.worker()
    sig = h.app.signature
    header = [sig("proj.noop", args=(i,)) for i in range(2)] + [sig("proj.poison").set(headers=chord_rule("continue"))]
    result = h.app.AsyncResult(chord(header)(sig("proj.tsum").on_error(sig("proj.chord_failed"))).id)
    assert result.get(timeout=60) == 1
    [values] = body_runs(h)
    assert values[:2] == [0, 1] and is_placeholder(values[2]) and "WorkerLostError" in values[2]["exception"]
    assert [letter["headers"]["x-dlq-reason"] for letter in h.dead_letters()] == ["worker_lost"]
    assert errbacks(h) == []


# -- nesting ---------------------------------------------------------------------

def held_open(h) -> str:
    """Waits until the one dead letter holds its chord open (after its two runs); no body, no errback yet.
    Returns the letter's task id."""
    h.wait_until(lambda: len(h.dead_letters()) == 1, message="a task dead-lettered")
    letter = h.dead_letters()[0]["headers"]["id"]
    h.wait_until(lambda: member_state(h, letter) == "waiting", message="the chord waits")
    settled(h, letter, 2)
    assert body_runs(h) == [] and errbacks(h) == []
    return letter


def test_a_chain_in_a_chord_header_waits_for_its_dead_lettered_first_step(any_backend):
    """chord([noop, chain(fixed_by_flag, noop)], tsum): the chain's first step stands for its chord member."""
    h = any_backend
    h.worker()
    sig = h.app.signature
    header = [sig("proj.noop", args=(7,)), chain(sig("proj.fixed_by_flag", args=(99,)), sig("proj.noop"))]
    res = chord(header)(sig("proj.tsum").on_error(sig("proj.chord_failed")))
    result = h.app.AsyncResult(res.id)
    step = held_open(h)
    replay(h)
    assert result.get(timeout=30) == 7 + 1          # the chain's last step got the step's result (1)
    assert body_runs(h) == [[7, 1]]
    h.wait_until(lambda: member_state(h, step) == "released", message="the letter released")
    assert errbacks(h) == []


def test_a_chord_in_a_chain_goes_on_after_the_replay(any_backend):
    """chain(noop, chord([noop, fixed_by_flag], tsum), noop): the chain after the chord runs once."""
    h = any_backend
    h.worker()
    sig = h.app.signature
    res = chain(sig("proj.noop", args=(1,)),
                chord([sig("proj.noop", args=(2,), immutable=True),
                       sig("proj.fixed_by_flag", args=(99,), immutable=True)], sig("proj.tsum")),
                sig("proj.noop")).apply_async()
    result = h.app.AsyncResult(res.id)
    h.wait_until(lambda: len(h.dead_letters()) == 1, message="the chord member dead-lettered")
    member = h.dead_letters()[0]["headers"]["id"]
    h.wait_until(lambda: member_state(h, member) == "waiting", message="the chord waits")
    replay(h)
    assert result.get(timeout=30) == 3              # tsum([2, 1]) passed on to the last noop
    assert body_runs(h) == [[2, 1]]


def test_a_chord_whose_body_is_dead_lettered_replays_the_body_with_the_header_results(any_backend):
    h = any_backend
    h.worker()
    sig = h.app.signature
    res = chord([sig("proj.noop", args=(i,)) for i in range(3)])(sig("proj.fixed_by_flag"))
    h.wait_until(lambda: len(h.dead_letters()) == 1, message="the body dead-lettered")
    letter = h.dead_letters()[0]
    assert letter["headers"]["task"] == "proj.fixed_by_flag"
    replay(h)
    assert h.app.AsyncResult(res.id).get(timeout=30) == 1
    assert [r["args"] for r in h.deliveries(res.id)] == [[[0, 1, 2]]] * 3


def test_a_group_of_chains_each_goes_on_after_its_replay(any_backend):
    h = any_backend
    h.worker()
    sig = h.app.signature
    res = group(chain(sig("proj.noop", args=(i,)), sig("proj.fixed_by_flag"), sig("proj.noop")) for i in range(2))()
    h.wait_until(lambda: len(h.dead_letters()) == 2, message="both middle steps dead-lettered")
    replay(h)
    assert res.get(timeout=30) == [1, 1]


def test_a_chord_in_a_chord_header_waits_for_its_dead_lettered_member(any_backend):
    """chord([noop, chord([noop, fixed_by_flag], tsum)], tsum): the inner chord waits for its member's
    replay, the outer for the inner's body; after the replay each body runs once."""
    h = any_backend
    h.worker()
    sig = h.app.signature
    inner = chord([sig("proj.noop", args=(2,)), sig("proj.fixed_by_flag", args=(99,))], sig("proj.tsum"))
    res = chord([sig("proj.noop", args=(1,)), inner])(sig("proj.tsum").on_error(sig("proj.chord_failed")))
    result = h.app.AsyncResult(res.id)
    held_open(h)
    replay(h)
    assert result.get(timeout=30) == 1 + (2 + 1)
    assert sorted(body_runs(h)) == [[1, 3], [2, 1]]   # each body once: the inner's, then the outer's
    assert errbacks(h) == []


@pytest.mark.skipif(celery.VERSION < (5, 7), reason="the copy's second part return is dropped by Celery "
                                                     "5.7's done marker; older Celery runs the body twice")
def test_a_worker_killed_after_the_replayed_members_success_runs_the_body_once(chords):
    """SIGKILL of the whole worker after the member's success is stored and its chord told, before the ack:
    the restored copy runs again on the next worker; the chord publishes its body once.

    The body goes to a queue only the second worker consumes: a body run by the killed worker would be
    run again as any unacknowledged task is (its own at-least-once), which is not what is measured here.
    """
    h = chords
    h.extra_env.update(DLQ_TEST_KILL_AFTER_SUCCESS="1", DLQ_TEST_CONF=json.dumps({
        "result_backend": h.broker, "broker_transport_options": {
            "visibility_timeout": 1, "unacked_restore_interval": 1, "unacked_restore_throttle": 1}}))
    first = h.worker()
    sig = h.app.signature
    header = [sig("proj.noop", args=(i,)) for i in range(3)] + [sig("proj.fixed_by_flag", args=(99,))]
    res = chord(header)(sig("proj.tsum", queue=f"{h.queue}b"))
    result, member = h.app.AsyncResult(res.id), res.parent.results[-1].id
    dead_lettered(h, member, "waiting")
    h.redis.set(f"{h.prefix}:kill_after_success:{member}", 1)
    replay(h)
    first.proc.wait(timeout=30)
    assert first.proc.returncode == -9
    h.worker(name="w2", DLQ_TEST_QUEUE=f"{h.queue},{h.queue}b")
    h.wait_until(lambda: member_state(h, member) == "released", timeout=30, message="the restored copy's success")
    assert result.get(timeout=30) == 4
    settled(h, member, 4)                  # 2 failures, the killed replay's run, the restored copy's
    runs = [json.loads(r) for r in h.redis.lrange(f"{h.prefix}:body", 0, -1)]
    assert [(run["values"], run["delivery"]) for run in runs] == [([0, 1, 2, 1], 1)]


def test_the_groups_view_counts_the_chords_a_failure_group_holds_open(chords):
    h = chords
    h.worker()
    first, member = apply_chord(h)
    second, other = apply_chord(h)
    h.wait_until(lambda: member_state(h, member) == "waiting" and member_state(h, other) == "waiting",
                 message="both chords wait")
    [group] = h.dlq_json("groups", f"DLQ.{h.queue}")
    assert group["count"] == 2 and group["chords_waiting"] == 2
    [merged] = h.dlq_json("groups")
    assert merged["chords_waiting"] == 2
    assert "chords" in h.dlq("groups").stdout     # the column (its header wraps in a narrow table)
