"""The exporter's ``_total`` counters, in one Redis hash (:attr:`~celery_dlq.storage.keys.Keys.metrics`).

Every worker and operator process raises the same hash, so the counters are
global, survive restarts, and one exporter reads them all with one
``HGETALL`` at scrape time. A hash field is one metric and one label set,
written as Prometheus shows it::

    dead_lettered_total{queue="orders",task="shop.charge",reason="max_delivery_attempts"}

Labels follow :attr:`Metric.LABELS` order, so a label set has one field. In a
label value ``\\``, ``"`` and a newline are escaped as in Prometheus' text
format, and a lone surrogate (JSON can carry one in a task name) as
``\\uXXXX`` so the field can be sent to Redis as UTF-8. Values are cut to
:data:`MAX_VALUE` characters: a field is bounded whatever a message says.

:func:`field` is pure, so code that counts inside a Lua script computes the
field in Python and passes it in (``HINCRBY KEYS[n] ARGV[m] 1``).
"""
from __future__ import annotations

import functools
import logging
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from celery_dlq.storage.keys import Keys

logger = logging.getLogger(__name__)

#: A label value is cut to this many characters before it is encoded.
MAX_VALUE = 200

#: Labels as read back: ``((name, value), ...)`` in :attr:`Metric.LABELS` order (hashable).
Labels = tuple[tuple[str, str], ...]


class Metric:
    """The counters' names (without the exporter's ``celery_dlq_`` prefix) and their label names."""

    PARKED = "parked_total"                    # a failed delivery parked for a later one
    REDELIVERED = "redelivered_total"          # a parked retry moved back to its queue
    DEAD_LETTERED = "dead_lettered_total"      # a message published to its DLQ
    DROPPED = "dropped_total"                  # a message given up on with no DLQ to keep it
    REPLAYED = "replayed_total"                # operator tools: moved from a DLQ back to a queue
    PURGED = "purged_total"                    # operator tools: deleted from a DLQ
    TRIMMED = "trimmed_total"                  # retention: deleted over a DLQ's length or age limit
    SNOOZED = "snoozed_total"                  # a task asked to wait (Snooze): parked, no attempt used
    HELD = "breaker_held_total"                # an open circuit breaker parked a delivery, no attempt used

    LABELS: ClassVar[dict[str, tuple[str, ...]]] = {
        PARKED: ("queue", "task"),
        REDELIVERED: ("queue", "task"),
        DEAD_LETTERED: ("queue", "task", "reason"),
        DROPPED: ("queue", "task"),
        REPLAYED: ("dlq",),
        PURGED: ("dlq",),
        TRIMMED: ("dlq",),
        SNOOZED: ("queue", "task"),
        HELD: ("queue", "task"),
    }

    HELP: ClassVar[dict[str, str]] = {
        PARKED: "Failed deliveries parked for a later delivery.",
        REDELIVERED: "Parked retries moved back to their queue.",
        DEAD_LETTERED: "Messages published to a dead-letter queue.",
        DROPPED: "Messages given up on with no dead-letter queue to keep them.",
        REPLAYED: "Dead letters replayed from a DLQ by the operator tools.",
        PURGED: "Dead letters purged from a DLQ by the operator tools.",
        TRIMMED: "Dead letters deleted by retention (a DLQ's length or age limit).",
        SNOOZED: "Deliveries that snoozed (asked to wait without using an attempt), parked.",
        HELD: "Deliveries an open circuit breaker held (parked, or kept by the fetch) without running them or using "
              "an attempt.",
    }


_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n"}
_UNESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _escape(value: str) -> str:
    out = []
    for char in value[:MAX_VALUE]:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif "\ud800" <= char <= "\udfff":
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return "".join(out)


def field(metric: str, **labels: Any) -> str:
    """The hash field of ``metric`` with ``labels`` (exactly its :attr:`Metric.LABELS`; None counts as "")."""
    names = Metric.LABELS.get(metric)
    if names is None:
        raise ValueError(f"unknown metric {metric!r} (known: {', '.join(sorted(Metric.LABELS))})")
    if set(labels) != set(names):
        raise ValueError(f"{metric} takes the labels {', '.join(names)}; got {', '.join(sorted(labels)) or 'none'}")
    pairs = ",".join(f'{name}="{_escape("" if labels[name] is None else str(labels[name]))}"' for name in names)
    return f"{metric}{{{pairs}}}"


_VALUE = r'(?:[^"\\]|\\["\\n]|\\u[0-9a-fA-F]{4})*'
_PAIR = rf'([A-Za-z_][A-Za-z0-9_]*)="({_VALUE})"'
_FIELD = re.compile(rf'([A-Za-z_:][A-Za-z0-9_:]*)\{{((?:{_PAIR})(?:,{_PAIR})*)?\}}')
_PAIRS = re.compile(_PAIR)
_ESCAPED = re.compile(r'\\(["\\n]|u[0-9a-fA-F]{4})')


def _unescape(match: re.Match) -> str:
    escaped = match.group(1)
    return _UNESCAPES[escaped] if len(escaped) == 1 else chr(int(escaped[1:], 16))


def parse_field(text: str) -> tuple[str, Labels]:
    """``(metric, labels)`` of a field written by :func:`field`; ValueError when it is not one."""
    match = _FIELD.fullmatch(text)
    if match is None:
        raise ValueError(f"not a metric field: {text!r}")
    labels = tuple((name, _ESCAPED.sub(_unescape, value) if "\\" in value else value)
                   for name, value in _PAIRS.findall(match.group(2) or ""))
    return match.group(1), labels


def incr(client: Any, keys: Keys, metric: str, n: int = 1, **labels: Any) -> Any:
    """Raise ``metric`` with ``labels`` by ``n``: one ``HINCRBY`` (on a client, or queued on a pipeline)."""
    return client.hincrby(keys.metrics, field(metric, **labels), int(n))


def read(client: Any, keys: Keys | Sequence[Keys]) -> dict[tuple[str, Labels], int]:
    """Every counter: ``(metric, labels) -> value``, with one ``HGETALL`` per key set (summed over the
    shards of a sharded store), in one pipeline.

    A field that is not a known metric with its labels (written by another
    version, or by hand) is skipped and logged, never raised on: a scrape
    must not fail over one bad field.
    """
    counters: dict[tuple[str, Labels], int] = {}
    pipe = client.pipeline(transaction=False)
    keysets = [keys] if isinstance(keys, Keys) else list(keys)
    for keyset in keysets:
        pipe.hgetall(keyset.metrics)
    pipe.hgetall(keysets[0].breaker_kept_total)   # what the fetch kept for breakers: breaker_held_total too
    found_all = pipe.execute()
    rows = [(raw, value) for found in found_all[:-1] for raw, value in (found or {}).items()]
    for raw, value in (found_all[-1] or {}).items():
        queue, _, task = (raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)).partition("\x1f")
        rows.append((field(Metric.HELD, queue=queue, task=task), value))
    for raw, value in rows:
        key = _counter(raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw))
        if key is not None:
            try:
                counters[key] = counters.get(key, 0) + int(value)
            except ValueError:
                logger.debug("celery-dlq: skipped metrics field %r: value %r", key, value)
    return counters


@functools.lru_cache(maxsize=4096)   # the same fields come back at every scrape
def _counter(text: str) -> tuple[str, Labels] | None:
    """The counter a field names, labels in :attr:`Metric.LABELS` order; None (logged once) when it names none."""
    try:
        metric, labels = parse_field(text)
        names = Metric.LABELS[metric]
    except (KeyError, ValueError) as exc:
        logger.debug("celery-dlq: skipped metrics field %r: %s", text, exc)
        return None
    values = dict(labels)
    if len(values) != len(labels) or set(values) != set(names):
        logger.debug("celery-dlq: skipped metrics field %r: its labels are not %s's %s", text, metric, names)
        return None
    return metric, tuple((name, values[name]) for name in names)
