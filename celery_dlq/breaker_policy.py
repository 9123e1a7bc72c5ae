"""The circuit breaker's options: a redelivery policy's nested ``breaker`` field (:class:`BreakerPolicy`).

A breaker per failure group (docs/operating.md#handling-an-incident) opens on
``min_failures`` failures reaching ``failure_ratio`` of a ``window``'s
outcomes, lets one delivery probe after a cool-down that grows with each
failed probe, and releases what it held at a rising pace once a probe
succeeds. Every error names ``breaker.<option>``.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from celery_dlq import validators as V
from celery_dlq.errors import ConfigurationError

#: ``breaker``: held by hand only (``celery dlq pause``), never opened by failures.
BREAKER_MANUAL = "manual"


def _mode(name: str, value: Any) -> bool | str:
    if value is True or value is False or value == BREAKER_MANUAL:
        return value
    raise V.fail(name, value, f"True (automatic), {BREAKER_MANUAL!r} (pause and resume only) or False")


@dataclass(frozen=True, kw_only=True)
class BreakerPolicy:
    """A task's circuit breaker per failure group: the policy's nested ``breaker`` field.

    See docs/operating.md#handling-an-incident. Validated at construction,
    every error naming ``breaker.<option>``. Like the policy it remembers the
    options passed to it (:attr:`explicit_fields`), so levels merge it option
    by option: a pattern may set ``min_failures`` and a task ``enabled``.
    """

    #: True opens on failures and obeys pause/resume; "manual" obeys pause/resume only; False (default) costs nothing.
    enabled: bool | str = False
    window: float = 60.0              # seconds over which failures and successes are counted
    min_failures: int = 20            # failures of one group in the window before it may open
    failure_ratio: float = 0.5        # ... and their share of the window's outcomes
    cooldown: float = 10.0            # seconds open before one delivery probes
    cooldown_multiplier: float = 2.0  # each failed probe multiplies the cool-down ...
    max_cooldown: float = 300.0       # ... up to this
    release_rate: float = 10.0        # held deliveries released per second after a close, doubling ...
    max_release_rate: float = 500.0   # ... each second up to this
    auto_redrive: bool = False        # replay the group's dead letters when its breaker closes
    explicit_fields: frozenset[str] = field(default=frozenset(), init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name, check in BREAKER_VALIDATORS.items():
            object.__setattr__(self, name, check(f"breaker.{name}", getattr(self, name)))

    @property
    def opens_on_failures(self) -> bool:
        """Whether failures open these breakers (``enabled=True``), not only a manual pause."""
        return self.enabled is True

    def as_fields(self) -> dict[str, Any]:
        """The explicit options only, as a mapping (for merging)."""
        return {name: getattr(self, name) for name in self.explicit_fields}


BREAKER_VALIDATORS = {
    "enabled": _mode,
    "window": V.positive,
    "min_failures": V.count,
    "failure_ratio": V.ratio,
    "cooldown": V.positive,
    "cooldown_multiplier": V.multiplier,
    "max_cooldown": V.positive,
    "release_rate": V.positive,
    "max_release_rate": V.positive,
    "auto_redrive": V.flag,
}
BREAKER_FIELD_NAMES = frozenset(BREAKER_VALIDATORS)
assert BREAKER_FIELD_NAMES == {f.name for f in fields(BreakerPolicy) if f.init}


def validate_breaker_fields(options: Mapping[Any, Any], name: str = "breaker") -> dict[str, Any]:
    """Validate some of the breaker's options (a mapping), each error naming ``breaker.<option>``."""
    out = {}
    for key, value in options.items():
        if key not in BREAKER_VALIDATORS:
            raise ConfigurationError(
                f"unknown breaker option {f'{name}.{key}'!r}{V.suggest(str(key), BREAKER_FIELD_NAMES)}")
        out[key] = BREAKER_VALIDATORS[key](f"{name}.{key}", value)
    return out


V.track_explicit_fields(BreakerPolicy, BREAKER_FIELD_NAMES, "breaker option")
