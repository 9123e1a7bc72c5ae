"""Login tries counted in Redis, per client address and per user, so every dashboard process shares the limit.

Each try first takes one of the window's ``limit`` tries (5 by default,
the window 15 minutes from the first) for its address and, only when the
address had one left, for its user, in one atomic step
(``storage/throttle.py``), and only then is the password checked: however
many tries arrive at once, in however many processes, at most ``limit`` are
checked, and the (limit + 1)-th is refused unchecked, a right password
included. A try refused on its address's budget writes nothing for its user
name, so a client inventing user names cannot grow Redis by more than a
window's ``limit`` keys. A try that succeeds gives its address's try back
and clears its user's count (not the address's, so one known account cannot
reset the count of a password guesser). The login form and ``Authorization``
headers count alike. The token login counts per address only: five wrong
``Bearer`` headers from anywhere must not lock out every script that uses
the token.

A per-user limit also lets anyone lock a user out for a window by guessing
wrong on purpose; that is the price of stopping a slow guesser who moves
between addresses, and the same trade Django's and Sidekiq's lockouts make.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from celery_dlq.web.users import TOKEN_USER

if TYPE_CHECKING:
    from celery_dlq.storage.throttle import ThrottleStore

#: Failed logins allowed per address and per user in one window.
LOGIN_LIMIT = 5
#: The window, in seconds, from the first failure.
LOGIN_WINDOW = 15 * 60


class LoginThrottle:
    """``take(address, user)`` before checking a password; ``succeeded`` after a right one."""

    def __init__(self, store: ThrottleStore, limit: int = LOGIN_LIMIT, window: int = LOGIN_WINDOW) -> None:
        self.store, self.limit, self.window = store, limit, window

    def take(self, address: str, user: str | None) -> bool:
        """Take one try for the address, then the user; False when either had none left (then check nothing)."""
        counted = user if user and user != TOKEN_USER else None
        return self.store.take(address, counted, limit=self.limit, window=self.window)

    def succeeded(self, address: str, user: str) -> None:
        """A right password: the address's try back (never below 0, never past its window), the user's count gone."""
        self.store.succeeded(address, user)
