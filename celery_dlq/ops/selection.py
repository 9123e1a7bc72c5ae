"""Which dead letters an operation takes, as a value: built from CLI options, a query string or Python alike.

The filter's parameters have one spelling everywhere (:data:`PARAMS`: the
CLI's option names without ``--``, the dashboard's URL parameters, the JSON
API's ``filter`` keys) and one parser, :func:`parse_filter`: ``celery dlq``
(``cli/options.py``) and the dashboard (``web/query.py``) only adapt their
input to it and its :class:`BadSelection` to their way of saying so.

A :class:`Selection` is ticked task ids, a filter's matches, or (said
explicitly) the whole DLQ; :meth:`Selection.selector` gives what a replay
(the oldest letter of each id) or a purge (every letter of each id) passes
to :class:`~celery_dlq.ops.queue.DeadLetterQueue`, and
:meth:`~celery_dlq.ops.queue.DeadLetterQueue.count` says how many that is
before anyone confirms.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from celery_dlq.errors import ConfigurationError
from celery_dlq.headers import Reason
from celery_dlq.ops.letters import Filter, Selector, TaskIds
from celery_dlq.storage.groups import is_group_id
from celery_dlq.timespec import parse_since

#: Parameter -> :class:`Filter` field. The CLI's options are ``--<parameter>`` (``--exception``, ``--grep``).
PARAMS = {"task": "task_name", "reason": "reason", "exception": "exception_type",
          "original_queue": "original_queue", "since": "since", "until": "until", "grep": "text",
          "group": "group"}


class BadSelection(ValueError):
    """A filter value that cannot be read; ``param`` names it (a :data:`PARAMS` key), the message says why."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class NothingSelected(ValueError):
    """Neither ids, nor a filter, nor "all": an operation must not take every dead letter by accident."""


def parse_filter(values: Mapping[str, Any], now: float | None = None) -> Filter | None:
    """The :class:`Filter` that ``values`` (:data:`PARAMS` keys; None or blank is unset) mean; None when unfiltered.

    Times are unix seconds, ISO 8601 (naive means UTC) or an age (``2h``) before
    ``now``; ``task`` is a wildcard pattern; ``group`` a group id.
    """
    unknown = sorted(set(values) - set(PARAMS))
    if unknown:
        raise BadSelection(unknown[0], f"unknown filter {unknown[0]!r} (filters: {', '.join(PARAMS)})")
    given = {name: str(value).strip() for name, value in values.items() if value is not None and str(value).strip()}
    if not given:
        return None
    if "reason" in given and given["reason"] not in Reason.ALL:
        raise BadSelection("reason", f"reason must be one of {', '.join(Reason.ALL)}, got {given['reason']!r}")
    if "group" in given and not is_group_id(given["group"]):
        raise BadSelection("group", "a group id is 16 hex digits (as `celery dlq groups` and the groups page show "
                                    f"them), got {given['group']!r}"[:200])
    fields: dict[str, Any] = {PARAMS[name]: value for name, value in given.items()}
    for name in ("since", "until"):
        if name in given:
            fields[name] = _time(name, given[name], now)
    try:
        return Filter(**fields)
    except ConfigurationError as exc:   # a bad task-name pattern
        raise BadSelection("task", str(exc)) from None


def _time(param: str, value: str, now: float | None) -> float | None:
    try:
        return parse_since(value, now)
    except ConfigurationError as exc:
        raise BadSelection(param, str(exc)) from None


@dataclass(frozen=True)
class Selection:
    """Task ids (narrowed by ``where`` when both are given), else ``where``'s matches, else ``everything``.

    Build it with :meth:`of`, which refuses a selection of nothing said.
    """

    ids: tuple[str, ...] = ()
    where: Filter | None = None
    everything: bool = False

    @classmethod
    def of(cls, ids: Iterable[str] = (), where: Filter | None = None, everything: bool = False) -> Selection:
        """The selection; :class:`NothingSelected` when no id, no filter and not ``everything``."""
        selection = cls(tuple(dict.fromkeys(i for i in ids if i)), where, everything)
        if not (selection.ids or where is not None or everything):
            raise NothingSelected("say which dead letters: task ids, a filter, or all")
        return selection

    def selector(self, *, every: bool = False) -> Selector | None:
        """What an operation passes: the ids (the oldest letter of each; with ``every``, each letter, as a purge
        takes them), else the filter; None for the whole DLQ."""
        return TaskIds(self.ids, self.where, every=every) if self.ids else self.where

    def describe(self) -> str:
        """``3 task id(s)``, ``every dead letter matching task=shop.*``, ``every dead letter``."""
        if self.ids:
            return f"{len(self.ids)} selected task id(s)"
        if self.where is not None:
            return "every dead letter matching " + describe_filter(self.where)
        return "every dead letter"


def describe_filter(where: Filter) -> str:
    """``task=shop.*, reason=rejected``: a filter's set fields under their :data:`PARAMS` names."""
    names = {field: param for param, field in PARAMS.items()}
    return ", ".join(f"{names.get(field, field)}={getattr(where, field)}"
                     for field in (*PARAMS.values(), "task_id") if getattr(where, field) is not None)
