"""Charts drawn on the server as SVG: readable without JavaScript, a ``<title>`` (the number) on every bar.

Pure functions from numbers to markup; the pages put a table of the same
numbers underneath where the exact figures matter. No library, no CDN: the
Content-Security-Policy (``default-src 'self'``) stays as strict as it is.
"""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from markupsafe import Markup, escape


def bars(values: Sequence[int], titles: Sequence[str], *, width: int = 120, height: int = 24,
         label: str = "", css: str = "spark", names: Sequence[str] = ()) -> Markup:
    """A bar per value, scaled to the largest; each bar's ``<title>`` is its tooltip (``titles[i]``).

    ``label`` is the chart's accessible name (``aria-label``, and its own
    ``<title>``); an empty bar is drawn as a baseline tick so a quiet hour
    still shows as a slot. ``names``, when given, are written under the bars.
    """
    n = max(len(values), 1)
    top = max(values, default=0) or 1
    step = width / n
    gap = 1 if step > 3 else 0
    full = height + (16 if names else 0)
    parts = [f'<svg class="{escape(css)}" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{full}" '
             f'viewBox="0 0 {width} {full}" role="img" aria-label="{escape(label)}"><title>{escape(label)}</title>']
    for i, name in enumerate(names):
        parts.append(f'<text x="{(i + 0.5) * step:.2f}" y="{full - 3}" text-anchor="middle" font-size="11">'
                     f'{escape(name)}</text>')
    for i, (value, title) in enumerate(zip(values, titles)):
        h = max(1.0, (height - 1) * value / top) if value else 1.0
        parts.append(f'<rect class="{"bar" if value else "zero"}" data-value="{int(value)}" x="{i * step:.2f}" '
                     f'y="{height - h:.2f}" width="{max(step - gap, 0.5):.2f}" height="{h:.2f}">'
                     f'<title>{escape(title)}</title></rect>')
    parts.append("</svg>")
    return Markup("".join(parts))


def hour_label(hour: int) -> str:
    """Unix hour ``hour`` as ``2026-11-24 17:00``."""
    return datetime.fromtimestamp(hour * 3600, timezone.utc).strftime("%Y-%m-%d %H:00")


def sparkline(arrivals: Sequence[int], now: float, *, what: str = "dead-lettered") -> Markup:
    """Arrivals per hour, the last bar the current hour (UTC), as a small bar chart."""
    last = int(now // 3600)
    first = last - len(arrivals) + 1
    titles = [f"{hour_label(first + i)} UTC: {n} {what}" for i, n in enumerate(arrivals)]
    return bars(list(arrivals), titles, label=f"{sum(arrivals)} {what} in the last {len(arrivals)} hours")


def minute_label(minute: int) -> str:
    return datetime.fromtimestamp(minute * 60, timezone.utc).strftime("%H:%M")


#: What each trend counts, as the overview names it.
TREND_TITLES = {"dead_lettered": "Dead-lettered", "parked": "Parked for a retry", "redelivered": "Redelivered"}


def trend_sections(trends: Any) -> list[dict]:
    """Per kind: a chart per minute (the last hour) and per hour (the last 7 days), with the numbers by queue
    and (dead letters) by reason for the table under it. ``trends`` is :class:`celery_dlq.storage.trends.Trends`."""
    minute, hour = int(trends.now // 60), int(trends.now // 3600)
    sections = []
    for kind, title in TREND_TITLES.items():
        per_minute, per_hour = trends.total(kind, "minute"), trends.total(kind, "hour")
        first_minute, first_hour = minute - len(per_minute) + 1, hour - len(per_hour) + 1
        what = title.lower()
        rows = []
        for dimension in ("queue", "reason") if kind == "dead_lettered" else ("queue",):
            for name in trends.names(kind, dimension):
                key = (kind, dimension, name)
                rows.append((dimension, name, sum(trends.minutes.get(key, ())), sum(trends.hours.get(key, ()))))
        sections.append({
            "kind": kind, "title": title, "hour_total": sum(per_minute), "week_total": sum(per_hour), "rows": rows,
            "per_minute": bars(per_minute, [f"{minute_label(first_minute + i)} UTC: {n} {what}"
                                            for i, n in enumerate(per_minute)],
                               width=360, height=60, label=f"{title} per minute, the last hour", css="trend"),
            "per_hour": bars(per_hour, [f"{hour_label(first_hour + i)} UTC: {n} {what}"
                                        for i, n in enumerate(per_hour)],
                             width=504, height=60, label=f"{title} per hour, the last 7 days", css="trend"),
        })
    return sections


def histogram(buckets: Sequence[tuple[str, int]], what: str = "parked retries due") -> Markup:
    """A bar per labelled bucket (the parked retries' due times)."""
    return bars([n for _, n in buckets], [f"{label}: {n} {what}" for label, n in buckets], width=640, height=60,
                label=f"{sum(n for _, n in buckets)} {what}, by when", css="trend", names=[b for b, _ in buckets])
