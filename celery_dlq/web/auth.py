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
neither read nor compute). Passwords and tokens are compared in constant
time and never logged.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass, field

from celery_dlq.web.users import ADMIN, ROLES, TOKEN_USER, VIEWER, User, check, credential_tag

SESSION_COOKIE = "dlq_session"
CSRF_COOKIE = "dlq_csrf"
CSRF_FIELD = "csrf_token"
#: How many right user and password pairs are remembered (then forgotten all at once).
VERIFIED_MAX = 1024
#: The user of a ``no_auth`` dashboard (a loopback client).
LOCAL_USER = "local"
#: Compared against when the user is unknown, so a wrong name is not answered faster than a wrong plain password.
_NOBODY = User("", VIEWER, secrets.token_hex(16))


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

    def __post_init__(self) -> None:
        if not (self.users or self.token or self.no_auth):
            raise ValueError("the dashboard needs credentials: users (--users-file, CELERY_DLQ_WEB_USERS, "
                             "--basic-auth), a token (dlq_web_token / CELERY_DLQ_WEB_TOKEN), or no_auth=True "
                             "on 127.0.0.1")
        if self.token_role not in ROLES:
            raise ValueError(f"token_role must be one of {', '.join(ROLES)}, not {self.token_role!r}")
        self._tags = {name: credential_tag(name, user.password) for name, user in self.users.items()}
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
        known = self.users.get(user)
        ok = check((known or _NOBODY).password, password) and known is not None
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

    def csrf_token(self, nonce: str) -> str:
        return self._sign("csrf:" + nonce)

    def csrf_ok(self, nonce: str | None, token: str | None) -> bool:
        return bool(nonce) and bool(token) and hmac.compare_digest(str(token).encode(),
                                                                   self.csrf_token(str(nonce)).encode())


def new_nonce() -> str:
    return secrets.token_urlsafe(24)
