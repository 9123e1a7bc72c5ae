"""A stand-in for the payment gateway and fraud model the shop talks to.

Its behaviour is chosen by the card number or order id, so the demo can show
every path: ``4000-0000-flaky`` times out on its first two attempts,
``4000-0000-declined`` is declined, and order ``ORD-666`` crashes the fraud
model's native code (here: SIGKILL of the worker's pool process).
"""
from __future__ import annotations

import os
import signal


class GatewayTimeout(ConnectionError):
    """Transient: the gateway did not answer in time. Retried by policy."""


class CardDeclined(Exception):
    """Final: retrying will not help. ``dead_letter_on`` sends it straight to the DLQ."""


def charge(card: str, amount: float, attempt: int) -> str:
    if card.endswith("flaky") and attempt <= 2:
        raise GatewayTimeout(f"gateway did not answer within 5 s (attempt {attempt})")
    if card.endswith("declined"):
        raise CardDeclined(f"card {card} declined: insufficient funds")
    return f"auth-{abs(hash((card, amount))) % 10**6:06d}"


def fraud_score(order_id: str) -> float:
    if order_id == "ORD-666":
        os.kill(os.getpid(), signal.SIGKILL)  # what a segfault in a native extension looks like
    return 0.02
