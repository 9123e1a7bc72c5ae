"""Redrive jobs kept in Redis (fakeredis): the state machine, claims and leases, velocity math, and runs."""
from __future__ import annotations

import pytest

from celery_dlq.ops import Filter, Operator, Selection
from celery_dlq.ops.audit import Actor
from celery_dlq.ops.jobrun import JobRunner
from celery_dlq.ops.jobs import Jobs
from celery_dlq.ops.velocity import Velocity, batch_size, next_rate, step_due, wait
from celery_dlq.storage.jobs import TRANSITIONS, DLQBusy, JobStateError, next_state
from tests.unit.conftest import app  # noqa: F401  (a fixture, also under tests/integration/on_redis)
from tests.unit.test_manage import T0, FakeClock, dead_letter, stored


@pytest.fixture
def fake(emptied_any_redis):
    """fakeredis here; a real redis-server under tests/integration/on_redis (the job scripts run on both)."""
    return emptied_any_redis


@pytest.fixture
def op(app, fake):  # noqa: F811  (the imported fixture)
    return Operator(app, broker=fake, client=fake, clock=FakeClock())


def letters(fake, n, **kw):
    return [dead_letter(fake, args=(i,), at=T0 - 1000 + i, **kw) for i in range(n)]


class Sleeps:
    """The runner's sleep: advances the fake clock, and can act at the n-th sleep (another process)."""

    def __init__(self, clock, at=None):
        self.clock, self.at, self.slept = clock, at or {}, []

    def __call__(self, seconds):
        self.slept.append(seconds)
        self.clock.now += seconds
        action = self.at.get(len(self.slept))
        if action:
            action()


# -- pure ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("state, action, after", [
    ("running", "pause", "paused"), ("paused", "resume", "running"), ("running", "cancel", "cancelled"),
    ("paused", "cancel", "cancelled"), ("running", "finish", "done"), ("running", "stop", "stopped"),
])
def test_each_action_leads_from_the_states_it_applies_to(state, action, after):
    assert next_state(state, action) == after


@pytest.mark.parametrize("state, action", [("paused", "pause"), ("running", "resume"), ("done", "cancel"),
                                           ("cancelled", "resume"), ("stopped", "pause"), ("", "pause")])
def test_an_action_that_does_not_apply_says_why(state, action):
    with pytest.raises(JobStateError, match=f"cannot {action}"):
        next_state(state, action)
    assert set(TRANSITIONS) == {"pause", "resume", "cancel", "finish", "fail", "stop"}


def test_a_rising_velocity_doubles_while_healthy_up_to_its_cap_and_holds_otherwise():
    assert [next_rate(r, 50, True) for r in (1, 2, 32, 50)] == [2, 4, 50, 50]
    assert next_rate(8, 50, False) == 8
    assert step_due(110.0, 100.0, 10.0) and not step_due(109.9, 100.0, 10.0)


def test_batches_and_waits_keep_to_the_rate():
    assert batch_size(None, 500) == 500 and batch_size(0.2, 500) == 1 and batch_size(40, 500) == 40
    assert batch_size(10_000, 500) == 500
    assert wait(100.0, 10, 5.0, 101.0) == 1.0 and wait(100.0, 10, 5.0, 103.0) == 0.0 and wait(0, 9, None, 0) == 0
    with pytest.raises(ValueError, match="at most its cap"):
        Velocity(100, 50)
    with pytest.raises(ValueError, match="rate must be > 0"):
        Velocity(0)


# -- Redis -----------------------------------------------------------------------------------------

def test_one_unfinished_job_per_dlq_unless_forced(op, fake):
    letters(fake, 3)
    jobs = Jobs(op)
    first = jobs.start("DLQ.orders", Selection.of(everything=True))
    with pytest.raises(DLQBusy) as busy:
        jobs.start("orders", Selection.of(everything=True))
    assert busy.value.holder == first.id
    op.clock.now += 1
    forced = jobs.start("DLQ.orders", Selection.of(everything=True), force=True)
    jobs.cancel(first.id)
    op.clock.now += 1
    third = jobs.start("DLQ.orders", Selection.of(everything=True))   # the first ended: free again
    assert len({first.id, forced.id, third.id}) == 3
    assert [j.id for j in jobs.recent()] == [third.id, forced.id, first.id]


def test_a_lease_is_taken_only_when_expired_and_renewed_only_by_its_owner(op, fake):
    letters(fake, 1)
    a, b = Jobs(op, owner="a", lease=30), Jobs(op, owner="b", lease=30)
    job = a.start("DLQ.orders", Selection.of(everything=True))
    now = int(T0 * 1000)
    assert a.store.orphans(now) == [job.id]                      # created without an owner
    assert a.store.claim(job.id, "a", now, 30_000) == "running"
    assert b.store.claim(job.id, "b", now + 29_999, 30_000) is None
    assert b.store.orphans(now + 29_999) == []
    assert b.store.claim(job.id, "b", now + 30_000, 30_000, take=False) is None   # renew only one's own
    assert b.store.claim(job.id, "b", now + 30_000, 30_000) == "running"        # expired: taken over
    assert a.store.claim(job.id, "a", now + 30_001, 30_000, take=False, counts={"done": 5}) is None
    got = a.get(job.id)
    assert got.owner == "b" and got.takeovers == 1 and got.counts["done"] == 0   # the old owner counts nothing


def test_pause_resume_cancel_from_any_process_are_audited(op, fake):
    letters(fake, 2)
    jobs = Jobs(op)
    job = jobs.start("DLQ.orders", Selection.of(everything=True), actor=Actor("alice", "gateway back"))
    other = Jobs(op, owner="elsewhere")
    assert other.pause(job.id, Actor("bob")).state == "paused"
    with pytest.raises(JobStateError, match="cannot pause a job that is paused"):
        other.pause(job.id)
    assert other.resume(job.id, Actor("bob")).state == "running"
    assert other.cancel(job.id, Actor("carol", "wrong group")).state == "cancelled"
    trail = jobs.audit.recent()
    assert [(r["action"], r["who"]) for r in trail] == [("cancel", "carol"), ("resume", "bob"), ("pause", "bob"),
                                                       ("start", "alice")]
    assert trail[0]["why"] == "wrong group" and trail[-1]["selection"]["all"] is True
    assert fake.xlen(op.keys.events) and any(
        e[1][b"type"] == b"operator_action" for e in fake.xrange(op.keys.events))


def test_a_paced_job_moves_every_letter_once_in_batches_and_ends_done(op, fake):
    dead = letters(fake, 7)
    jobs = Jobs(op)
    job = jobs.start("DLQ.orders", Selection.of(everything=True), velocity=Velocity(2.0))
    sleeps = Sleeps(op.clock)
    done = JobRunner(jobs, sleep=sleeps).run(job.id)
    assert done.state == "done" and done.counts["done"] == 7 and done.counts["matched"] == 7
    assert sorted(m["headers"]["id"] for m in stored(fake, "orders")) == sorted(d.task_id for d in dead)
    assert sleeps.slept == [1.0, 1.0, 1.0]    # 2 a second: batches of 2, 2, 2, then the last 1
    assert jobs.audit.recent()[0]["action"] == "replay" and jobs.audit.recent()[0]["counts"]["done"] == 7


def test_a_job_paused_then_resumed_then_cancelled_by_another_process(op, fake):
    letters(fake, 6)
    jobs, other = Jobs(op), Jobs(op, owner="other")
    job = jobs.start("DLQ.orders", Selection.of(everything=True), velocity=Velocity(1.0))
    seen = {}

    def pause():
        other.pause(job.id)

    def resume():
        seen["paused_done"] = len(fake.lrange("orders", 0, -1))
        other.resume(job.id)

    def cancel():
        other.cancel(job.id)

    # sleep 1 after batch 1; sleep 2 pauses; sleeps 3-4 wait paused; sleep 4 resumes; batch 2; sleep 5 cancels
    sleeps = Sleeps(op.clock, {1: pause, 4: resume, 5: cancel})
    ended = JobRunner(jobs, sleep=sleeps, poll=1.0).run(job.id)
    assert seen["paused_done"] == 1                    # nothing moved while paused
    assert ended.state == "cancelled" and ended.counts["done"] == 2
    assert len(fake.lrange("orders", 0, -1)) == 2 and op.depth("DLQ.orders") == 4


def test_a_job_taken_over_finishes_what_is_left_and_moves_each_letter_once(op, fake):
    dead = letters(fake, 5)
    a, b = Jobs(op, owner="a", lease=10), Jobs(op, owner="b", lease=10)
    job = a.start("DLQ.orders", Selection.of(everything=True), velocity=Velocity(2.0))

    class Died(BaseException):   # not caught: the process is gone
        pass

    def die():
        raise Died   # the process dies in its sleep after its first batch: the lease is left to expire

    with pytest.raises(Died):
        JobRunner(a, sleep=Sleeps(op.clock, {1: die})).run(job.id)
    assert JobRunner(b).take_orphans() == []           # the lease has not expired yet
    assert JobRunner(b).unfinished() and b.get(job.id).owner == "a"   # a job is running: look again soon
    op.clock.now += 10
    assert JobRunner(b, sleep=Sleeps(op.clock)).unfinished()            # orphaned: taken and run to its end
    ended = b.get(job.id)
    assert ended.state == "done" and ended.owner == "b" and ended.takeovers == 1
    assert not JobRunner(b).unfinished() and b.store.first_lease() is None   # no job left: looks may space out
    ids = [m["headers"]["id"] for m in stored(fake, "orders")]
    assert sorted(ids) == sorted(d.task_id for d in dead) and len(ids) == 5


def test_a_job_by_ids_keeps_its_ids_left_and_reports_those_not_found(op, fake):
    dead = letters(fake, 4)
    jobs = Jobs(op)
    job = jobs.start("DLQ.orders", Selection.of([dead[3].task_id, "nope", dead[0].task_id]), velocity=Velocity(1.0))
    ended = JobRunner(jobs, sleep=Sleeps(op.clock)).run(job.id)
    assert ended.state == "done" and ended.counts["done"] == 2 and ended.counts["not_found"] == 1
    assert op.depth("DLQ.orders") == 2


def test_a_job_takes_only_letters_dead_lettered_before_it_started(op, fake):
    letters(fake, 2)
    dead_letter(fake, args=(99,), at=T0 + 5)      # dies again after the job started: not this job's
    jobs = Jobs(op)
    job = jobs.start("DLQ.orders", Selection.of(where=Filter(task_name="shop.*")))
    ended = JobRunner(jobs).run(job.id)
    assert ended.counts["done"] == 2 and op.depth("DLQ.orders") == 1


def test_a_redrive_stops_when_its_breaker_opens(op, fake):
    dead = letters(fake, 4)
    group = dead[0].group
    jobs = Jobs(op)
    job = jobs.start_redrive("orders", group, start=1.0, cap=8.0, interval=2.0)
    assert job.kind == "redrive" and job.queue == "orders" and job.rising
    breaker = op.keys.breaker("orders", group)
    sleeps = Sleeps(op.clock, {2: lambda: fake.hset(breaker, "state", "open")})
    ended = JobRunner(jobs, sleep=sleeps).run(job.id)
    assert ended.state == "stopped" and "breaker" in ended.reason and ended.counts["done"] == 2
    assert jobs.audit.recent()[0]["action"] == "stop"
    assert op.keys.breaker("orders", group) == f"{op.keys.base}:breaker:orders:{group}"


def test_a_rising_redrive_doubles_its_rate_each_interval_while_none_dies_again(op, fake):
    dead = letters(fake, 30)
    jobs = Jobs(op)
    job = jobs.start_redrive("orders", dead[0].group, start=1.0, cap=4.0, interval=2.0)
    sleeps = Sleeps(op.clock)
    ended = JobRunner(jobs, sleep=sleeps).run(job.id)
    assert ended.state == "done" and ended.rate == 4.0 and ended.counts["done"] == 30
    # 1/s for 2 s, 2/s for 2 s, then 4/s: batches of 1, 1, 2, 2, then 4 (24 letters: 6, and one that finds none)
    assert sleeps.slept == [1.0] * (2 + 2 + 6)


def test_a_purge_job_deletes_its_selection(op, fake):
    letters(fake, 3)
    jobs = Jobs(op)
    job = jobs.start("DLQ.orders", Selection.of(everything=True), kind="purge")
    assert JobRunner(jobs).run(job.id).counts["done"] == 3 and op.depth("DLQ.orders") == 0


def test_a_paced_job_passes_letters_it_cannot_replay_once_and_reports_them(op, fake):
    fake.lpush("DLQ.orders", b"not a kombu message at all")   # the oldest: met first by every pass
    dead = letters(fake, 2)
    jobs = Jobs(op)
    job = jobs.start("DLQ.orders", Selection.of(everything=True), velocity=Velocity(1.0))
    ended = JobRunner(jobs, sleep=Sleeps(op.clock)).run(job.id)
    assert ended.state == "done" and ended.counts["done"] == 2 and ended.counts["failed"] == 1
    assert ended.errors == ["<unknown id>: not a kombu message"] and len(ended.skipped) == 1
    assert fake.lrange("DLQ.orders", 0, -1) == [b"not a kombu message at all"]
    assert sorted(m["headers"]["id"] for m in stored(fake, "orders")) == sorted(d.task_id for d in dead)


def test_a_stopped_runner_gives_its_job_back_and_a_paused_orphan_waits_for_its_resume(op, fake):
    letters(fake, 4)
    a, b = Jobs(op, owner="a"), Jobs(op, owner="b")
    job = a.start("DLQ.orders", Selection.of(everything=True), velocity=Velocity(1.0))
    runner = JobRunner(a)

    def stop():
        runner.stopping = True   # a worker shutting down, from another thread

    runner.sleep = Sleeps(op.clock, {1: stop})
    assert runner.run(job.id).state == "running" and op.depth("DLQ.orders") == 3
    assert b.store.orphans(int(op.clock() * 1000)) == [job.id]       # given back: no lease to wait out
    b.pause(job.id)
    assert JobRunner(b).take_orphans() == [] and b.get(job.id).owner == "a"
    b.resume(job.id)
    assert JobRunner(b, sleep=Sleeps(op.clock)).take_orphans() == [job.id]
    assert b.get(job.id).state == "done" and op.depth("DLQ.orders") == 0
