"""report.html: one self-contained page (inline CSS, charts as base64 PNG) from report.json's content.

Charts are drawn with matplotlib's object API (``Figure`` + the Agg canvas),
which leaves pyplot and the process's backend alone. No pyspark here.
"""
from __future__ import annotations

import base64
import io
from collections import defaultdict
from collections.abc import Iterable
from html import escape
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

PALETTE = ["#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2", "#97bbf5", "#9c6b4e"]
MAX_SERIES = 8


def _png(fig: Figure) -> str:
    FigureCanvasAgg(fig)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _figure(width: float = 8.0, height: float = 3.2) -> tuple[Figure, Any]:
    fig = Figure(figsize=(width, height))
    ax = fig.add_subplot()
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="y", alpha=0.3)
    return fig, ax


def _empty(ax: Any, text: str = "no data") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#777")
    ax.set_xticks([])
    ax.set_yticks([])


def _top(totals: dict[str, int], n: int = MAX_SERIES) -> list[str]:
    return [k for k, _ in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]


def chart_per_day(rows: list[dict]) -> str:
    """Stacked bars: dead letters per UTC day, by queue (the busiest queues, the rest as 'other')."""
    fig, ax = _figure()
    if not rows:
        _empty(ax)
        return _png(fig)
    totals: dict[str, int] = defaultdict(int)
    for r in rows:
        totals[r["queue"] or "(none)"] += r["dead_letters"]
    shown = _top(totals)
    days = sorted({r["day"] for r in rows})
    series: dict[str, list[int]] = {q: [0] * len(days) for q in [*shown, "other"]}
    for r in rows:
        q = r["queue"] or "(none)"
        series[q if q in shown else "other"][days.index(r["day"])] += r["dead_letters"]
    bottom = [0] * len(days)
    for i, (queue, values) in enumerate(series.items()):
        if any(values):
            ax.bar(range(len(days)), values, bottom=bottom, label=queue, color=PALETTE[i % len(PALETTE)])
            bottom = [b + v for b, v in zip(bottom, values)]
    step = max(1, len(days) // 12)
    ax.set_xticks(range(0, len(days), step), [days[i] for i in range(0, len(days), step)], rotation=45, ha="right")
    ax.set_ylabel("dead letters")
    ax.legend(fontsize="small", frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _png(fig)


def chart_bars(labels: list[str], values: list[float], *, xlabel: str = "", ylabel: str = "",
               horizontal: bool = False, color: str = PALETTE[0], fmt: str = "{:g}",
               limit: float | None = None) -> str:
    fig, ax = _figure(8.0, max(2.4, 0.35 * len(labels) + 1) if horizontal else 3.2)
    if not labels:
        _empty(ax)
        return _png(fig)
    positions = list(range(len(labels)))
    bars = (ax.barh(positions, values, color=color) if horizontal else ax.bar(positions, values, color=color))
    if horizontal:
        ax.set_yticks(positions, labels)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
        ax.grid(axis="y", visible=False)
    else:
        ax.set_xticks(positions, labels)
    ax.bar_label(bars, labels=[fmt.format(v) for v in values], fontsize="small", padding=2)
    if limit is not None:
        (ax.set_xlim if horizontal else ax.set_ylim)(0, limit)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return _png(fig)


def chart_trend(rows: list[dict]) -> str:
    """Grouped bars per queue: the previous 7 days against the last 7."""
    fig, ax = _figure()
    if not rows:
        _empty(ax, "no dead letters in the last 14 days")
        return _png(fig)
    rows = sorted(rows, key=lambda r: -(r["last_7d"] + r["previous_7d"]))[:MAX_SERIES * 2]
    x = list(range(len(rows)))
    ax.bar([i - 0.2 for i in x], [r["previous_7d"] for r in rows], width=0.4, label="previous 7 days",
           color="#bbb")
    ax.bar([i + 0.2 for i in x], [r["last_7d"] for r in rows], width=0.4, label="last 7 days", color=PALETTE[2])
    ax.set_xticks(x, [r["queue"] or "(none)" for r in rows], rotation=30, ha="right")
    ax.set_ylabel("dead letters")
    ax.legend(frameon=False)
    return _png(fig)


def charts(report: dict[str, Any]) -> dict[str, str]:
    """Every chart of the page, as base64 PNG, by name."""
    per_day = report["dead_letters"]["per_day"]
    by_exception: dict[str, int] = defaultdict(int)
    for r in per_day:
        by_exception[r["exception_type"] or "(none)"] += r["dead_letters"]
    top_exc = _top(by_exception, 10)
    attempts = report["attempts_before_death"]
    latency = report["time_to_dead_letter"]
    # The tasks redelivery helps least (lowest rate, then the most redelivered) are what to look at.
    redelivery = sorted((r for r in report["redelivery"] if r["success_rate"] is not None),
                        key=lambda r: (r["success_rate"], -r["redelivered"], r["task_name"] or ""))[:15]
    return {
        "per_day": chart_per_day(per_day),
        "exceptions": chart_bars(top_exc, [by_exception[e] for e in top_exc], xlabel="dead letters",
                                 horizontal=True, color=PALETTE[2]),
        "attempts": chart_bars([str(r["attempts"]) for r in attempts], [r["dead_letters"] for r in attempts],
                               xlabel="deliveries before the dead letter", ylabel="dead letters"),
        "latency": chart_bars([h["bucket"] for h in latency["histogram"]],
                              [h["dead_letters"] for h in latency["histogram"]],
                              xlabel="first failure to dead letter", ylabel="dead letters", color=PALETTE[3]),
        "redelivery": chart_bars([r["task_name"] or "(none)" for r in redelivery],
                                 [100 * r["success_rate"] for r in redelivery],
                                 xlabel="% succeeded after redelivery (the 15 lowest)", horizontal=True,
                                 color=PALETTE[4], fmt="{:.0f}%", limit=105),
        "trend": chart_trend(report["trend"]["by_queue"]),
    }


def _seconds(value: float | None) -> str:
    if value is None:
        return "n/a"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.1f} s"


def _table(headers: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    head = "".join(f"<th>{escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape('' if c is None else str(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body or '<tr><td>none</td></tr>'}</tbody></table>"


def _img(png: str, alt: str) -> str:
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{png}">'


CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:2rem auto;max-width:64rem;color:#222;padding:0 1rem}
h1{font-size:1.6rem}h2{font-size:1.15rem;margin-top:2.2rem;border-bottom:1px solid #ddd}
.cards{display:flex;flex-wrap:wrap;gap:.8rem}.card{border:1px solid #ddd;border-radius:6px;padding:.6rem 1rem}
.card b{display:block;font-size:1.5rem}table{border-collapse:collapse;margin:.6rem 0;font-size:13px}
td,th{border-bottom:1px solid #eee;padding:.25rem .6rem;text-align:left}img{max-width:100%}
.muted{color:#777}code{background:#f4f4f4;padding:0 .2rem}"""


def render_html(report: dict[str, Any]) -> str:
    """The whole page."""
    c = charts(report)
    trend, latency, plan = report["trend"], report["time_to_dead_letter"], report["replay_plan"]
    change = "n/a" if trend["change"] is None else f"{trend['change']:+.0%}"
    cards = [("dead letters", report["dead_letters"]["total"]),
             ("last 7 days", f"{trend['last_7d']['dead_letters']} ({change})"),
             ("time to dead letter p50 / p90 / p99",
              " / ".join(_seconds(latency.get(k)) for k in ("p50", "p90", "p99"))),
             ("poison payloads", report["poison_payloads"]["count"]),
             ("replay plan", f"{plan['counts']['selected']} selected")]
    poison = report["poison_payloads"]["top"]
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>Dead-letter report</title><style>{CSS}</style>"
        "</head><body><h1>Dead-letter report</h1>",
        f"<p class='muted'>As of {escape(report['as_of'])} (UTC), from <code>{escape(str(report['source']))}</code>:"
        f" {report['events']['total']} events, {report['dead_letters']['dropped']} dropped.</p>",
        "<div class='cards'>" + "".join(f"<div class='card'>{escape(k)}<b>{escape(str(v))}</b></div>"
                                        for k, v in cards) + "</div>",
        "<h2>Dead letters per day (UTC), by queue</h2>", _img(c["per_day"], "dead letters per day"),
        "<h2>Last 7 days against the 7 before</h2>", _img(c["trend"], "trend"),
        "<h2>Top exception types</h2>", _img(c["exceptions"], "exception types"),
        "<h2>Deliveries before the dead letter</h2>", _img(c["attempts"], "attempts"),
        "<h2>Time from first failure to dead letter</h2>", _img(c["latency"], "time to dead letter"),
        f"<p class='muted'>{latency['count']} dead letters; {escape(latency['definition'])}.</p>",
        "<h2>Redelivery success rate per task</h2>", _img(c["redelivery"], "redelivery success"),
        _table(["task", "redelivered", "succeeded", "dead after redelivery", "pending", "dead", "rate"],
               [[r["task_name"], r["redelivered"], r["succeeded_after_redelivery"], r["dead_after_redelivery"],
                 r["pending"], r["dead"],
                 "n/a" if r["success_rate"] is None else f"{r['success_rate']:.0%}"] for r in report["redelivery"]]),
        "<h2>Recurring poison payloads</h2>",
        _table(["payload hash", "task", "dead letters", "messages", "exceptions", "first seen", "last seen"],
               [[p["payload_hash"], p["task_name"], p["dead_letters"], p["messages"],
                 ", ".join(filter(None, p["exception_types"])), p["first_seen"], p["last_seen"]] for p in poison]),
        "<h2>Replay plan</h2>",
        _table(["predicate", "value"], [[k, v] for k, v in plan["predicates"].items()]),
        _table(["count", "value"], [[k, v] for k, v in plan["counts"].items()]),
        _table(["dead-letter queue", "selected"], sorted(plan["by_dlq"].items())),
        "<p class='muted'>Replay it with <code>celery dlq replay --plan DIR --dry-run</code>, then without "
        "<code>--dry-run</code>.</p></body></html>",
    ]
    return "\n".join(parts)
