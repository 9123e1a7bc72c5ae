"""Times and durations as people type them: one parser, one unit table.

Used by the operator commands (``--since 2h``), the report's options
(``--as-of``, ``--replay-max-age 7d``) and anything else that reads a time
from text. Pure functions; ``now`` is a parameter so tests are exact.
"""
from __future__ import annotations

import re
import time
from datetime import datetime, timezone

from celery_dlq.errors import ConfigurationError

#: Duration units: seconds, minutes, hours, days, weeks.
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


def parse_duration(text: str | float | None) -> float | None:
    """Seconds from ``90``, ``90s``, ``30m``, ``6h``, ``7d`` or ``2w`` (> 0); None stays None."""
    if text is None:
        return None
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        match = _DURATION.match(str(text))
        if not match:
            raise ConfigurationError(f"bad duration {text!r}: use seconds or a number with s, m, h, d or w")
        seconds = float(match.group(1)) * UNITS[match.group(2) or "s"]
    if seconds <= 0:
        raise ConfigurationError(f"a duration must be > 0, got {text!r}")
    return seconds


def parse_moment(text: str | float | datetime | None) -> datetime | None:
    """An aware UTC datetime from ISO 8601 (naive means UTC) or unix seconds; None stays None."""
    if text is None or isinstance(text, datetime):
        moment = text
    else:
        try:
            moment = datetime.fromtimestamp(float(text), timezone.utc)
        except (TypeError, ValueError):
            try:
                moment = datetime.fromisoformat(str(text).strip().replace("Z", "+00:00"))
            except ValueError:
                raise ConfigurationError(f"bad time {text!r}: use ISO 8601 or unix seconds") from None
    if moment is None:
        return None
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def parse_since(text: str | None, now: float | None = None) -> float | None:
    """Unix seconds from unix seconds, ISO 8601 (naive means UTC), or an age ago (``30m``, ``2h``, ``7d``)."""
    if text is None:
        return None
    value = str(text).strip()
    match = _DURATION.match(value)
    if match and match.group(2):
        return (time.time() if now is None else now) - parse_duration(value)  # type: ignore[operator]
    try:
        return parse_moment(value).timestamp()  # type: ignore[union-attr]
    except ConfigurationError:
        raise ConfigurationError(
            f"{text!r}: use unix seconds, ISO 8601, or an age like 30m, 2h, 7d") from None
