"""Trends: dead-lettered, parked and redelivered per minute (the last hour) and per hour (the last week).

One HASH per key set (:attr:`Keys.trends`), written by the code that does the
work: ``park.lua`` for parks, ``trend.lua`` (in the same pipeline as the
exporter's counters; at once on a Redis Cluster, whose pipelines cannot
carry a script) for dead letters and redeliveries. A series is a kind
and a queue, or for dead letters also a reason; each is two rings of fixed
size (``lua/lib.lua``, ``trend_add``): 60 minute slots and 168 hour slots,
each ``"<stamp>:<count>"``, overwritten when its minute or hour comes round
again. Memory is bounded by the number of series, not by traffic: about
228 fields of some 40 bytes each, 14 kB per series (docs/web.md gives the
measured figure), whatever the rate.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.cluster import ClusterPipeline

from celery_dlq.storage.keys import Keys

KINDS = ("dead_lettered", "parked", "redelivered")
MINUTES, HOURS = 60, 168


def series(kind: str, queue: str | None = None, reason: str | None = None) -> list[str]:
    """The series an event of ``kind`` counts in: its queue's, and for a dead letter its reason's."""
    out = [f"{kind}|queue|{queue or ''}"]
    if reason is not None:
        out.append(f"{kind}|reason|{reason}")
    return out


def count(pipe: Any, scripts: Any, keys: Keys, names: Sequence[str], n: int, now: float,
          client: Any = None) -> None:
    """Queue ``trend.lua`` on ``pipe`` (a pipeline or client): ``n`` events at ``now`` in each of ``names``.

    redis-py refuses a script in a Redis Cluster pipeline (``EVALSHA`` is blocked there): with one, the
    script runs at once on ``client``, the store's, apart from the pipeline (a trend is a count per minute)."""
    if n and names:
        target = client if client is not None and isinstance(pipe, ClusterPipeline) else pipe
        scripts.get("trend")(keys=[keys.trends], args=[int(now // 60), int(n), *names], client=target)


@dataclass
class Trends:
    """Series -> counts per minute (``minutes``, 60, the current minute last) and per hour (``hours``, 168)."""

    now: float
    minutes: dict[tuple[str, str, str], list[int]] = field(default_factory=dict)
    hours: dict[tuple[str, str, str], list[int]] = field(default_factory=dict)

    def total(self, kind: str, per: str = "minute") -> list[int]:
        """Every queue of ``kind`` added up, per minute or per hour (the by-queue series sum to everything)."""
        source = self.minutes if per == "minute" else self.hours
        width = MINUTES if per == "minute" else HOURS
        rows = [values for (k, dim, _), values in source.items() if k == kind and dim == "queue"]
        return [sum(column) for column in zip(*rows)] if rows else [0] * width

    def names(self, kind: str, dimension: str) -> list[str]:
        """The queues (or reasons) with events of ``kind`` in the last week, the busiest first."""
        found = {(name, sum(values)) for (k, dim, name), values in self.hours.items() if k == kind and dim == dimension}
        return [name for name, _ in sorted(found, key=lambda x: (-x[1], x[0]))]


def parse(fields: Iterable[tuple[bytes, bytes]], now: float) -> Trends:
    """The trends of ``HGETALL`` replies (summed over shards); slots outside the last hour or week are dropped."""
    trends = Trends(now)
    minute, hour = int(now // 60), int(now // 3600)
    for raw_name, raw_value in fields:
        name, value = raw_name.decode("utf-8", "replace"), raw_value.decode("utf-8", "replace")
        base, _, slot = name.rpartition("|")
        kind, _, rest = base.partition("|")
        dimension, _, series_name = rest.partition("|")
        stamp_text, _, count_text = value.partition(":")
        try:
            stamp, n = int(stamp_text), int(count_text)
        except ValueError:
            continue
        key = (kind, dimension, series_name)
        if slot.startswith("m") and minute - MINUTES < stamp <= minute:
            trends.minutes.setdefault(key, [0] * MINUTES)[MINUTES - 1 - (minute - stamp)] += n
        elif slot.startswith("h") and hour - HOURS < stamp <= hour:
            trends.hours.setdefault(key, [0] * HOURS)[HOURS - 1 - (hour - stamp)] += n
    for key in trends.hours:   # a series seen this week has a (maybe quiet) last hour too
        trends.minutes.setdefault(key, [0] * MINUTES)
    return trends


def read(client: Any, keysets: Sequence[Keys], now: float) -> Trends:
    """The trends of every key set (the home set and each shard), in one round trip."""
    pipe = client.pipeline(transaction=False)
    for keys in keysets:
        pipe.hgetall(keys.trends)
    found: list[tuple[bytes, bytes]] = []
    for reply in pipe.execute():
        found.extend((reply or {}).items())
    return parse(found, now)

