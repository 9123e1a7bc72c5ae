"""The DLQ page's URL parameters: the filters of ``celery dlq list``, paging and order.

Parameter names are the CLI's option names (``task``, ``reason``,
``exception``, ``original_queue``, ``since``, ``until``, ``grep``, ``group``), so a
filtered view is a bookmarkable URL that reads like the command line.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from celery_dlq.errors import ConfigurationError
from celery_dlq.headers import Reason
from celery_dlq.ops.letters import Filter
from celery_dlq.storage.groups import is_group_id
from celery_dlq.timespec import parse_since

#: URL parameter -> Filter field.
FILTERS = {"task": "task_name", "reason": "reason", "exception": "exception_type",
           "original_queue": "original_queue", "since": "since", "until": "until", "grep": "text",
           "group": "group"}
PAGE_SIZES = (20, 50, 100, 200)


class BadQuery(ValueError):
    """A filter or paging parameter that cannot be read; the message says which and why."""


@dataclass(frozen=True)
class Query:
    """The filters as typed (``values``), the order, the page start and size."""

    values: dict[str, str]
    newest_first: bool = True
    start: int = 0
    size: int = 50

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> Query:
        values = {name: str(params[name]).strip() for name in FILTERS if str(params.get(name) or "").strip()}
        if values.get("reason") and values["reason"] not in Reason.ALL:
            raise BadQuery(f"reason must be one of {', '.join(Reason.ALL)}, got {values['reason']!r}")
        if values.get("group") and not is_group_id(values["group"]):
            raise BadQuery("group must be a group id (16 hex digits, as the groups page shows), "
                           f"got {values['group']!r}"[:200])
        order = params.get("order") or "newest"
        if order not in ("newest", "oldest"):
            raise BadQuery(f"order must be newest or oldest, got {order!r}")
        try:
            start, size = int(params.get("start") or 0), int(params.get("size") or 50)
        except ValueError:
            raise BadQuery("start and size must be whole numbers") from None
        if start < 0 or size not in PAGE_SIZES:
            raise BadQuery(f"start must be >= 0 and size one of {PAGE_SIZES}")
        query = cls(values, order == "newest", start, size)
        query.selection()  # a bad pattern or time fails here, with its message
        return query

    def selection(self, now: float | None = None) -> Filter | None:
        """The :class:`Filter` these values mean (as ``celery dlq list`` builds it); None when unfiltered."""
        if not self.values:
            return None
        fields = {FILTERS[name]: value for name, value in self.values.items()}
        try:
            for name in ("since", "until"):
                if name in fields:
                    fields[name] = parse_since(fields[name], now)
            return Filter(**fields)
        except ConfigurationError as exc:
            raise BadQuery(str(exc)) from None

    @property
    def order(self) -> str:
        return "newest" if self.newest_first else "oldest"

    def url(self, **changes: Any) -> str:
        """This view's query string with ``changes`` (``start=0``...); defaults left out."""
        params: dict[str, Any] = dict(self.values, order=self.order, start=self.start, size=self.size)
        params.update(changes)
        defaults = {"order": "newest", "start": 0, "size": 50}
        return urlencode({k: v for k, v in params.items() if v not in (None, "") and defaults.get(k) != v})

    def filter_url(self) -> str:
        """Only the filters, for the action forms (which act on every match, whatever the page)."""
        return urlencode(self.values)
