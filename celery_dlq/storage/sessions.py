"""Dashboard sessions in Redis: one HASH per login under the SHA-256 of its cookie, and a ZSET to list them.

The I/O of :mod:`celery_dlq.web.sessions` (which makes the cookie and decides
what a live session is): one method per operation. A session's HASH
(:meth:`~celery_dlq.storage.keys.Keys.web_session`) expires on its own; the
ZSET (:attr:`~celery_dlq.storage.keys.Keys.web_sessions`) maps each digest to
its expiry, so sessions are listed and revoked without a SCAN.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from celery_dlq.storage.keys import Keys

#: The fields :meth:`SessionStore.read` gives back, in order.
FIELDS = ("user", "created", "expires", "address", "tag")


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


class SessionStore:
    """The sessions of one key set (the home set of ``dlq_redis_url``)."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self.client, self.keys = client, keys

    def create(self, digest: str, fields: Mapping[str, Any], *, now: float, ttl: int) -> None:
        """Store one session (its HASH expiring in ``ttl`` seconds) and drop the listing's expired digests."""
        key = self.keys.web_session(digest)
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(key, mapping=dict(fields))
        pipe.expire(key, ttl)
        pipe.zadd(self.keys.web_sessions, {digest: now + ttl})
        pipe.zremrangebyscore(self.keys.web_sessions, "-inf", now)
        pipe.execute()

    def read(self, digest: str) -> dict[str, str | None]:
        """One session's :data:`FIELDS` (each None when absent: no such session)."""
        values = self.client.hmget(self.keys.web_session(digest), *FIELDS)
        return {name: _text(value) for name, value in zip(FIELDS, values)}

    def live(self, now: float) -> list[tuple[str, dict[str, str | None]]]:
        """Every session listed as expiring after ``now``: ``(digest, fields)``, those whose HASH is gone left out."""
        digests = [_text(d) or "" for d in self.client.zrangebyscore(self.keys.web_sessions, now, "+inf")]
        pipe = self.client.pipeline(transaction=False)
        for digest in digests:
            pipe.hmget(self.keys.web_session(digest), *FIELDS)
        out = []
        for digest, values in zip(digests, pipe.execute() if digests else []):
            if values[0] is not None:
                out.append((digest, {name: _text(value) for name, value in zip(FIELDS, values)}))
        return out

    def delete(self, digests: Iterable[str]) -> None:
        """End the sessions ``digests`` (their HASHes and their listing) at once."""
        digests = list(digests)
        if not digests:
            return
        pipe = self.client.pipeline(transaction=True)
        for digest in digests:
            pipe.delete(self.keys.web_session(digest))
        pipe.zrem(self.keys.web_sessions, *digests)
        pipe.execute()
