"""A circuit breaker's state machine (pure): closed -> open -> half_open -> closed, or open again.

One breaker per failure group (task + exception type + normalised message,
:func:`celery_dlq.fingerprint.group_id`) on one queue. Failures of the group
and successes of its task are counted in a fixed window; when the failures
reach ``min_failures`` and their share of the window's outcomes reaches
``ratio``, the breaker opens: the task's new deliveries on that queue are held
(parked without using an attempt). After ``cooldown`` one delivery may probe
(half_open); its success closes the breaker, its failure opens it again with
the cool-down multiplied, up to a cap. A manual pause is an open breaker with
``paused_by`` set: it never probes, and only a resume closes it.

Every function takes the state and ``now`` and returns a new state: no Redis,
no clock, so the tests are exact. :mod:`celery_dlq.storage.breakers` applies
them in Redis transactions.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"
STATES = (CLOSED, OPEN, HALF_OPEN)
#: The group of a breaker that stands for a whole task (a manual pause of it) starts with this.
WHOLE_TASK = "*:"
#: The queue of a breaker that stands for every queue (a pause given without a queue).
ANY_QUEUE = "*"
#: A probe that has not reported for this long (or its cool-down, if longer) is lost: another may probe.
PROBE_TIMEOUT = 60.0


@dataclass(frozen=True)
class Thresholds:
    """When a breaker opens and how long it stays open (from the task's policy, ``breaker_*`` fields)."""

    window: float = 60.0
    min_failures: int = 20
    ratio: float = 0.5
    cooldown: float = 10.0
    multiplier: float = 2.0
    max_cooldown: float = 300.0

    @classmethod
    def of(cls, policy: Any) -> Thresholds:
        return cls(window=policy.breaker.window, min_failures=policy.breaker.min_failures,
                   ratio=policy.breaker.failure_ratio, cooldown=policy.breaker.cooldown,
                   multiplier=policy.breaker.cooldown_multiplier, max_cooldown=policy.breaker.max_cooldown)


@dataclass(frozen=True)
class BreakerState:
    """One breaker, as its Redis hash holds it (every field a string there)."""

    queue: str
    task: str
    group: str
    state: str = CLOSED
    exception_type: str = ""
    message: str = ""
    window_start: float = 0.0
    failures: int = 0
    successes: int = 0
    opened_at: float = 0.0
    cooldown: float = 0.0
    opens: int = 0                 # times opened since it was last closed
    probe_id: str = ""
    probe_at: float = 0.0
    paused_by: str = ""
    changed_at: float = 0.0
    held: int = 0                  # deliveries held in this open period

    @property
    def probe_due(self) -> float:
        """When the cool-down ends (open) and one delivery may probe."""
        return self.opened_at + self.cooldown

    @property
    def next_probe(self) -> float:
        """When a delivery may probe: the cool-down's end (open), or when the probe counts as lost (half-open)."""
        if self.state == HALF_OPEN:
            return self.probe_at + max(self.cooldown, PROBE_TIMEOUT)
        return self.probe_due

    @property
    def holds(self) -> bool:
        """Whether the task's deliveries are held (open or half-open, or paused)."""
        return self.state != CLOSED

    def as_hash(self) -> dict[str, str]:
        return {name: _text(value) for name, value in asdict(self).items()}

    @classmethod
    def from_hash(cls, data: Mapping[Any, Any]) -> BreakerState | None:
        """The state read back from Redis; None for a missing or unreadable hash."""
        text = {_str(k): _str(v) for k, v in data.items()}
        if not text.get("queue") or not text.get("task") or text.get("state") not in STATES:
            return None
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = text.get(f.name)
            if raw is None:
                continue
            kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "str")
            try:
                values[f.name] = float(raw) if kind == "float" else int(raw) if kind == "int" else raw
            except ValueError:
                return None
        return cls(**values)


def whole_task(task: str) -> str:
    """The group of the breaker that stands for all of ``task`` (``*:<task>``: breaker keys name no task)."""
    return WHOLE_TASK + task


def _str(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _text(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _reset_window(s: BreakerState, now: float) -> BreakerState:
    return replace(s, window_start=now, failures=0, successes=0)


def _open(s: BreakerState, now: float, cooldown: float) -> BreakerState:
    return replace(s, state=OPEN, opened_at=now, cooldown=cooldown, opens=s.opens + 1, probe_id="",
                   probe_at=0.0, changed_at=now, held=0)


def record_failure(s: BreakerState, now: float, t: Thresholds, *, task_id: str = "",
                   successes: int = 0) -> BreakerState:
    """A delivery of the group failed (``successes``: the task's successes seen since the last call).

    A closed breaker opens when the window's failures reach
    ``t.min_failures`` and their share reaches ``t.ratio``; a half-open one
    opens again when its probe (``task_id``) fails, the cool-down multiplied.
    Failures of deliveries already running when it opened are only counted.
    """
    if now - s.window_start >= t.window:
        s = _reset_window(s, now)
    s = replace(s, failures=s.failures + 1, successes=s.successes + max(0, successes))
    if s.paused_by:
        return s
    if s.state == CLOSED and s.failures >= t.min_failures \
            and s.failures >= t.ratio * (s.failures + s.successes):
        return _open(s, now, t.cooldown)
    if s.state == HALF_OPEN and task_id and task_id == s.probe_id:
        return _open(s, now, min(t.max_cooldown, max(s.cooldown, t.cooldown) * t.multiplier))
    return s


def record_success(s: BreakerState, now: float, task_id: str) -> BreakerState:
    """A delivery of the task succeeded: the probe's success closes the breaker."""
    if s.state == HALF_OPEN and not s.paused_by and task_id and task_id == s.probe_id:
        return close(s, now)
    return s


def close(s: BreakerState, now: float) -> BreakerState:
    """Closed, its counts and cool-down forgotten (a probe's success, or a resume)."""
    return replace(_reset_window(s, now), state=CLOSED, opened_at=0.0, cooldown=0.0, opens=0, probe_id="",
                   probe_at=0.0, paused_by="", changed_at=now, held=0)


def claim_probe(s: BreakerState, now: float, task_id: str) -> BreakerState | None:
    """Let ``task_id`` probe, if the cool-down is over; None when it must be held.

    A half-open breaker whose probe has not reported for :data:`PROBE_TIMEOUT`
    (or its cool-down, if longer: its worker died) lets another delivery probe.
    """
    if s.paused_by or s.state == CLOSED:
        return None
    if now >= s.next_probe:
        return replace(s, state=HALF_OPEN, probe_id=task_id, probe_at=now, changed_at=now)
    return None


def hold_until(s: BreakerState, now: float, held_before: int, t: Thresholds) -> float:
    """When a delivery held now comes back by itself.

    The first one held in an open period comes back when the cool-down ends,
    to probe; the others wait ``t.max_cooldown`` (the closing breaker releases
    them sooner, :func:`release_offsets`), so a long outage does not bring every
    held delivery back at each cool-down.
    """
    if held_before == 0 and s.state == OPEN and not s.paused_by:
        return max(now, s.probe_due)
    return now + max(t.max_cooldown, s.probe_due - now)


def fetch_holds_until(s: BreakerState) -> float | None:
    """Until when the fetch itself holds the task's deliveries in Redis (``math.inf``: paused); None: it does not.

    Not right after the breaker opens: its first delivery held comes to a
    worker, which parks it until the cool-down ends (:func:`hold_until`), so
    that a probe comes even when nothing new is published.
    """
    if s.state == CLOSED:
        return None
    if s.paused_by:
        return math.inf
    if s.state == HALF_OPEN or s.held > 0:
        return s.next_probe
    return None


def pause(s: BreakerState, now: float, who: str) -> BreakerState:
    """Opened by hand: held until resumed, no probe."""
    opened = s if s.state == OPEN else _open(s, now, 0.0)
    return replace(opened, state=OPEN, paused_by=who or "operator", changed_at=now)


def release_offsets(n: int, rate: float, max_rate: float) -> list[float]:
    """Seconds after a close at which each of ``n`` held deliveries is released.

    The pace starts at ``rate`` per second and doubles every second up to
    ``max_rate``: entry ``i`` goes at the time the integral of the pace reaches
    ``i``, so a recovered service sees a trickle first.
    """
    if n <= 0:
        return []
    rate, max_rate = max(rate, 1e-9), max(max_rate, rate)
    ramp = math.log2(max_rate / rate)                        # seconds until the cap is reached
    ramped = rate * (2 ** ramp - 1) / math.log(2)            # released by then
    out = []
    for i in range(n):
        if i <= ramped:
            out.append(math.log2(1 + i * math.log(2) / rate))
        else:
            out.append(ramp + (i - ramped) / max_rate)
    return out


def released_by(elapsed: float, rate: float, max_rate: float) -> float:
    """How many held deliveries :func:`release_offsets` has released ``elapsed`` seconds after a close."""
    if elapsed <= 0:
        return 0.0
    rate, max_rate = max(rate, 1e-9), max(max_rate, rate)
    ramp = math.log2(max_rate / rate)
    if elapsed <= ramp:
        return rate * (2 ** elapsed - 1) / math.log(2)
    return rate * (2 ** ramp - 1) / math.log(2) + (elapsed - ramp) * max_rate
