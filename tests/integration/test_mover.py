"""Movers sharing one store, a mover dying mid-move, and memory with many parked retries."""
from __future__ import annotations

import json
import time
from collections import Counter

import psutil
import pytest

from celery_dlq.storage.keys import Keys
from celery_dlq.storage.store import ParkedStore

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
    store = ParkedStore(harness.redis, Keys(harness.prefix))
    assert store.count() == 0
    assert redelivered == 1000
    movers = [w.log().count("celery-dlq mover: moving") for w in harness.workers]
    assert movers == [1, 1]


def test_entries_claimed_by_a_dead_mover_are_redelivered_after_the_lease(harness):
    harness.worker()  # running first, so its start-up time cannot eat into the lease
    due = time.time() + 1.0
    ids = park_noop_messages(harness, 20, due=due)
    dead_mover = ParkedStore(harness.redis, Keys(harness.prefix))
    # Claim as of the due time, before the live mover may: ...and then die (no publish, no ack).
    claimed = dead_mover.claim_due(limit=100, lease=2.0, now=due)
    assert len(claimed) == 20
    lease_until = claimed[0].lease_until
    time.sleep(max(0.0, lease_until - 0.5 - time.time()))
    assert harness.deliveries() == [], "a leased entry must not move before its lease expires"
    harness.wait_until(lambda: len(harness.deliveries()) >= 20, timeout=30)
    assert min(r["at"] for r in harness.deliveries()) >= lease_until - 0.05
    assert {r["id"] for r in harness.deliveries()} == set(ids)
    assert ParkedStore(harness.redis, Keys(harness.prefix)).count() == 0


@pytest.mark.slow
def test_20000_parked_retries_do_not_grow_the_worker(harness):
    worker = harness.worker(concurrency=2, DLQ_TEST_PREFETCH="64")
    main = psutil.Process(worker.proc.pid)
    store = ParkedStore(harness.redis, Keys(harness.prefix))

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


@pytest.mark.slow
@pytest.mark.parametrize("workers, killed", [(4, "the holder and another"), (6, "all but one")])
def test_whichever_workers_are_killed_a_survivor_moves_within_the_lease(harness, workers, killed):
    """100 retries parked for 3 s; while they wait, SIGKILL the holder of the mover lease and another worker,
    or all but one of six (the holder among them): every retry is delivered at most ``dlq_mover_lease``
    (+ 2 s of slack for a busy machine) after it came due. Every worker beats and takes a free lease, so no
    standby's death stretches the takeover."""
    lease = 3.0
    conf = json.dumps({"dlq_mover_lease": lease})
    started = [harness.worker(name=f"w{i}", concurrency=1, wait_ready=False, DLQ_TEST_CONF=conf)
               for i in range(workers)]
    for worker in started:
        worker.wait_for_log("ready.", timeout=90)
    keys = Keys(harness.prefix)
    harness.wait_until(lambda: harness.redis.get(keys.mover_lease), timeout=30, message="a lease holder")
    holder = harness.redis.get(keys.mover_lease).decode()
    [victim] = [w for w in started if w.proc.pid == int(holder.split(":")[-2])]
    others = [w for w in started if w is not victim]
    victims = [victim] + (others[:1] if killed == "the holder and another" else others[:-1])
    due = time.time() + 3.0
    ids = park_noop_messages(harness, 100, due=due)
    time.sleep(max(0.0, due - 0.5 - time.time()))   # killed just before they come due
    for worker in victims:
        worker.proc.kill()
    harness.wait_until(lambda: len(harness.deliveries()) >= 100, timeout=60, message="100 deliveries")
    rows = harness.deliveries()
    assert {r["id"] for r in rows} == set(ids) and len(rows) == 100
    late = max(r["at"] for r in rows) - due
    print(f"\n{killed} of {workers} killed: the last retry ran {late:.2f}s after its due time (lease {lease}s)")
    assert late <= lease + 2.0
    survivors = [w for w in started if w not in victims]
    new_holder = harness.redis.get(keys.mover_lease).decode()
    assert new_holder != holder and any(w.proc.pid == int(new_holder.split(":")[-2]) for w in survivors)
