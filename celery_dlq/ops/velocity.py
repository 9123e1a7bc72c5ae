"""How fast a redrive job moves letters (pure): a fixed cap, or a rate that starts low and doubles.

SQS caps a redrive at ``MaxNumberOfMessagesPerSecond``; a recovered service is better served by a
rate that starts low and doubles every ``interval`` seconds while the letters replayed succeed, up to
``cap`` (TCP's slow start). A job moves letters in batches: :func:`batch_size` letters per batch, then
waits :func:`wait` seconds so that, since its rate last changed, it never ran faster than the rate.
"""
from __future__ import annotations

from dataclasses import dataclass

#: Seconds a paced job's batch stands for: a batch is about this long's worth of letters.
TICK = 1.0


@dataclass(frozen=True)
class Velocity:
    """``rate`` messages/s (None: no cap); with ``cap``, the start of a rate doubled every ``interval`` seconds
    while healthy, up to ``cap``."""

    rate: float | None = None
    cap: float | None = None
    interval: float = 10.0

    def __post_init__(self) -> None:
        for name in ("rate", "cap"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 messages/s, got {value!r}")
        if not self.interval > 0:
            raise ValueError(f"interval must be > 0 s, got {self.interval!r}")
        if self.cap is not None and (self.rate is None or self.rate > self.cap):
            raise ValueError(f"a rising velocity starts at a rate at most its cap, got {self.rate!r} to {self.cap!r}")

    @property
    def rising(self) -> bool:
        return self.cap is not None


def next_rate(rate: float, cap: float, healthy: bool) -> float:
    """The rate after an interval: doubled (at most ``cap``) when the letters replayed succeeded, else kept."""
    return min(cap, rate * 2) if healthy else rate


def step_due(now: float, since: float, interval: float) -> bool:
    """Whether ``interval`` seconds passed since the rate last changed (at ``since``)."""
    return now - since >= interval


def batch_size(rate: float | None, page: int, tick: float = TICK) -> int:
    """Letters per batch: a page without a cap, else a ``tick``'s worth at ``rate`` (at least 1, at most a page)."""
    if rate is None:
        return page
    return max(1, min(page, int(rate * tick)))


def wait(since: float, sent: int, rate: float | None, now: float) -> float:
    """Seconds to wait before the next batch so that ``sent`` letters since ``since`` keep to ``rate`` (0: go)."""
    if rate is None:
        return 0.0
    return max(0.0, since + sent / rate - now)
