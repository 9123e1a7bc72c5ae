"""The DLQ page's URL parameters: the filters of ``celery dlq list`` (read by ``ops.selection``), paging, order.

Parameter names are the CLI's option names (``task``, ``reason``,
``exception``, ``original_queue``, ``since``, ``until``, ``grep``, ``group``), so a
filtered view is a bookmarkable URL that reads like the command line.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from celery_dlq.ops.letters import Filter
from celery_dlq.ops.selection import PARAMS, BadSelection, parse_filter

#: The filters' URL parameters (``celery_dlq.ops.selection.PARAMS``, the CLI's option names).
FILTERS = PARAMS
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
        query.selection()  # a bad value fails here, with its message
        return query

    def selection(self, now: float | None = None) -> Filter | None:
        """The :class:`Filter` these values mean (``ops.selection.parse_filter``, as the CLI reads its options)."""
        try:
            return parse_filter(self.values, now)
        except BadSelection as exc:
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
