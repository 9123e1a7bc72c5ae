"""Failed logins counted in Redis, per client address and per user, so every dashboard process shares the limit.

After ``limit`` failures (5 by default) within ``window`` seconds (15
minutes), counted from the first, the address or user is refused for the
rest of the window, a right password included: the (limit + 1)-th try is
not even checked. A successful login clears its user's count (not its
address's, so one known account cannot reset the count of a password
guesser). Both the login form and ``Authorization`` headers count.

A per-user limit also lets anyone lock a user out for a window by guessing
wrong on purpose; that is the price of stopping a slow guesser who moves
between addresses, and the same trade Django's and Sidekiq's lockouts make.
"""
from __future__ import annotations

from typing import Any

from celery_dlq.redis.keys import Keys

#: Failed logins allowed per address and per user in one window.
LOGIN_LIMIT = 5
#: The window, in seconds, from the first failure.
LOGIN_WINDOW = 15 * 60


class LoginThrottle:
    """``blocked(address, user)`` before checking a password; ``failed`` or ``succeeded`` after."""

    def __init__(self, client: Any, keys: Keys, limit: int = LOGIN_LIMIT, window: int = LOGIN_WINDOW) -> None:
        self.client, self.keys, self.limit, self.window = client, keys, limit, window

    def _keys(self, address: str, user: str | None) -> list[str]:
        keys = [self.keys.web_login_failures("addr", address or "unknown")]
        if user:
            keys.append(self.keys.web_login_failures("user", user[:200]))
        return keys

    def blocked(self, address: str, user: str | None) -> bool:
        """Whether the address or the user has used up its failures for the window."""
        counts = self.client.mget(self._keys(address, user))
        return any(count is not None and int(count) >= self.limit for count in counts)

    def failed(self, address: str, user: str | None) -> None:
        """Count one failure for the address and the user; the window starts at the first."""
        pipe = self.client.pipeline(transaction=True)
        for key in self._keys(address, user):
            pipe.set(key, 0, ex=self.window, nx=True)
            pipe.incr(key)
        pipe.execute()

    def succeeded(self, user: str) -> None:
        self.client.delete(self.keys.web_login_failures("user", user[:200]))
