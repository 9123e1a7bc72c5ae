"""Dashboard logins kept in Redis: a random cookie, its SHA-256 in Redis, revoked at logout or by an admin.

The cookie is 32 random bytes; Redis holds only their SHA-256
(:meth:`~celery_dlq.storage.keys.Keys.web_session`), so someone who can read
Redis cannot log in with what they read. A session expires on its own after
``ttl`` seconds (12 hours by default); logging out deletes it; ``celery dlq
web-sessions --revoke USER`` deletes every one of a user. Every dashboard
process on the same Redis and key prefix sees the same sessions.

No Starlette, so the CLI uses it without the web extra; the Redis I/O is
:class:`~celery_dlq.storage.sessions.SessionStore` (``Operator.web_sessions``).
"""
from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from celery_dlq.ops.audit import Actor

if TYPE_CHECKING:
    from celery_dlq.ops.audit import Audit
    from celery_dlq.storage.sessions import SessionStore

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
    """Create, look up, end and revoke dashboard sessions (kept by ``store``, :mod:`celery_dlq.storage.sessions`)."""

    def __init__(self, store: SessionStore, ttl: int = SESSION_TTL, clock: Callable[[], float] = time.time) -> None:
        self.store, self.ttl, self.clock = store, ttl, clock

    def create(self, user: str, address: str = "", tag: str = "") -> str:
        """A new session of ``user``: the cookie value to send (the only place it exists). ``tag``: what it
        records of the credential it was opened with (:meth:`~celery_dlq.web.auth.Access.tag`)."""
        session_id = secrets.token_urlsafe(32)
        now = self.clock()
        self.store.create(_digest(session_id), {"user": user, "created": now, "expires": now + self.ttl,
                                                "address": address, "tag": tag}, now=now, ttl=self.ttl)
        return session_id

    def user(self, session_id: str | None) -> str | None:
        """The user of a live session; None when absent, ended, revoked or expired."""
        found = self.lookup(session_id)
        return found[0] if found else None

    def lookup(self, session_id: str | None) -> tuple[str, str] | None:
        """``(user, credential tag)`` of a live session; None when absent, ended, revoked or expired."""
        if not session_id or len(session_id) > 128:
            return None
        fields = self.store.read(_digest(session_id))
        user, expires = fields["user"], fields["expires"]
        if user is None or expires is None or float(expires) <= self.clock():
            return None
        return user, fields["tag"] or ""

    def end(self, session_id: str | None) -> None:
        """Log out: the session is gone for every process."""
        if session_id and len(session_id) <= 128:
            self.store.delete([_digest(session_id)])

    def list(self) -> list[SessionInfo]:
        """Every live session, oldest first."""
        out = [SessionInfo(digest, f["user"] or "", float(f["created"] or 0), float(f["expires"] or 0),
                           f["address"] or "") for digest, f in self.store.live(self.clock())]
        return sorted(out, key=lambda s: s.created)

    def revoke(self, user: str, *, audit: Audit | None = None, actor: Actor | None = None) -> int:
        """End every session of ``user``; how many there were. With ``audit``, recorded first (by ``actor``):
        a record that cannot be written refuses it, every session kept."""
        digests = [s.digest for s in self.list() if s.user == user]
        if audit is not None:
            audit.record("revoke", actor or Actor.of(), revoked_user=user, counts={"matched": len(digests)})
        self.store.delete(digests)
        return len(digests)
