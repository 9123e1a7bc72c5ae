"""A task's own policy levels: its ``redelivery_policy``, then the retry options it set in Celery's own terms.

Teams adopt celery-dlq on tasks that already say ``max_retries=3``,
``default_retry_delay``, ``autoretry_for``, ``retry_backoff``,
``retry_backoff_max``, ``retry_jitter``. Those options are mapped onto the
task's policy (docs/celery-options.md), below an explicit
``redelivery_policy`` and above the app's pattern and default policies.
Only options the task set itself count: an attribute Celery's ``Task``
class merely inherits (``max_retries = 3``, ``default_retry_delay = 180``)
is not the task's say.

Each level is ``(origin, fields)``: ``origin`` is what ``celery dlq policy``
prints beside each field it gave.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery_dlq.policy import UNLIMITED, validate_fields

#: The level names, as ``celery dlq policy`` shows them.
TASK_POLICY = "task redelivery_policy"
CELERY_OPTION = "task Celery option"

#: Celery's own defaults for the options it reads together with ``retry_backoff`` (celery/app/autoretry.py).
CELERY_BACKOFF_MAX, CELERY_JITTER = 600, True

_OPTIONS = ("max_retries", "default_retry_delay", "retry_backoff", "retry_backoff_max", "retry_jitter",
            "autoretry_for", "dont_autoretry_for")

Level = tuple[str, Mapping[str, Any]]


def own_options(task: Any) -> dict[str, Any]:
    """The Celery retry options ``task``'s own class (or its decorator) sets, not those it inherits from Celery."""
    found = {}
    for name in _OPTIONS:
        owner = next((klass for klass in task.__class__.__mro__ if name in vars(klass)), None)  # a proxy too
        if owner is None or owner.__module__.split(".")[0] in ("celery", "celery_dlq"):
            continue
        found[name] = getattr(task, name)
    return found


def celery_option_levels(task: Any) -> list[Level]:
    """One level per Celery option the task set, each holding the policy fields it maps to."""
    options = own_options(task)
    levels: list[Level] = []
    where = f"task {getattr(task, 'name', task)!r}"

    def add(option: str, fields: dict[str, Any]) -> None:
        origin = f"{CELERY_OPTION} {option}={_shown(options[option])}"
        levels.append((origin, validate_fields(fields, f"{where} Celery option {option}")))

    if "max_retries" in options:
        retries = options["max_retries"]
        add("max_retries", {"max_delivery_attempts": UNLIMITED if retries is None else int(retries) + 1})
    backoff = options.get("retry_backoff")
    if backoff:
        # Celery: countdown = min(retry_backoff_max, factor x 2^retries), then U{0..countdown} with retry_jitter.
        add("retry_backoff", {"redelivery_delay": float(max(1, int(backoff))), "redelivery_multiplier": 2.0})
        if "retry_backoff_max" in options:
            add("retry_backoff_max", {"max_redelivery_delay": float(options["retry_backoff_max"])})
        else:
            levels.append((f"Celery's default retry_backoff_max={CELERY_BACKOFF_MAX} (the task sets retry_backoff)",
                           {"max_redelivery_delay": float(CELERY_BACKOFF_MAX)}))
        if "retry_jitter" in options:
            add("retry_jitter", {"redelivery_full_jitter": bool(options["retry_jitter"])})
        else:
            levels.append((f"Celery's default retry_jitter={CELERY_JITTER} (the task sets retry_backoff)",
                           {"redelivery_full_jitter": CELERY_JITTER}))
    if "default_retry_delay" in options and options["default_retry_delay"] is not None:
        add("default_retry_delay", {"redelivery_delay": float(options["default_retry_delay"])})
    if options.get("autoretry_for"):
        add("autoretry_for", {"retry_on": tuple(options["autoretry_for"])})
    if options.get("dont_autoretry_for"):
        add("dont_autoretry_for", {"dead_letter_on": tuple(options["dont_autoretry_for"])})
    return levels


def _shown(value: Any) -> str:
    """An option's value as its decorator would spell it: exception classes by name."""
    if isinstance(value, (tuple, list)) and all(isinstance(item, type) for item in value):
        return "(" + "".join(f"{item.__name__}, " for item in value).rstrip(" ") + ")"
    return repr(value)


def task_levels(task: Any) -> list[Level]:
    """The task's own levels, highest first: its ``redelivery_policy``, then its Celery options."""
    if task is None:
        return []
    levels: list[Level] = []
    spec = getattr(task, "redelivery_policy", None)
    if spec is not None:
        levels.append((TASK_POLICY, validate_fields(spec, f"task {getattr(task, 'name', task)!r} redelivery_policy")))
    return levels + celery_option_levels(task)


def is_task_level(origin: str) -> bool:
    """Whether an origin names one of the task's own levels."""
    return origin.startswith(("task ", "Celery's default"))
