"""The redelivery policy: what a failed delivery turns into, and when.

Field names follow ActiveMQ Artemis' address settings (``redelivery-delay``,
``redelivery-delay-multiplier``, ``max-redelivery-delay``,
``redelivery-collision-avoidance-factor``, ``max-delivery-attempts``...) in
snake_case, with delays in seconds as Celery users expect.

``max_delivery_attempts`` counts *deliveries*, the first one included, as in
Artemis. Celery's ``max_retries`` counts *re*-tries, so
``max_delivery_attempts = max_retries + 1`` (Celery's default of 3 retries is
4 delivery attempts; our default of 10 attempts is 9 retries).
"""
from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from numbers import Real
from typing import Any

from kombu.utils.imports import symbol_by_name

from celery_dlq.errors import ConfigurationError
from celery_dlq.workflow import CHORD_RULES, CHORD_WAIT

UNLIMITED = -1
#: ``breaker``: held by hand only (``celery dlq pause``), never opened by failures.
BREAKER_MANUAL = "manual"
#: ``expired``: what becomes of a message whose ``expires`` passes before its next delivery.
EXPIRED_DEAD_LETTER, EXPIRED_DROP = "dead_letter", "drop"

_default_rng = random.Random()


def compute_delay(n: int, *, delay: float, multiplier: float, cap: float,
                  factor: float, rng: random.Random, full_jitter: bool = False) -> float:
    """Seconds to wait after the ``n``-th failed delivery (``n`` >= 1).

    ``delay x multiplier^(n-1)``, then collision-avoidance jitter (a random
    sign, then ``x factor x U[0,1)``, as Artemis does), then the cap. With
    ``factor == 0`` no random number is drawn, so callers that seed an rng for
    other reasons see the same sequence with or without jitter configured.
    ``full_jitter`` (Celery's ``retry_jitter``) then draws the wait uniformly
    from ``[0, capped delay]``, as Celery's ``get_exponential_backoff_interval`` does.
    """
    if n < 1:
        raise ValueError(f"n counts failed deliveries from 1, got {n!r}")
    try:
        base = delay * multiplier ** (n - 1)
    except OverflowError:  # multiplier^(n-1) past float range: the cap decides
        base = math.inf
    if factor and base and not math.isinf(base):
        sign = -1.0 if rng.random() < 0.5 else 1.0
        base += base * (sign * factor * rng.random())
    wait = min(base, cap)
    if full_jitter and wait > 0:
        wait = rng.uniform(0.0, wait)
    return wait


# -- field validators: each returns the normalized value or raises ---------

def _fail(name: str, value: Any, expected: str) -> ConfigurationError:
    return ConfigurationError(f"{name} must be {expected}, got {value!r}")


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value < 0:
        raise _fail(name, value, "a finite number of seconds >= 0")
    return float(value)


def _multiplier(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value < 1.0:
        raise _fail(name, value, "a finite number >= 1.0")
    return float(value)


def _factor(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not 0.0 <= float(value) <= 1.0:
        raise _fail(name, value, "a number in [0.0, 1.0]")
    return float(value)


def _attempts(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != UNLIMITED):
        raise _fail(name, value, "an integer >= 1, or -1 for unlimited")
    return value


def _dead_letter(name: str, value: Any) -> bool | str:
    if isinstance(value, bool) or (isinstance(value, str) and value.strip()):
        return value
    raise _fail(name, value, "True (per-queue DLQ), False (drop) or a queue name")


def _expired(name: str, value: Any) -> str:
    if value not in (EXPIRED_DEAD_LETTER, EXPIRED_DROP):
        raise _fail(name, value, f"{EXPIRED_DEAD_LETTER!r} or {EXPIRED_DROP!r}")
    return value


def _chord_rule(name: str, value: Any) -> str:
    if value not in CHORD_RULES:
        raise _fail(name, value, " or ".join(repr(rule) for rule in CHORD_RULES))
    return value


def _string(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise _fail(name, value, "a string")
    return value


def _breaker(name: str, value: Any) -> bool | str:
    if value is True or value is False or value == BREAKER_MANUAL:
        return value
    raise _fail(name, value, f"True (automatic), {BREAKER_MANUAL!r} (pause and resume only) or False")


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
        raise _fail(name, value, "a finite number > 0")
    return float(value)


def _ratio(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not 0.0 < float(value) <= 1.0:
        raise _fail(name, value, "a number in (0.0, 1.0]")
    return float(value)


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(name, value, "an integer >= 1")
    return value


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _fail(name, value, "True or False")
    return value


def _optional_seconds(name: str, value: Any) -> float | None:
    return None if value is None else _seconds(name, value)


def _optional_length(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _fail(name, value, "None or an integer >= 1")
    return value


def _exception_types(name: str, value: Any) -> tuple[type[BaseException], ...]:
    """Accept one type, a sequence of types, or dotted names ("pkg.mod:Error")."""
    items = value if isinstance(value, (list, tuple, set, frozenset)) else (value,)
    types = []
    for item in items:
        if isinstance(item, str):
            try:
                item = symbol_by_name(item)
            except (ImportError, AttributeError, ValueError) as exc:
                raise ConfigurationError(f"{name}: cannot import {item!r}: {exc}") from exc
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise _fail(name, item, "an exception class (or a sequence of them)")
        types.append(item)
    return tuple(types)


@dataclass(frozen=True, kw_only=True)
class RedeliveryPolicy:
    """How often a failing task is delivered again, how long between, and where it ends.

    Validated at construction: every error names the field and the bad value.
    Only the fields passed to the constructor are *explicit* (see
    :attr:`explicit_fields`); resolution merges levels field by field, so a
    field left out here is taken from the next level down.
    """

    redelivery_delay: float = 0.0
    redelivery_multiplier: float = 1.0
    max_redelivery_delay: float | None = None  # None: 10 x redelivery_delay, as Artemis
    redelivery_collision_avoidance_factor: float = 0.0
    max_delivery_attempts: int = 10
    redelivery_full_jitter: bool = False  # Celery's retry_jitter: each wait drawn from [0, delay]
    dead_letter: bool | str = True
    dead_letter_queue_prefix: str = "DLQ."
    dead_letter_queue_suffix: str = ""
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    dead_letter_on: tuple[type[BaseException], ...] = ()
    persist_delivery_count_before_delivery: bool = True
    dead_letter_ttl: float | None = None
    dead_letter_max_length: int | None = None
    expired: str = EXPIRED_DEAD_LETTER  # "drop": an expired message is counted and logged, not kept
    #: A dead-lettered chord member's chord: "wait" for its replay, "fail" now, "continue" without it
    #: (celery_dlq.workflow, docs/workflows.md); a message's ``x-dlq-chord-rule`` header overrides it.
    chord_rule: str = CHORD_WAIT
    #: Circuit breaker per failure group (docs/operating.md#handling-an-incident): True opens on failures and
    #: obeys pause/resume; "manual" obeys pause/resume only; False (default) costs nothing.
    breaker: bool | str = False
    breaker_window: float = 60.0              # seconds over which failures and successes are counted
    breaker_min_failures: int = 20            # failures of one group in the window before it may open
    breaker_failure_ratio: float = 0.5        # ... and their share of the window's outcomes
    breaker_cooldown: float = 10.0            # seconds open before one delivery probes
    breaker_cooldown_multiplier: float = 2.0  # each failed probe multiplies the cool-down ...
    breaker_max_cooldown: float = 300.0       # ... up to this
    breaker_release_rate: float = 10.0        # held deliveries released per second after a close, doubling ...
    breaker_max_release_rate: float = 500.0   # ... each second up to this
    auto_redrive: bool = False                # replay the group's dead letters when its breaker closes
    max_snoozes: int = 100                    # snoozes (waits that use no attempt) before it counts as a failure
    max_snooze_time: float = 86400.0          # seconds of snoozing in all, likewise
    explicit_fields: frozenset[str] = field(default=frozenset(), init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name, check in VALIDATORS.items():
            object.__setattr__(self, name, check(name, getattr(self, name)))
        if self.max_redelivery_delay is None:
            object.__setattr__(self, "max_redelivery_delay", 10 * self.redelivery_delay)
        if self.dead_letter is True and not (self.dead_letter_queue_prefix or self.dead_letter_queue_suffix):
            raise ConfigurationError(
                "dead_letter_queue_prefix and dead_letter_queue_suffix are both empty: "
                "the dead-letter queue would be the original queue")

    @classmethod
    def from_fields(cls, fields_: Mapping[str, Any], where: str = "policy") -> RedeliveryPolicy:
        """Build from a mapping, naming ``where`` it came from in every error."""
        return cls(**validate_fields(fields_, where))

    # -- what a failure turns into ------------------------------------------

    @property
    def cap(self) -> float:
        """``max_redelivery_delay``, which ``__post_init__`` always sets."""
        assert self.max_redelivery_delay is not None
        return self.max_redelivery_delay

    def delay_after(self, n: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after the ``n``-th failed delivery (``n`` = 1 after the first)."""
        return compute_delay(
            n, delay=self.redelivery_delay, multiplier=self.redelivery_multiplier,
            cap=self.cap, factor=self.redelivery_collision_avoidance_factor,
            rng=rng or _default_rng, full_jitter=self.redelivery_full_jitter)

    def is_retryable(self, exc: BaseException) -> bool:
        """``dead_letter_on`` wins over ``retry_on``."""
        if self.dead_letter_on and isinstance(exc, self.dead_letter_on):
            return False
        return isinstance(exc, self.retry_on)

    def attempts_left(self, deliveries: int) -> bool:
        """Whether another delivery is allowed after ``deliveries`` so far."""
        return self.max_delivery_attempts == UNLIMITED or deliveries < self.max_delivery_attempts

    def dead_letter_queue(self, queue: str) -> str | None:
        """The queue dead letters from ``queue`` go to; None when they are dropped."""
        if self.dead_letter is False:
            return None
        if isinstance(self.dead_letter, str):
            return self.dead_letter
        return f"{self.dead_letter_queue_prefix}{queue}{self.dead_letter_queue_suffix}"

    def expired_queue(self, queue: str) -> str | None:
        """The queue an expired message from ``queue`` goes to; None when it is dropped."""
        return None if self.expired == EXPIRED_DROP else self.dead_letter_queue(queue)

    @property
    def breaker_counts(self) -> bool:
        """Whether failures open this task's breakers (``breaker=True``), not only a manual pause."""
        return self.breaker is True

    def snooze_left(self, snoozes: int, snoozed: float, seconds: float) -> bool:
        """Whether one more snooze of ``seconds`` stays within ``max_snoozes`` and ``max_snooze_time``."""
        return (self.max_snoozes == UNLIMITED or snoozes < self.max_snoozes) \
            and snoozed + seconds <= self.max_snooze_time

    def as_fields(self) -> dict[str, Any]:
        """The explicit fields only, as a mapping (for merging)."""
        return {name: getattr(self, name) for name in self.explicit_fields}


VALIDATORS = {
    "redelivery_delay": _seconds,
    "redelivery_multiplier": _multiplier,
    "max_redelivery_delay": _optional_seconds,
    "redelivery_collision_avoidance_factor": _factor,
    "max_delivery_attempts": _attempts,
    "redelivery_full_jitter": _flag,
    "dead_letter": _dead_letter,
    "dead_letter_queue_prefix": _string,
    "dead_letter_queue_suffix": _string,
    "retry_on": _exception_types,
    "dead_letter_on": _exception_types,
    "persist_delivery_count_before_delivery": _flag,
    "dead_letter_ttl": _optional_seconds,
    "dead_letter_max_length": _optional_length,
    "expired": _expired,
    "chord_rule": _chord_rule,
    "breaker": _breaker,
    "breaker_window": _positive,
    "breaker_min_failures": _count,
    "breaker_failure_ratio": _ratio,
    "breaker_cooldown": _positive,
    "breaker_cooldown_multiplier": _multiplier,
    "breaker_max_cooldown": _positive,
    "breaker_release_rate": _positive,
    "breaker_max_release_rate": _positive,
    "auto_redrive": _flag,
    "max_snoozes": _attempts,
    "max_snooze_time": _seconds,
}
FIELD_NAMES = frozenset(VALIDATORS)
assert FIELD_NAMES == {f.name for f in fields(RedeliveryPolicy) if f.init}


def _track_explicit_fields(cls: type[RedeliveryPolicy]) -> None:
    """Remember which fields the caller passed, so merging can tell "unset" from "default"."""
    generated_init = cls.__init__

    def __init__(self: RedeliveryPolicy, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - FIELD_NAMES)
        if unknown:
            raise ConfigurationError(f"unknown policy field {unknown[0]!r}{_suggest(unknown[0])}")
        generated_init(self, **kwargs)
        object.__setattr__(self, "explicit_fields", frozenset(kwargs))

    __init__.__doc__ = generated_init.__doc__
    cls.__init__ = __init__  # type: ignore[method-assign]


_track_explicit_fields(RedeliveryPolicy)


def _suggest(name: str) -> str:
    import difflib
    close = difflib.get_close_matches(name, sorted(FIELD_NAMES), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def validate_fields(fields_: Any, where: str) -> dict[str, Any]:
    """Validate a partial policy (a mapping of some fields) and normalize its values.

    Each error names ``where`` (the setting and pattern) and the key. Cross-field
    rules are checked when the merged policy is built.
    """
    if isinstance(fields_, RedeliveryPolicy):
        return fields_.as_fields()
    if not isinstance(fields_, Mapping):
        raise ConfigurationError(f"{where}: expected a mapping of policy fields, got {fields_!r}")
    out = {}
    for key, value in fields_.items():
        if key not in VALIDATORS:
            raise ConfigurationError(f"{where}: unknown policy field {key!r}{_suggest(str(key))}")
        try:
            out[key] = VALIDATORS[key](key, value)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{where}: {exc}") from None
    return out
