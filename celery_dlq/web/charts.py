"""Charts drawn on the server as SVG: readable without JavaScript, a ``<title>`` (the number) on every bar.

Pure functions from numbers to markup; the pages put a table of the same
numbers underneath where the exact figures matter. No library, no CDN: the
Content-Security-Policy (``default-src 'self'``) stays as strict as it is.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Sequence

from markupsafe import Markup, escape


def bars(values: Sequence[int], titles: Sequence[str], *, width: int = 120, height: int = 24,
         label: str = "", css: str = "spark") -> Markup:
    """A bar per value, scaled to the largest; each bar's ``<title>`` is its tooltip (``titles[i]``).

    ``label`` is the chart's accessible name (``aria-label``, and its own
    ``<title>``); an empty bar is drawn as a baseline tick so a quiet hour
    still shows as a slot.
    """
    n = max(len(values), 1)
    top = max(values, default=0) or 1
    step = width / n
    gap = 1 if step > 3 else 0
    parts = [f'<svg class="{escape(css)}" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}"><title>{escape(label)}</title>']
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
