"""The worker's breakers (worker/features/breaker.py) on fakeredis with a fake clock: count, hold, probe, close, release."""
from __future__ import annotations

import time
from types import SimpleNamespace
from uuid import uuid4

import pytest

from celery_dlq.policy import RedeliveryPolicy
from celery_dlq.storage import breaker_state as B
from celery_dlq.storage.sharding import Shards
from celery_dlq.storage.shards import ShardedStore
from celery_dlq.worker.features.breaker import WorkerBreakers
from celery_dlq.worker.run.events import BREAKER_CHANGED, TaskEvents

POLICY = RedeliveryPolicy(breaker={"enabled": True, "min_failures": 2, "cooldown": 10.0, "max_cooldown": 40.0,
                                   "release_rate": 1.0, "max_release_rate": 2.0})
FAIL = {"type": "ConnectionError", "message": "gateway down"}


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


class Parking:
    def __init__(self) -> None:
        self.parked: list[tuple[str, float]] = []

    def park_again(self, ctx, *, delay: float, snooze: bool = False) -> float:
        self.parked.append((ctx.message.headers["id"], delay))
        return delay


class Message:
    def __init__(self, task_id: str) -> None:
        self.headers, self.acked = {"id": task_id}, False

    def ack(self) -> None:
        self.acked = True


class Dispatcher:
    enabled = True

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict]] = []

    def send(self, type_, **fields):
        self.sent.append((type_, fields))


def ctx(task_id: str, policy: RedeliveryPolicy = POLICY, task: str = "shop.charge", queue: str = "orders"):
    return SimpleNamespace(message=Message(task_id), queue=queue, policy=policy, delivery=1,
                           envelope=SimpleNamespace(task_name=task))


@pytest.fixture
def world(any_redis):
    clock, parking, dispatcher = Clock(), Parking(), Dispatcher()
    sharded = ShardedStore(any_redis, Shards(f"t{uuid4().hex}"), clock=clock)   # its own keys on a real server
    conn = SimpleNamespace(client=any_redis, keys=sharded.home.keys, archive=None, sharded=sharded)
    events = TaskEvents(SimpleNamespace(tasks={}), SimpleNamespace(event_dispatcher=dispatcher))
    config = SimpleNamespace(settings=SimpleNamespace(breaker_refresh=1.0))
    breakers = WorkerBreakers(config, lambda: conn, parking, events, clock)
    return breakers, clock, parking, dispatcher, sharded


def test_failures_open_it_then_deliveries_are_held_and_a_probe_success_closes(world):
    breakers, clock, parking, dispatcher, sharded = world
    for i in range(2):
        breakers.failed(f"f{i}", ctx(f"f{i}"), FAIL)
    assert [fields["state"] for _, fields in dispatcher.sent] == [B.OPEN]
    held = ctx("h1")
    assert breakers.hold("shop.charge", "h1", held) and held.message.acked
    assert parking.parked == [("h1", 10.0)]                        # the first held comes back to probe
    assert breakers.hold("shop.charge", "h2", ctx("h2"))
    assert parking.parked[-1] == ("h2", 40.0)                      # the rest wait the longest cool-down
    assert not breakers.hold("shop.refund", "r1", ctx("r1", task="shop.refund"))   # other tasks run
    assert not breakers.hold("shop.charge", "x", ctx("x", policy=RedeliveryPolicy()))   # no breaker: no read

    clock.now += 10.0
    assert not breakers.hold("shop.charge", "h1", ctx("h1"))      # the probe runs
    assert breakers.hold("shop.charge", "h3", ctx("h3"))          # one probe at a time
    for entry in ("h2:1", "h3:1"):                                  # as park_again would have parked them
        sharded.home.store.park(entry, b"x", "orders", clock.now + 40.0)
    closed = []
    breakers.on_close.append(lambda queue, group, task: closed.append((queue, group)))
    breakers.succeeded("shop.charge", "h1", lambda: ctx("h1"))
    assert [fields["state"] for _, fields in dispatcher.sent] == [B.OPEN, B.HALF_OPEN, B.CLOSED]
    assert dispatcher.sent[-1][0] == BREAKER_CHANGED and dispatcher.sent[-1][1]["uuid"] == "h1"
    deadline = time.monotonic() + 10
    while not closed and time.monotonic() < deadline:   # the release runs in a thread; its hook comes last
        time.sleep(0.01)
    assert closed and closed[0][0] == "orders"
    due = sorted(e.due for e in sharded.entries())     # h1:1 (the probe) was held first, so offset 0 is its
    assert clock.now < due[0] < due[1] < clock.now + 2   # released, paced: not at once, not at the hold's end
    assert not breakers.hold("shop.charge", "h4", ctx("h4"))      # closed: runs


def test_a_failed_probe_reopens_with_a_longer_cooldown(world):
    breakers, clock, parking, dispatcher, _ = world
    for i in range(2):
        breakers.failed(f"f{i}", ctx(f"f{i}"), FAIL)
    clock.now += 10.0
    assert not breakers.hold("shop.charge", "p", ctx("p"))
    breakers.failed("p", ctx("p"), FAIL)
    (state,) = breakers.store().all()
    assert (state.state, state.cooldown) == (B.OPEN, 20.0)


def test_successes_count_in_memory_and_keep_a_busy_task_closed(world):
    breakers, clock, _, dispatcher, _ = world
    policy = RedeliveryPolicy(breaker={"enabled": True, "min_failures": 2, "failure_ratio": 0.5})
    connected = breakers.redis
    assert not breakers.hold("shop.charge", "s", ctx("s", policy=policy))   # a delivery seen: its task counted
    breakers.redis = lambda: pytest.fail("a success touched Redis")
    for i in range(10):
        breakers.succeeded("shop.charge", f"s{i}", lambda: ctx("s", policy=policy))
    breakers.succeeded("shop.refund", "r", lambda: pytest.fail("a task no breaker counts was looked at"))
    breakers.redis = connected
    for i in range(3):
        breakers.failed(f"f{i}", ctx(f"f{i}", policy=policy), FAIL)
    assert dispatcher.sent == [] and breakers.store().all()[0].successes == 10


def test_the_fetch_looks_at_breakers_only_where_a_policy_sets_one():
    from celery import Celery

    from celery_dlq.worker.config import Config

    def app(**conf):
        a = Celery("b", broker="redis://localhost/0", set_as_current=False)
        a.conf.update(conf)
        return a

    assert not Config(app()).breakers
    assert Config(app(dlq_task_policies={"shop.*": {"breaker": True}})).breakers
    assert Config(app(dlq_queue_policies={"orders": {"breaker": "manual"}})).breakers
    assert not Config(app(dlq_default_policy={"breaker": False})).breakers
    assert Config(app(dlq_task_policies={"shop.*": {"breaker": {"enabled": "manual"}}})).breakers
    # options alone (a pattern's thresholds) turn no breaker on, so the fetch stays as it is
    assert not Config(app(dlq_queue_policies={"orders": {"breaker": {"min_failures": 5}}})).breakers
    assert not Config(app(dlq_queue_policies={"orders": {"breaker": {"enabled": False, "window": 5}}})).breakers
    on_task = app()

    @on_task.task(name="shop.charge", shared=False, redelivery_policy={"breaker": True})
    def charge():
        return None

    assert Config(on_task).breakers


class TakenOver:
    """A store whose fetch held deliveries of one task; while the first release pushes its first batch,
    its lease expires (the releasing worker stalled) and a second worker takes it."""

    def __init__(self, redis, other) -> None:
        self.redis, self.other, self.pushed = redis, other, []

    def holding_in_fetch(self, queue, task):
        return False

    def release_held(self, queue, task, target, n):
        self.redis.delete(self.other.key)             # the first worker's lease ran out ...
        assert self.other.acquire()                   # ... and the second took it
        self.pushed.append(n)
        return n                                      # more are left: the first would go on


def test_the_release_lock_is_a_lease_only_its_owner_renews_or_gives_up(world, any_redis):
    first, *_ = world
    first.config = SimpleNamespace(settings=first.config.settings, lists=SimpleNamespace(lowest=lambda q: q + "-low"))
    second = WorkerBreakers(first.config, first.redis, first.parking, first.events, first.clock)
    first.hostname, second.hostname = "worker-1", "worker-2"
    mine = first.release_lease("orders", "shop.charge")
    assert mine.acquire() and any_redis.get(mine.key) == mine.owner.encode()
    any_redis.pexpire(mine.key, 1_000)
    theirs = second.release_lease("orders", "shop.charge")
    assert theirs.key == mine.key and theirs.owner != mine.owner
    assert second.release_held("orders", "shop.charge", 1.0, 2.0) == 0   # another process releases them
    assert not theirs.renew() and not theirs.release()                   # nor refreshes nor deletes the lock
    assert any_redis.get(mine.key) == mine.owner.encode() and any_redis.pttl(mine.key) <= 1_000
    assert mine.release() and any_redis.get(mine.key) is None


def test_a_release_whose_lease_another_took_stops_and_leaves_the_other_its_lease(world, any_redis):
    first, *_ = world
    first.hostname = "worker-1"
    first.config = SimpleNamespace(settings=first.config.settings, lists=SimpleNamespace(lowest=lambda q: q + "-low"))
    other = WorkerBreakers(first.config, first.redis, first.parking, first.events, first.clock)
    other.hostname = "worker-2"
    theirs = other.release_lease("orders", "shop.charge")
    store = TakenOver(any_redis, theirs)
    first.store = lambda: store
    assert first.release_held("orders", "shop.charge", 1.0, 2.0) == 1
    assert store.pushed == [1]                                      # one batch, then its renewal failed: it stopped
    assert any_redis.get(theirs.key) == theirs.owner.encode()       # and it did not delete the other's lease
    assert 4_900 < any_redis.pttl(theirs.key) <= 5_000
