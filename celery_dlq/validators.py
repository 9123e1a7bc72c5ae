"""Validators of configuration values: each takes the field's name and a value, returns it normalized or raises.

Every error is a :class:`~celery_dlq.errors.ConfigurationError` naming the field
and the bad value. Shared by the redelivery policy and its breaker
(:mod:`celery_dlq.policy`); a rule only one field has stays beside that field.
"""
from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable, Mapping
from numbers import Real
from typing import Any

from kombu.utils.imports import symbol_by_name

from celery_dlq.errors import ConfigurationError


def fail(name: str, value: Any, expected: str) -> ConfigurationError:
    return ConfigurationError(f"{name} must be {expected}, got {value!r}")


def seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value < 0:
        raise fail(name, value, "a finite number of seconds >= 0")
    return float(value)


def multiplier(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value < 1.0:
        raise fail(name, value, "a finite number >= 1.0")
    return float(value)


def factor(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not 0.0 <= float(value) <= 1.0:
        raise fail(name, value, "a number in [0.0, 1.0]")
    return float(value)


def string(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise fail(name, value, "a string")
    return value


def positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
        raise fail(name, value, "a finite number > 0")
    return float(value)


def ratio(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not 0.0 < float(value) <= 1.0:
        raise fail(name, value, "a number in (0.0, 1.0]")
    return float(value)


def count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise fail(name, value, "an integer >= 1")
    return value


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise fail(name, value, "True or False")
    return value


def optional_seconds(name: str, value: Any) -> float | None:
    return None if value is None else seconds(name, value)


def optional_length(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise fail(name, value, "None or an integer >= 1")
    return value


def exception_types(name: str, value: Any) -> tuple[type[BaseException], ...]:
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
            raise fail(name, item, "an exception class (or a sequence of them)")
        types.append(item)
    return tuple(types)


def suggest(name: str, names: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``names``, or nothing."""
    close = difflib.get_close_matches(name, sorted(names), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def track_explicit_fields(cls: type[Any], names: frozenset[str], unknown: str,
                           rename: Callable[[dict[str, Any]], Mapping[str, Any]] | None = None) -> None:
    """Remember which fields the caller passed, so merging can tell "unset" from "default"."""
    generated_init = cls.__init__

    def __init__(self: Any, **kwargs: Any) -> None:
        if rename is not None:
            kwargs = dict(rename(kwargs))
        bad = sorted(set(kwargs) - names)
        if bad:
            raise ConfigurationError(f"unknown {unknown} {bad[0]!r}{suggest(bad[0], names)}")
        generated_init(self, **kwargs)
        object.__setattr__(self, "explicit_fields", frozenset(kwargs))

    __init__.__doc__ = generated_init.__doc__
    cls.__init__ = __init__
