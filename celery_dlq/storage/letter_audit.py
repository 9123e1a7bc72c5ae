"""The dead-letter audit (ActiveMQ's DLQ audit): one key per (task id, delivery, delivery tag) of a message
being dead-lettered, ``pending`` around its publish, then ``done``
(:mod:`celery_dlq.worker.deadletter.dead_letterer`)."""
from __future__ import annotations

from typing import Any

from celery_dlq.storage.keys import Stat

PENDING, DONE = b"pending", b"done"


class LetterAudit:
    """The audit keys on the store's ``client``, each living ``ttl_s`` seconds."""

    def __init__(self, client: Any, ttl_s: int) -> None:
        self.client, self.ttl_s = client, ttl_s

    def begin(self, key: str) -> bool:
        """Mark ``key`` pending (``SET NX``); False when it was there already."""
        return bool(self.client.set(key, PENDING, nx=True, ex=self.ttl_s))

    def done_already(self, key: str, stats: str) -> bool:
        """Whether ``key`` says its letter is stored; then counted as a duplicate in ``stats`` (a second round
        trip, only for a duplicate)."""
        if self.client.get(key) != DONE:
            return False
        self.client.hincrby(stats, Stat.DUPLICATES, 1)
        return True

    def done(self, key: str) -> Any:
        """A pipeline on the store's client with ``key`` marked done queued: the recorder's counts join it."""
        pipe = self.client.pipeline(transaction=False)
        pipe.set(key, DONE, ex=self.ttl_s)
        return pipe
