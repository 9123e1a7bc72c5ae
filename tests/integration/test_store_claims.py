"""The parked store under concurrent claimers, on a real redis-server."""
from __future__ import annotations

import threading

from celery_dlq.storage.store import ParkedStore
from tests.unit.test_store import T0, FakeClock, clock, drop_keys, make_store, raw_state, store  # noqa: F401  (fixtures and helpers)


def test_concurrent_claimers_claim_each_entry_exactly_once(real_redis):
    store = make_store(real_redis)
    try:
        for i in range(1000):
            store.park(f"e{i}", b"p", f"q{i % 5}", due=T0)
        claimed_by: list[list[str]] = [[] for _ in range(4)]
        failed_acks: list[str] = []
        barrier = threading.Barrier(4)

        def mover(n: int) -> None:
            mine = ParkedStore(real_redis, store.keys, clock=FakeClock())
            barrier.wait()
            while batch := mine.claim_due(limit=7, lease=600, now=T0):
                for claimed in batch:
                    claimed_by[n].append(claimed.entry_id)
                    if not mine.ack(claimed):
                        failed_acks.append(claimed.entry_id)

        threads = [threading.Thread(target=mover, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        all_claims = [e for ids in claimed_by for e in ids]
        assert failed_acks == []
        assert sorted(all_claims) == sorted(f"e{i}" for i in range(1000))
        assert store.count() == 0
        assert store.counts_by_queue() == {}
        assert raw_state(store)["payloads"] == {}
    finally:
        drop_keys(store)


