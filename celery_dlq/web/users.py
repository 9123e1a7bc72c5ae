"""The dashboard's users and roles: who may log in, with what password, and what each role may do.

Pure (hashlib, hmac; no Starlette, no Redis), so ``celery dlq web-passwd``
uses it without the web extra. A user is a line (of ``--users-file``, of
``$CELERY_DLQ_WEB_USERS``, or a ``--basic-auth`` value):

- ``user:password``: an admin (what every user was before roles);
- ``user:role:password``: ``role`` is ``viewer``, ``operator`` or ``admin``;
- the password may be a hash, ``pbkdf2_sha256$<iterations>$<salt>$<base64 hash>``
  (:func:`hash_password`; ``celery dlq web-passwd`` prints one).

A viewer reads; an operator may also replay (or edit and replay) dead letters, pause,
resume or cancel jobs (a purge's job: an admin only), and redeliver parked retries; an
admin may also purge dead letters, delete parked retries and revoke sessions (:data:`ACTIONS`).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

VIEWER, OPERATOR, ADMIN = "viewer", "operator", "admin"
#: Lowest first: a role may do everything the roles before it may.
ROLES = (VIEWER, OPERATOR, ADMIN)
#: Each action and the lowest role that may take it.
ACTIONS = {"replay": OPERATOR, "redeliver": OPERATOR, "edit": OPERATOR, "job": OPERATOR, "pause": OPERATOR,
           "resume": OPERATOR, "purge": ADMIN,
           "delete": ADMIN, "revoke": ADMIN}
#: The user name of the token login (``Authorization: Bearer``, or the login form with this user).
TOKEN_USER = "token"
HASH_SCHEME = "pbkdf2_sha256"
#: OWASP's 2023 figure for PBKDF2-HMAC-SHA256.
HASH_ITERATIONS = 600_000


def may(role: str | None, action: str) -> bool:
    """Whether ``role`` may take ``action`` (an unknown action or role: no)."""
    if role not in ROLES or action not in ACTIONS:
        return False
    return ROLES.index(role) >= ROLES.index(ACTIONS[action])


def hash_password(password: str, *, iterations: int = HASH_ITERATIONS, salt: str | None = None) -> str:
    """``pbkdf2_sha256$<iterations>$<salt>$<base64 of PBKDF2-HMAC-SHA256(password, salt)>``."""
    salt = salt or secrets.token_hex(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt.encode(), iterations)
    return f"{HASH_SCHEME}${iterations}${salt}${base64.b64encode(digest).decode()}"


def credential_tag(user: str, stored: str) -> str:
    """What a session records of the credential it was opened with, so a changed password or token ends it.

    A slow, salted, truncated derivation of the stored password (plain or hash)
    or token: Redis never holds the password, and what it holds is costly to
    guess from. Computed once per user when the dashboard starts.
    """
    return hashlib.pbkdf2_hmac("sha256", stored.encode(), f"celery-dlq-session:{user}".encode(), 20_000).hex()[:16]


def _is_hash(secret: str) -> bool:
    parts = secret.split("$")
    return (len(parts) == 4 and parts[0] == HASH_SCHEME and parts[1].isdigit() and int(parts[1]) > 0
            and all(parts[2:]))


def hash_iterations(stored: str) -> int | None:
    """The iteration count of a stored hash; None for a plain password."""
    return int(stored.split("$")[1]) if _is_hash(stored) else None


def check(stored: str, given: str) -> bool:
    """``given`` against a stored password or hash, in constant time."""
    if _is_hash(stored):
        _, iterations, salt, _ = stored.split("$")
        return hmac.compare_digest(hash_password(given, iterations=int(iterations), salt=salt).encode(),
                                   stored.encode())
    return hmac.compare_digest(given.encode(), stored.encode())


@dataclass(frozen=True)
class User:
    name: str
    role: str
    password: str   # as given: plain text or a hash

    def __repr__(self) -> str:   # never the password, not even in a traceback
        return f"User({self.name!r}, role={self.role!r})"


def parse_user(line: str, where: str = "--basic-auth") -> User:
    """``user:password`` (an admin) or ``user:role:password``; ``where`` names the source in errors."""
    name, sep, rest = line.partition(":")
    role, sep2, password = rest.partition(":")
    if not (sep2 and role in ROLES):
        role, password = ADMIN, rest
    if not sep or not name or not password:
        raise ValueError(f"{where} takes user:password or user:role:password (both non-empty; role one of "
                         f"{', '.join(ROLES)})")
    if name == TOKEN_USER:
        raise ValueError(f"the user name {TOKEN_USER!r} is reserved for the token login")
    if password.startswith(HASH_SCHEME + "$") and not _is_hash(password):
        raise ValueError(f"{where}: user {name!r} has a malformed {HASH_SCHEME} hash")
    return User(name, role, password)


def parse_users(lines: Iterable[str], where: str = "--basic-auth") -> dict[str, User]:
    """Users by name; blank lines and lines starting with ``#`` are skipped; a name given twice is an error."""
    users: dict[str, User] = {}
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user = parse_user(line, where)
        if user.name in users:
            raise ValueError(f"{where}: user {user.name!r} is given twice")
        users[user.name] = user
    return users


def read_users_file(path: str | Path) -> dict[str, User]:
    """The users of a file of lines (see the module's documentation)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read the users file {path}: {exc.strerror}") from None
    return parse_users(text.splitlines(), f"users file {path}")
