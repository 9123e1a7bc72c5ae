"""Who may use the dashboard, and proof that a POST came from its own form.

Three ways in, chosen when the app is built (:class:`Access`):

- basic auth, several ``user:password`` pairs (as Flower's ``--basic-auth``):
  an ``Authorization: Basic`` header, or the login form, which sets a signed
  session cookie;
- a token (setting ``dlq_web_token`` or ``CELERY_DLQ_WEB_TOKEN``):
  ``Authorization: Bearer <token>``, or the login form with user ``token``;
- nothing, only when asked for (``no_auth``) and only for clients on the
  loopback interface.

Every state-changing request is a POST carrying a CSRF token: an HMAC of a
random per-browser nonce kept in an HttpOnly, SameSite=Strict cookie (a
double-submit token another site can neither read nor compute). Passwords
and tokens are compared in constant time and never logged.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
import time
from dataclasses import dataclass, field
from typing import Iterable

SESSION_COOKIE = "dlq_session"
CSRF_COOKIE = "dlq_csrf"
CSRF_FIELD = "csrf_token"
TOKEN_USER = "token"
#: A login lasts this long (seconds).
SESSION_TTL = 12 * 3600


def parse_users(pairs: Iterable[str]) -> dict[str, str]:
    """``["alice:pw", ...]`` -> ``{"alice": "pw"}``; a pair without ``:`` or an empty name is an error."""
    users: dict[str, str] = {}
    for pair in pairs:
        user, sep, password = pair.partition(":")
        if not sep or not user or not password:
            raise ValueError("--basic-auth takes user:password (both non-empty)")
        if user == TOKEN_USER:
            raise ValueError(f"the user name {TOKEN_USER!r} is reserved for the token login")
        users[user] = password
    return users


def is_loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


@dataclass
class Access:
    """The dashboard's credentials and signing secret (a random one per process unless given)."""

    users: dict[str, str] = field(default_factory=dict)
    token: str | None = None
    no_auth: bool = False
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    def __post_init__(self) -> None:
        if not (self.users or self.token or self.no_auth):
            raise ValueError("the dashboard needs credentials: basic_auth users, a token "
                             "(dlq_web_token / CELERY_DLQ_WEB_TOKEN), or no_auth=True on 127.0.0.1")

    def check_password(self, user: str, password: str) -> bool:
        if user == TOKEN_USER:
            return self.token is not None and _equal(password, self.token)
        expected = self.users.get(user)
        return expected is not None and _equal(password, expected)

    def from_header(self, header: str | None) -> str | None:
        """The user an ``Authorization`` header proves; None when absent or wrong."""
        scheme, _, value = (header or "").partition(" ")
        if scheme.lower() == "bearer":
            return TOKEN_USER if self.token is not None and _equal(value.strip(), self.token) else None
        if scheme.lower() != "basic":
            return None
        try:
            user, _, password = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        return user if self.check_password(user, password) else None

    def _sign(self, text: str) -> str:
        return hmac.new(self.secret, text.encode(), hashlib.sha256).hexdigest()

    def session(self, user: str, now: float | None = None) -> str:
        """A session cookie value for ``user``: name, expiry and their HMAC."""
        expires = int((time.time() if now is None else now) + SESSION_TTL)
        body = f"{base64.urlsafe_b64encode(user.encode()).decode()}.{expires}"
        return f"{body}.{self._sign('session:' + body)}"

    def from_session(self, cookie: str | None, now: float | None = None) -> str | None:
        """The user of a valid, unexpired session cookie; None otherwise."""
        body, _, signature = (cookie or "").rpartition(".")
        if not body or not _equal(signature, self._sign("session:" + body)):
            return None
        name, _, expires = body.partition(".")
        if not expires.isdigit() or int(expires) < (time.time() if now is None else now):
            return None
        user = base64.urlsafe_b64decode(name.encode()).decode("utf-8")
        return user if user in self.users or (user == TOKEN_USER and self.token) else None

    def csrf_token(self, nonce: str) -> str:
        return self._sign("csrf:" + nonce)

    def csrf_ok(self, nonce: str | None, token: str | None) -> bool:
        return bool(nonce) and bool(token) and _equal(str(token), self.csrf_token(str(nonce)))


def new_nonce() -> str:
    return secrets.token_urlsafe(24)
