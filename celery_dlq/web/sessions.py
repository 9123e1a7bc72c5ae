"""Dashboard logins kept in Redis: a random cookie, its SHA-256 in Redis, revoked at logout or by an admin.

The cookie is 32 random bytes; Redis holds only their SHA-256
(:meth:`~celery_dlq.storage.keys.Keys.web_session`), so someone who can read
Redis cannot log in with what they read. A session expires on its own after
``ttl`` seconds (12 hours by default); logging out deletes it; ``celery dlq
web-sessions --revoke USER`` deletes every one of a user. Every dashboard
process on the same Redis and key prefix sees the same sessions.

Pure redis-py (no Starlette), so the CLI uses it without the web extra.
"""
from __future__ import annotations

import builtins
import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery_dlq.storage.keys import Keys

#: A login lasts this long (seconds).
SESSION_TTL = 12 * 3600


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


@dataclass(frozen=True)
class SessionInfo:
    """One live session, as ``celery dlq web-sessions`` lists it (never its cookie)."""

    digest: str
    user: str
    created: float
    expires: float
    address: str


class Sessions:
    """Create, look up, end and revoke dashboard sessions in ``client`` under ``keys``."""

    def __init__(self, client: Any, keys: Keys, ttl: int = SESSION_TTL,
                 clock: Callable[[], float] = time.time) -> None:
        self.client, self.keys, self.ttl, self.clock = client, keys, ttl, clock

    def create(self, user: str, address: str = "", tag: str = "") -> str:
        """A new session of ``user``: the cookie value to send (the only place it exists). ``tag``: what it
        records of the credential it was opened with (:meth:`~celery_dlq.web.auth.Access.tag`)."""
        session_id = secrets.token_urlsafe(32)
        digest, now = _digest(session_id), self.clock()
        key = self.keys.web_session(digest)
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(key, mapping={"user": user, "created": now, "expires": now + self.ttl, "address": address,
                                "tag": tag})
        pipe.expire(key, self.ttl)
        pipe.zadd(self.keys.web_sessions, {digest: now + self.ttl})
        pipe.zremrangebyscore(self.keys.web_sessions, "-inf", now)
        pipe.execute()
        return session_id

    def user(self, session_id: str | None) -> str | None:
        """The user of a live session; None when absent, ended, revoked or expired."""
        found = self.lookup(session_id)
        return found[0] if found else None

    def lookup(self, session_id: str | None) -> tuple[str, str] | None:
        """``(user, credential tag)`` of a live session; None when absent, ended, revoked or expired."""
        if not session_id or len(session_id) > 128:
            return None
        user, expires, tag = self.client.hmget(self.keys.web_session(_digest(session_id)), "user", "expires", "tag")
        if user is None or expires is None or float(expires) <= self.clock():
            return None
        return user.decode(), (tag or b"").decode()

    def end(self, session_id: str | None) -> None:
        """Log out: the session is gone for every process."""
        if session_id and len(session_id) <= 128:
            self._delete([_digest(session_id)])

    def list(self) -> list[SessionInfo]:
        """Every live session, oldest first."""
        now = self.clock()
        digests = [d.decode() for d in self.client.zrangebyscore(self.keys.web_sessions, now, "+inf")]
        pipe = self.client.pipeline(transaction=False)
        for digest in digests:
            pipe.hmget(self.keys.web_session(digest), "user", "created", "expires", "address")
        out = []
        for digest, fields in zip(digests, pipe.execute()):
            if fields[0] is not None:
                user, created, expires, address = (f.decode() if f is not None else "" for f in fields)
                out.append(SessionInfo(digest, user, float(created or 0), float(expires or 0), address))
        return sorted(out, key=lambda s: s.created)

    def revoke(self, user: str) -> int:
        """End every session of ``user``; how many there were."""
        digests = [s.digest for s in self.list() if s.user == user]
        self._delete(digests)
        return len(digests)

    def _delete(self, digests: builtins.list[str]) -> None:
        if not digests:
            return
        pipe = self.client.pipeline(transaction=True)
        for digest in digests:
            pipe.delete(self.keys.web_session(digest))
        pipe.zrem(self.keys.web_sessions, *digests)
        pipe.execute()
