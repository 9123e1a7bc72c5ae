"""The redelivery policy: what a failed delivery turns into, and when.

Field names follow ActiveMQ Artemis' address settings (``redelivery-delay``,
``redelivery-delay-multiplier``, ``max-redelivery-delay``,
``redelivery-collision-avoidance-factor``, ``max-delivery-attempts``...) in
snake_case, with delays in seconds as Celery users expect.

``max_delivery_attempts`` counts *deliveries*, the first one included, as in
Artemis. Celery's ``max_retries`` counts *re*-tries, so
``max_delivery_attempts = max_retries + 1`` (Celery's default of 3 retries is
4 delivery attempts; our default of 10 attempts is 9 retries).

The circuit breaker's options are one nested field, ``breaker`` (a
:class:`~celery_dlq.breaker_policy.BreakerPolicy`, given as a mapping: ``breaker={"enabled": True,
"min_failures": 5}``); levels merge it key by key. Its flat spellings of
version 1 (``breaker_window``, ``auto_redrive``...) are still accepted, with
a ``DeprecationWarning``, until the next release (:data:`FLAT_BREAKER_NAMES`).
"""
from __future__ import annotations

import math
import random
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from celery_dlq import validators as V
from celery_dlq.breaker_policy import BREAKER_FIELD_NAMES, BREAKER_MANUAL, BreakerPolicy, validate_breaker_fields
from celery_dlq.errors import ConfigurationError
from celery_dlq.workflow import CHORD_RULES, CHORD_WAIT

UNLIMITED = -1
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


# -- rules of one field each (the shared ones: celery_dlq.validators) --------

def _attempts(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != UNLIMITED):
        raise V.fail(name, value, "an integer >= 1, or -1 for unlimited")
    return value


def _dead_letter(name: str, value: Any) -> bool | str:
    if isinstance(value, bool) or (isinstance(value, str) and value.strip()):
        return value
    raise V.fail(name, value, "True (per-queue DLQ), False (drop) or a queue name")


def _expired(name: str, value: Any) -> str:
    if value not in (EXPIRED_DEAD_LETTER, EXPIRED_DROP):
        raise V.fail(name, value, f"{EXPIRED_DEAD_LETTER!r} or {EXPIRED_DROP!r}")
    return value


def _chord_rule(name: str, value: Any) -> str:
    if value not in CHORD_RULES:
        raise V.fail(name, value, " or ".join(repr(rule) for rule in CHORD_RULES))
    return value


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
    #: Circuit breaker per failure group (:class:`BreakerPolicy`), given as a mapping of its options
    #: (``{"enabled": True, "min_failures": 5}``); True, "manual" or False is short for ``{"enabled": ...}``.
    breaker: BreakerPolicy = field(default_factory=BreakerPolicy)
    max_snoozes: int = 100                    # snoozes (waits that use no attempt) before it counts as a failure
    max_snooze_time: float = 86400.0          # seconds of snoozing in all, likewise
    explicit_fields: frozenset[str] = field(default=frozenset(), init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name, check in _BUILDERS.items():
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

    def snooze_left(self, snoozes: int, snoozed: float, seconds: float) -> bool:
        """Whether one more snooze of ``seconds`` stays within ``max_snoozes`` and ``max_snooze_time``."""
        return (self.max_snoozes == UNLIMITED or snoozes < self.max_snoozes) \
            and snoozed + seconds <= self.max_snooze_time

    def as_fields(self) -> dict[str, Any]:
        """The explicit fields only, as a mapping (for merging); ``breaker`` as the options it sets."""
        return {name: self.breaker.as_fields() if name == "breaker" else getattr(self, name)
                for name in self.explicit_fields}

    if not TYPE_CHECKING:  # hidden from mypy, which would otherwise accept any attribute name
        def __getattr__(self, name: str) -> Any:
            """The flat breaker attributes (``policy.breaker_window``...), deprecated: read ``policy.breaker``."""
            option = _DEPRECATED_READS.get(name)
            if option is None:
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            warnings.warn(f"RedeliveryPolicy.{name} is deprecated and will be removed in the next release: "
                          f"read policy.breaker.{option}", DeprecationWarning, stacklevel=2)
            return getattr(self.breaker, option)


#: The flat spellings of the breaker's options, before they were nested (deprecated, accepted until the next
#: release with a DeprecationWarning): flat name -> option of ``breaker``.
FLAT_BREAKER_NAMES = {
    "breaker_window": "window",
    "breaker_min_failures": "min_failures",
    "breaker_failure_ratio": "failure_ratio",
    "breaker_cooldown": "cooldown",
    "breaker_cooldown_multiplier": "cooldown_multiplier",
    "breaker_max_cooldown": "max_cooldown",
    "breaker_release_rate": "release_rate",
    "breaker_max_release_rate": "max_release_rate",
    "auto_redrive": "auto_redrive",
}
assert set(FLAT_BREAKER_NAMES.values()) == BREAKER_FIELD_NAMES - {"enabled"}
_DEPRECATED_READS = {**FLAT_BREAKER_NAMES, "breaker_counts": "opens_on_failures"}


def _breaker(name: str, value: Any) -> dict[str, Any]:
    """``breaker`` as the options it sets, validated: from a mapping, a :class:`BreakerPolicy`, or the short form."""
    if isinstance(value, BreakerPolicy):
        return value.as_fields()
    if isinstance(value, Mapping):
        return validate_breaker_fields(value, name)
    if value is True or value is False or value == BREAKER_MANUAL:
        return {"enabled": value}
    raise V.fail(name, value, "a mapping of breaker options, or True, 'manual' or False (short for {'enabled': ...})")


def _breaker_policy(name: str, value: Any) -> BreakerPolicy:
    return value if isinstance(value, BreakerPolicy) else BreakerPolicy(**_breaker(name, value))


VALIDATORS = {
    "redelivery_delay": V.seconds,
    "redelivery_multiplier": V.multiplier,
    "max_redelivery_delay": V.optional_seconds,
    "redelivery_collision_avoidance_factor": V.factor,
    "max_delivery_attempts": _attempts,
    "redelivery_full_jitter": V.flag,
    "dead_letter": _dead_letter,
    "dead_letter_queue_prefix": V.string,
    "dead_letter_queue_suffix": V.string,
    "retry_on": V.exception_types,
    "dead_letter_on": V.exception_types,
    "persist_delivery_count_before_delivery": V.flag,
    "dead_letter_ttl": V.optional_seconds,
    "dead_letter_max_length": V.optional_length,
    "expired": _expired,
    "chord_rule": _chord_rule,
    "breaker": _breaker,       # a partial policy keeps the options set; the policy builds a BreakerPolicy
    "max_snoozes": _attempts,
    "max_snooze_time": V.seconds,
}
_BUILDERS = {**VALIDATORS, "breaker": _breaker_policy}
FIELD_NAMES = frozenset(VALIDATORS)
assert FIELD_NAMES == {f.name for f in fields(RedeliveryPolicy) if f.init}
#: Every field as ``celery dlq policy`` shows it, the breaker's options one by one (``breaker.window``).
FIELD_PATHS = tuple(sorted((FIELD_NAMES - {"breaker"}) | {f"breaker.{option}" for option in BREAKER_FIELD_NAMES}))


def nest_flat_names(fields_: Mapping[str, Any], where: str, stacklevel: int = 1) -> Mapping[str, Any]:
    """``fields_`` with each flat breaker name (``breaker_window``...) moved into ``breaker``, with a warning.

    Setting one option both ways (``breaker_window`` and ``breaker={"window": ...}``) is an error. The
    warning points ``stacklevel`` frames up from this function's caller (1: the caller itself).
    """
    flat = [key for key in fields_ if key in FLAT_BREAKER_NAMES]
    if not flat:
        return fields_
    out = {key: value for key, value in fields_.items() if key not in FLAT_BREAKER_NAMES}
    nested = _options_of(out.get("breaker", {}))
    for key in flat:
        option = FLAT_BREAKER_NAMES[key]
        if option in nested:
            raise ConfigurationError(f"{where}: {key!r} and 'breaker' both set breaker.{option}: "
                                     f"keep 'breaker': {{{option!r}: ...}} only")
        warnings.warn(f"{where}: the policy field {key!r} is deprecated and will be an error in the next "
                      f"release: write 'breaker': {{{option!r}: {fields_[key]!r}}}",
                      DeprecationWarning, stacklevel=stacklevel + 1)
        nested[option] = fields_[key]
    out["breaker"] = nested
    return out


def _options_of(value: Any) -> dict[str, Any]:
    """The options a ``breaker`` value sets, not yet validated (the short form: ``enabled``)."""
    if isinstance(value, BreakerPolicy):
        return value.as_fields()
    return dict(value) if isinstance(value, Mapping) else {"enabled": value}


def _nest_arguments(kwargs: dict[str, Any]) -> Mapping[str, Any]:
    return nest_flat_names(kwargs, "RedeliveryPolicy", stacklevel=3)  # here, __init__, the caller


V.track_explicit_fields(RedeliveryPolicy, FIELD_NAMES, "policy field", _nest_arguments)


def validate_fields(fields_: Any, where: str) -> dict[str, Any]:
    """Validate a partial policy (a mapping of some fields) and normalize its values.

    Each error names ``where`` (the setting and pattern) and the key. ``breaker``
    becomes the mapping of the options it sets, and a flat breaker name is moved
    into it (:func:`nest_flat_names`). Cross-field rules are checked when the
    merged policy is built.
    """
    if isinstance(fields_, RedeliveryPolicy):
        return fields_.as_fields()
    if not isinstance(fields_, Mapping):
        raise ConfigurationError(f"{where}: expected a mapping of policy fields, got {fields_!r}")
    out = {}
    for key, value in nest_flat_names(fields_, where, stacklevel=2).items():
        if key not in VALIDATORS:
            raise ConfigurationError(f"{where}: unknown policy field {key!r}{V.suggest(str(key), FIELD_NAMES)}")
        try:
            out[key] = VALIDATORS[key](key, value)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{where}: {exc}") from None
    return out
