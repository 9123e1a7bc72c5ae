"""Login tries counted in Redis, per client address and per user, so every dashboard process shares the limit.

Each try first takes one of the window's ``limit`` tries (5 by default,
the window 15 minutes from the first) for its address and for its user,
atomically (``INCR``), and only then is the password checked: however many
tries arrive at once, in however many processes, at most ``limit`` are
checked, and the (limit + 1)-th is refused unchecked, a right password
included. A try that succeeds gives its address's try back and clears its
user's count (not the address's, so one known account cannot reset the
count of a password guesser). The login form and ``Authorization`` headers
count alike. The token login counts per address only: five wrong
``Bearer`` headers from anywhere must not lock out every script that uses
the token.

A per-user limit also lets anyone lock a user out for a window by guessing
wrong on purpose; that is the price of stopping a slow guesser who moves
between addresses, and the same trade Django's and Sidekiq's lockouts make.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from redis.exceptions import WatchError

from celery_dlq.web.users import TOKEN_USER

if TYPE_CHECKING:
    from celery_dlq.storage.keys import Keys

#: Failed logins allowed per address and per user in one window.
LOGIN_LIMIT = 5
#: The window, in seconds, from the first failure.
LOGIN_WINDOW = 15 * 60


class LoginThrottle:
    """``take(address, user)`` before checking a password; ``succeeded`` after a right one."""

    def __init__(self, client: Any, keys: Keys, limit: int = LOGIN_LIMIT, window: int = LOGIN_WINDOW) -> None:
        self.client, self.keys, self.limit, self.window = client, keys, limit, window

    def _address(self, address: str) -> str:
        return self.keys.web_login_failures("addr", address or "unknown")

    def _user(self, user: str) -> str:
        return self.keys.web_login_failures("user", user[:200])

    def take(self, address: str, user: str | None) -> bool:
        """Take one try for the address and the user; False when either had none left (then check nothing)."""
        pipe = self.client.pipeline(transaction=True)
        for key in (self._address(address), *((self._user(user),) if user and user != TOKEN_USER else ())):
            pipe.set(key, 0, ex=self.window, nx=True)   # the window starts at the first try
            pipe.incr(key)
        counts = pipe.execute()[1::2]
        return all(int(count) <= self.limit for count in counts)

    def succeeded(self, address: str, user: str) -> None:
        """A right password: the address's try back (never below 0, never past its window), the user's count gone."""
        self.client.delete(self._user(user))
        key = self._address(address)
        with self.client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(key)
                count = pipe.get(key)
                if count is not None and int(count) > 0:
                    pipe.multi()
                    pipe.set(key, int(count) - 1, xx=True, keepttl=True)
                    pipe.execute()
            except WatchError:   # another try meanwhile: keep its count (errs towards fewer tries)
                pass
