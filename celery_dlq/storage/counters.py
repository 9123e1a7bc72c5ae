"""Persisted delivery counts (``persist_delivery_count_before_delivery``), kept per consumed message instance.

A counter only matters while its message may be delivered again (a lost
worker, kombu's visibility timeout), so it is deleted once the message is
acknowledged, and expires after ``dlq_delivery_count_ttl`` otherwise. Only
messages kombu marks ``redelivered`` are counted here: a first delivery's
number is the one its header carries, and costs no Redis call.
"""
from __future__ import annotations

import collections
import math
from collections.abc import Iterable
from typing import Any

from celery_dlq.storage.scripts import Scripts
from celery_dlq.storage.sharding import Shards


class DeliveryCounters:
    """Count, take back and forget the deliveries of message instances (task id + delivery tag)."""

    def __init__(self, client: Any, shards: Shards, scripts: Scripts, ttl: float) -> None:
        if not ttl > 0:
            raise ValueError(f"ttl must be > 0, got {ttl!r}")
        self.client, self.shards, self.scripts = client, shards, scripts
        self.ttl_s = max(1, math.ceil(ttl))  # EXPIRE takes whole seconds
        self._spent: collections.deque[str] = collections.deque()

    def key(self, task_id: str, tag: Any) -> str:
        """The counter of one message instance, in its task's shard."""
        return self.shards.of(task_id).delivery_count(f"{task_id}:{tag}" if isinstance(tag, str) and tag else task_id)

    def count(self, task_id: str, tag: Any, floor: int) -> int:
        """Count a repeated (``redelivered``) delivery of a message instance and return its number.

        A missing counter means the instance was delivered once, unrecorded,
        so this is ``floor + 1``. ``floor`` is the delivery number the
        message's own header claims: the count never drops below it, so a
        lost key never grants a message extra attempts (``lua/count_delivery.lua``).
        """
        if int(floor) < 1:
            raise ValueError(f"floor must be >= 1, got {floor!r}")
        return int(self.scripts.run("count_delivery", [self.key(task_id, tag)], [int(floor), self.ttl_s]))

    def forget(self, task_id: str, tag: Any) -> None:
        """The message was acknowledged: queue its counter for deletion by :meth:`flush` (off the consumer's path).

        Left alone, every delivery would leave one behind for the TTL: at
        1,000 tasks/s and 7 days, hundreds of millions of keys.
        """
        self._spent.append(self.key(task_id, tag))

    def uncount(self, messages: Iterable[tuple[str, Any, int]]) -> None:
        """``(task id, delivery tag, delivery number)`` of messages that never started: take those deliveries back.

        Each counter is set to one less than the delivery it recorded (0 for a
        first delivery), so the message's next, restored delivery counts as
        the same number again.
        """
        pipe = self.client.pipeline(transaction=False)
        for task_id, tag, delivery in messages:
            pipe.set(self.key(task_id, tag), max(0, int(delivery) - 1), ex=self.ttl_s)
        pipe.execute()

    def flush(self, batch: int = 1000) -> int:
        """Delete the counters of acknowledged messages, ``batch`` keys per round trip."""
        deleted = 0
        while self._spent:
            keys: list[str] = []
            while self._spent and len(keys) < batch:
                keys.append(self._spent.popleft())
            self.client.unlink(*keys)
            deleted += len(keys)
        return deleted
