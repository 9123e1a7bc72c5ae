"""How values read on a page: times, ages, names in URLs, values of any type. Pure functions."""
from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote


def at(seconds: float | None) -> str:
    """Unix seconds as UTC ``2026-11-24 17:03:12``; ``-`` when unknown."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        return "-"
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def age(seconds: float | None, now: float | None = None) -> str:
    """How long ago (``3d 4h``, ``12m 5s``, ``40s``); ``-`` when unknown."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        return "-"
    left = max(0, int((time.time() if now is None else now) - seconds))
    units = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
    first = next((n for n, (_, size) in enumerate(units) if left >= size), len(units) - 1)
    (unit, size), rest = units[first], left % units[first][1]
    parts = [f"{left // size}{unit}"]
    if first + 1 < len(units) and rest // units[first + 1][1]:
        parts.append(f"{rest // units[first + 1][1]}{units[first + 1][0]}")
    return " ".join(parts)


def due_in(seconds: float | None, now: float | None = None) -> str:
    """When a parked retry is due: ``in 59m 58s`` or ``now`` (overdue)."""
    if not isinstance(seconds, (int, float)):
        return "-"
    ahead = seconds - (time.time() if now is None else now)
    return "now" if ahead <= 0 else "in " + age(time.time() - ahead if now is None else now - ahead, now)


def segment(name: str) -> str:
    """A queue name or id as one URL path segment."""
    return quote(str(name), safe="")


def pretty(value: Any) -> str:
    """A decoded value as indented JSON (repr when JSON cannot show it)."""
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


def cut(value: Any, limit: int = 120) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


#: The ``stats`` counters as a person reads them: counter -> (label, what it counts). Unknown ones show as named.
COUNTERS = {
    "dead_letters_now": ("in DLQs now", "Dead letters in every DLQ right now, every priority sub-list counted."),
    "parked_now": ("waiting for a retry now", "Failed deliveries parked right now, waiting to be due."),
    "dead_lettered": ("dead-lettered since start", "Messages put in a DLQ since this key prefix was first used "
                      "(replays that fail again count again)."),
    "parked": ("parked since start",
               "Failed deliveries parked for a later retry since this key prefix was first used."),
    "redelivered": ("retried since start", "Parked retries moved back to their queue when due (or redelivered now)."),
    "dropped": ("dropped since start",
                "Messages given up on with no DLQ to keep them (dead_letter=False, expired='drop')."),
    "expired": ("expired since start", "Messages whose Celery expires passed: dead-lettered or dropped."),
    "replayed": ("replayed by operators",
                 "Dead letters sent back to a queue by celery dlq replay or this dashboard."),
    "purged": ("purged by operators", "Dead letters deleted by celery dlq purge or this dashboard."),
    "dead_letters_trimmed": ("trimmed by retention",
                             "Dead letters deleted over a DLQ's dead_letter_max_length or ttl."),
    "dead_letter_duplicates_suppressed": (
        "duplicates suppressed", "Redelivered copies of a message already dead-lettered, not dead-lettered twice."),
}


def counter_label(name: str) -> str:
    return COUNTERS.get(name, (name.replace("_", " "), ""))[0]


def counter_help(name: str) -> str:
    return COUNTERS.get(name, ("", f"the {name} counter"))[1] + f" (celery dlq stats: {name})"


FILTERS = {"counter_label": counter_label, "counter_help": counter_help, "at": at, "age": age, "due_in": due_in,
           "segment": segment, "pretty": pretty, "cut": cut}
