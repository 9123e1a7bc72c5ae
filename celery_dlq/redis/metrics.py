"""The exporter's ``_total`` counters, kept in one Redis hash (:attr:`Keys.metrics <celery_dlq.redis.keys.Keys.metrics>`).

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

import logging
from typing import Any, ClassVar

from celery_dlq.redis.keys import Keys

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

    LABELS: ClassVar[dict[str, tuple[str, ...]]] = {
        PARKED: ("queue", "task"),
        REDELIVERED: ("queue", "task"),
        DEAD_LETTERED: ("queue", "task", "reason"),
        DROPPED: ("queue", "task"),
        REPLAYED: ("dlq",),
        PURGED: ("dlq",),
        TRIMMED: ("dlq",),
    }

    HELP: ClassVar[dict[str, str]] = {
        PARKED: "Failed deliveries parked for a later delivery.",
        REDELIVERED: "Parked retries moved back to their queue.",
        DEAD_LETTERED: "Messages published to a dead-letter queue.",
        DROPPED: "Messages given up on with no dead-letter queue to keep them.",
        REPLAYED: "Dead letters replayed from a DLQ by the operator tools.",
        PURGED: "Dead letters purged from a DLQ by the operator tools.",
        TRIMMED: "Dead letters deleted by retention (a DLQ's length or age limit).",
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


def parse_field(text: str) -> tuple[str, Labels]:
    """``(metric, labels)`` of a field written by :func:`field`; ValueError when it is not one."""
    metric, brace, rest = text.partition("{")
    if not metric or not brace or not rest.endswith("}"):
        raise ValueError(f"not a metric field: {text!r}")
    labels: list[tuple[str, str]] = []
    at, end = 0, len(rest) - 1
    while at < end:
        if labels:
            if rest[at] != ",":
                raise ValueError(f"expected ',' at {at} in {text!r}")
            at += 1
        name, eq, _ = rest[at:end].partition('="')
        if not eq or not name.isidentifier():
            raise ValueError(f"expected name=\"value\" at {at} in {text!r}")
        value, at = _unquote(rest, at + len(name) + 2, end, text)
        labels.append((name, value))
    return metric, tuple(labels)


def _unquote(rest: str, at: int, end: int, text: str) -> tuple[str, int]:
    """The escaped value starting at ``rest[at]``, and the index after its closing quote."""
    out = []
    while at < end:
        char = rest[at]
        if char == '"':
            return "".join(out), at + 1
        if char != "\\":
            out.append(char)
            at += 1
        elif rest[at + 1:at + 2] in _UNESCAPES:
            out.append(_UNESCAPES[rest[at + 1]])
            at += 2
        elif rest[at + 1:at + 2] == "u" and _is_hex(rest[at + 2:at + 6]):
            out.append(chr(int(rest[at + 2:at + 6], 16)))
            at += 6
        else:
            raise ValueError(f"bad escape at {at} in {text!r}")
    raise ValueError(f"unterminated value in {text!r}")


def _is_hex(text: str) -> bool:
    return len(text) == 4 and all(c in "0123456789abcdefABCDEF" for c in text)


def incr(client: Any, keys: Keys, metric: str, n: int = 1, **labels: Any) -> Any:
    """Raise ``metric`` with ``labels`` by ``n``: one ``HINCRBY`` (on a client, or queued on a pipeline)."""
    return client.hincrby(keys.metrics, field(metric, **labels), int(n))


def read(client: Any, keys: Keys) -> dict[tuple[str, Labels], int]:
    """Every counter: ``(metric, labels) -> value``, with one ``HGETALL``.

    A field that is not a known metric with its labels (written by another
    version, or by hand) is skipped and logged, never raised on: a scrape
    must not fail over one bad field.
    """
    counters: dict[tuple[str, Labels], int] = {}
    for raw, value in client.hgetall(keys.metrics).items():
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        try:
            metric, labels = parse_field(text)
            names = Metric.LABELS[metric]
            values = dict(labels)
            if len(values) != len(labels) or set(values) != set(names):
                raise ValueError(f"labels {sorted(values)} are not {metric}'s {list(names)}")
            key = (metric, tuple((name, values[name]) for name in names))
            counters[key] = counters.get(key, 0) + int(value)
        except (KeyError, ValueError) as exc:
            logger.debug("celery-dlq: skipped metrics field %r: %s", text, exc)
    return counters
