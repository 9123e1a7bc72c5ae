"""Who may use the dashboard, with which role, and proof that a POST came from its own form.

Ways in, chosen when the app is built (:class:`Access`):

- users (:mod:`~celery_dlq.web.users`: ``--users-file``,
  ``$CELERY_DLQ_WEB_USERS``, ``--basic-auth``), each with a role: an
  ``Authorization: Basic`` header, or the login form, which starts a session
  kept in Redis (:mod:`~celery_dlq.web.sessions`);
- a token (setting ``dlq_web_token`` or ``CELERY_DLQ_WEB_TOKEN``):
  ``Authorization: Bearer <token>``, or the login form with user ``token``;
  its role is ``token_role`` (admin unless told otherwise);
- nothing, only when asked for (``no_auth``) and only for clients on the
  loopback interface; they are admins (viewers with ``read_only``).

``read_only`` makes everyone a viewer. Every state-changing request is a
POST carrying a CSRF token: an HMAC of a random per-browser nonce kept in
an HttpOnly, SameSite=Strict cookie (a double-submit token another site can
neither read nor compute), bound to the session and user it was shown to
(a token of one session is refused in another). Passwords and tokens are
compared in constant time and never logged; an unknown user name costs the
same key derivation as a known one (:func:`decoy_password`).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass, field

from celery_dlq.web.users import (
    ADMIN,
    ROLES,
    TOKEN_USER,
    VIEWER,
    User,
    check,
    credential_tag,
    hash_iterations,
    hash_password,
)

SESSION_COOKIE = "dlq_session"
CSRF_COOKIE = "dlq_csrf"
CSRF_FIELD = "csrf_token"
#: How many right user and password pairs are remembered (then forgotten all at once).
VERIFIED_MAX = 1024
#: The user of a ``no_auth`` dashboard (a loopback client).
LOCAL_USER = "local"


def is_loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@dataclass
class Access:
    """The dashboard's credentials, roles and signing secret (a random one per process unless given)."""

    users: dict[str, User] = field(default_factory=dict)
    token: str | None = field(default=None, repr=False)     # never in a log line or a traceback
    no_auth: bool = False
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    token_role: str = ADMIN
    read_only: bool = False
    _tags: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    #: HMACs (keyed with ``secret``) of user and password pairs checked right: a script's ``Authorization``
    #: header then costs one HMAC per request, not 600,000 PBKDF2 rounds.
    _verified: set[str] = field(default_factory=set, init=False, repr=False)
    #: What each user's password is checked against (:func:`decoy_password`), and the unknown user's decoy.
    _checked: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    _decoy: str = field(default="", init=False, repr=False)

    def __post_init__(self) -> None:
        if not (self.users or self.token or self.no_auth):
            raise ValueError("the dashboard needs credentials: users (--users-file, CELERY_DLQ_WEB_USERS, "
                             "--basic-auth), a token (dlq_web_token / CELERY_DLQ_WEB_TOKEN), or no_auth=True "
                             "on 127.0.0.1")
        if self.token_role not in ROLES:
            raise ValueError(f"token_role must be one of {', '.join(ROLES)}, not {self.token_role!r}")
        self._tags = {name: credential_tag(name, user.password) for name, user in self.users.items()}
        self._checked, self._decoy = decoy_password(self.users)
        if self.token is not None:
            self._tags[TOKEN_USER] = credential_tag(TOKEN_USER, self.token)

    def tag(self, user: str) -> str:
        """The credential tag a session of ``user`` must carry (:func:`~celery_dlq.web.users.credential_tag`)."""
        return self._tags.get(user, "")

    def session_ok(self, user: str | None, tag: str) -> bool:
        """A session of ``user`` opened with the credential ``user`` has now (a changed password or token: no)."""
        return self.known(user) and bool(tag) and hmac.compare_digest(tag.encode(), self.tag(str(user)).encode())

    def check_password(self, user: str, password: str) -> bool:
        if user == TOKEN_USER:
            return self.token is not None and hmac.compare_digest(password.encode(), self.token.encode())
        seen = self._sign(f"password:{user}\0{password}")
        if seen in self._verified:
            return True
        known = user in self.users
        ok = check(self._checked[user] if known else self._decoy, password) and known
        if ok:
            if len(self._verified) >= VERIFIED_MAX:
                self._verified.clear()
            self._verified.add(seen)
        return ok

    def known(self, user: str | None) -> bool:
        """Whether ``user`` may still log in (a session outlives neither its user nor the token)."""
        return user in self.users or (user == TOKEN_USER and self.token is not None) or (
            user == LOCAL_USER and self.no_auth)

    def role(self, user: str | None) -> str | None:
        """``user``'s role now (so a changed role applies to open sessions); None for nobody."""
        if not self.known(user):
            return None
        if self.read_only:
            return VIEWER
        if user == TOKEN_USER:
            return self.token_role
        return self.users[user].role if user in self.users else ADMIN

    @staticmethod
    def credentials(header: str | None) -> tuple[str, str] | None:
        """``(user, password)`` of an ``Authorization`` header (``("token", <token>)`` for Bearer); None if none."""
        scheme, _, value = (header or "").partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return TOKEN_USER, value.strip()
        if scheme.lower() != "basic":
            return None
        try:
            user, sep, password = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        return (user, password) if sep else None

    def _sign(self, text: str) -> str:
        return hmac.new(self.secret, text.encode(), hashlib.sha256).hexdigest()

    def csrf_token(self, nonce: str, binding: str = "") -> str:
        """The token of the browser's ``nonce``, bound to ``binding`` (:func:`csrf_binding`: its session and user)."""
        return self._sign(f"csrf:{nonce}\0{binding}")

    def csrf_ok(self, nonce: str | None, token: str | None, binding: str = "") -> bool:
        return bool(nonce) and bool(token) and hmac.compare_digest(str(token).encode(),
                                                                   self.csrf_token(str(nonce), binding).encode())


def csrf_binding(user: str | None, session_id: str | None) -> str:
    """What a CSRF token is bound to: the user it was shown to and the session cookie it came with."""
    return f"{user or ''}\0{session_id or ''}"


def decoy_password(users: dict[str, User]) -> tuple[dict[str, str], str]:
    """What each user's password is checked against, and the decoy an unknown user name is checked against,
    so that both cost the same key derivation: login time does not tell which user names exist.

    Without a hashed password among the users every check is a plain comparison (the decoy too). With one,
    the decoy is hashed with the same scheme and the largest iteration count among the users, and plain
    passwords are hashed alike once, in memory, when the dashboard starts (so a plain user is not answered
    faster than an unknown one). A hash made with fewer iterations than the others still answers faster:
    ``celery dlq web-passwd`` gives every user the same count."""
    counts = [n for n in (hash_iterations(user.password) for user in users.values()) if n]
    if not counts:
        return {name: user.password for name, user in users.items()}, secrets.token_hex(16)
    most = max(counts)
    checked = {name: user.password if hash_iterations(user.password) else hash_password(user.password,
                                                                                          iterations=most)
               for name, user in users.items()}
    return checked, hash_password(secrets.token_hex(16), iterations=most)


def new_nonce() -> str:
    return secrets.token_urlsafe(24)
