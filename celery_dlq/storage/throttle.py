"""Failed dashboard logins counted in Redis, per client address and per user name (:mod:`celery_dlq.web.throttle`).

Two scripts, each one atomic step: ``lua/login_take.lua`` takes a try of the
address and, only when the address had one left, of the user (a refused try
writes no key for its user name); ``lua/login_succeeded.lua`` gives the
address's try back and clears the user's count.
"""
from __future__ import annotations

from typing import Any

from celery_dlq.storage.keys import Keys
from celery_dlq.storage.scripts import Scripts


class ThrottleStore:
    """The failed-login counters of one key set, shared by every dashboard process on it."""

    def __init__(self, client: Any, keys: Keys, scripts: Scripts | None = None) -> None:
        self.client, self.keys = client, keys
        self.scripts = scripts if scripts is not None else Scripts(client)

    def address_key(self, address: str) -> str:
        return self.keys.web_login_failures("addr", address or "unknown")

    def user_key(self, user: str) -> str:
        return self.keys.web_login_failures("user", user[:200])

    def take(self, address: str, user: str | None, *, limit: int, window: int) -> bool:
        """One try of ``address`` then of ``user`` (None: the address only); False when either had none left."""
        keys = [self.address_key(address), *([self.user_key(user)] if user else [])]
        return bool(int(self.scripts.run("login_take", keys, [limit, window])))

    def succeeded(self, address: str, user: str) -> None:
        """A right password of ``user`` from ``address``."""
        self.scripts.run("login_succeeded", [self.address_key(address), self.user_key(user)], [])
