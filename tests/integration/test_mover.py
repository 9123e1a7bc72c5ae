"""Movers sharing one store, a mover dying mid-move, and memory with many parked retries."""
from __future__ import annotations

import json
import time
from collections import Counter

import psutil
import pytest

from celery_dlq.redis.keys import Keys
from celery_dlq.redis.store import DelayedStore

pytestmark = pytest.mark.integration


def park_noop_messages(harness, n: int, due: float) -> list[str]:
    return harness.park_noops(n, due)


def test_two_workers_move_1000_parked_messages_exactly_once(harness):
    ids = park_noop_messages(harness, 1000, due=time.time() + 1.0)
    harness.worker(name="a", DLQ_TEST_PREFETCH="16")
    harness.worker(name="b", DLQ_TEST_PREFETCH="16")
    harness.wait_until(lambda: len(harness.deliveries()) >= 1000, timeout=120, message="1000 deliveries")
    redelivered = int(harness.redis.hget(f"{{{harness.prefix}}}:stats", "redelivered"))
    harness.after_a_mover_pass()  # then any duplicate would have shown up
    counts = Counter(r["id"] for r in harness.deliveries())
    assert set(counts) == set(ids)
    assert set(counts.values()) == {1}
    store = DelayedStore(harness.redis, Keys(harness.prefix))
    assert store.count() == 0
    assert redelivered == 1000
    movers = [w.log().count("celery-dlq mover: moving") for w in harness.workers]
    assert movers == [1, 1]


def test_entries_claimed_by_a_dead_mover_are_redelivered_after_the_lease(harness):
    harness.worker()  # running first, so its start-up time cannot eat into the lease
    due = time.time() + 1.0
    ids = park_noop_messages(harness, 20, due=due)
    dead_mover = DelayedStore(harness.redis, Keys(harness.prefix))
    # Claim as of the due time, before the live mover may: ...and then die (no publish, no ack).
    claimed = dead_mover.claim_due(limit=100, lease=2.0, now=due)
    assert len(claimed) == 20
    lease_until = claimed[0].lease_until
    time.sleep(max(0.0, lease_until - 0.5 - time.time()))
    assert harness.deliveries() == [], "a leased entry must not move before its lease expires"
    harness.wait_until(lambda: len(harness.deliveries()) >= 20, timeout=30)
    assert min(r["at"] for r in harness.deliveries()) >= lease_until - 0.05
    assert {r["id"] for r in harness.deliveries()} == set(ids)
    assert DelayedStore(harness.redis, Keys(harness.prefix)).count() == 0


@pytest.mark.slow
def test_20000_parked_retries_do_not_grow_the_worker(harness):
    worker = harness.worker(concurrency=2, DLQ_TEST_PREFETCH="64")
    main = psutil.Process(worker.proc.pid)
    store = DelayedStore(harness.redis, Keys(harness.prefix))

    def send(n):
        with harness.app.producer_or_acquire() as producer:
            for i in range(n):
                harness.app.send_task("proj.park_long", args=(i,), queue=harness.queue, producer=producer)

    send(1000)  # warm up: imports, pools, caches
    harness.wait_until(lambda: store.count() >= 1000, timeout=120, message="1000 parked")
    before = main.memory_info().rss
    send(20_000)
    harness.wait_until(lambda: store.count() >= 21_000, timeout=400, message="21000 parked")
    after = main.memory_info().rss
    growth_mb = (after - before) / 2**20
    print(f"worker main-process RSS growth for 20,000 parked retries: {growth_mb:.2f} MiB")
    assert growth_mb < 10, growth_mb
    assert harness.redis.llen(harness.queue) == 0
    assert store.next_due() > time.time() + 3000


def test_when_the_moving_worker_is_killed_another_takes_over_within_the_lease(harness):
    """SIGKILL the worker holding the mover lease: the standby takes the lease over once it expires, at most
    ``dlq_mover_lease`` after the kill (the holder renewed it last before the kill), and moves what came due."""
    lease = 3.0
    conf = json.dumps({"dlq_mover_lease": lease})
    workers = [harness.worker(name=name, concurrency=1, DLQ_TEST_CONF=conf) for name in "abc"]
    keys = Keys(harness.prefix)
    harness.wait_until(lambda: harness.redis.get(keys.mover_lease) and harness.redis.get(keys.mover_standby),
                       timeout=60, message="a holder and a standby")
    holder = harness.redis.get(keys.mover_lease).decode()
    [victim] = [w for w in workers if w.proc.pid == int(holder.split(":")[-2])]
    ids = park_noop_messages(harness, 20, due=time.time() + 1.0)   # due while nobody holds the lease
    victim.proc.kill()
    killed_at = time.time()
    harness.wait_until(lambda: (harness.redis.get(keys.mover_lease) or holder.encode()).decode() != holder,
                       timeout=30, message="another worker holds the lease")
    took_over = time.time() - killed_at
    print(f"lease {lease}s: taken over {took_over:.2f}s after the SIGKILL")
    assert took_over <= lease + 2.0, "the bound is the lease (plus a round trip; 2 s of slack for a busy machine)"
    harness.wait_until(lambda: len(harness.deliveries()) >= 20, timeout=30, message="20 deliveries")
    assert {r["id"] for r in harness.deliveries()} == set(ids)
    new_holder = harness.redis.get(keys.mover_lease).decode()
    [heir] = [w for w in workers if w.proc.pid == int(new_holder.split(":")[-2])]
    assert "this worker moves due messages now" in heir.log()
