"""Where kombu's Redis transport keeps a queue, and how to reach the broker's Redis.

Dead letters are not ours to lay out: a DLQ is an ordinary kombu queue, so
it lives where kombu's Redis transport puts every queue (one LIST per
priority step, kombu's ``global_keyprefix`` in front). This module is the one
place that knows that layout, so the operator tools (:mod:`celery_dlq.manage`)
and retention (:mod:`celery_dlq.retention`) read and write the very lists
kombu does. It imports nothing else of ours but settings, so either can use
it without an import cycle.
"""
from __future__ import annotations

from bisect import bisect
from dataclasses import dataclass
from typing import Any

import redis
from kombu.utils.url import maybe_sanitize_url

from celery_dlq.errors import DLQError
from celery_dlq.settings import REDIS_SCHEMES, client_url

#: kombu's Redis transport: priority sub-lists are ``name + SEP + step``.
SEP = "\x06\x16"
PRIORITY_STEPS = (0, 3, 6, 9)


class BrokerNotSupported(DLQError):
    """Dead letters are read from the broker's Redis lists: other brokers have none."""


def connect(url: str) -> redis.Redis:
    """A bytes client that fails fast: an operator wants an error, not a hang."""
    return redis.Redis.from_url(client_url(url), socket_connect_timeout=5, socket_timeout=30)


def broker_url(app: Any) -> str:
    """The broker URL, when it is Redis; else :class:`BrokerNotSupported`."""
    url = app.conf.broker_write_url or app.conf.broker_url
    if isinstance(url, (list, tuple)):
        url = url[0] if url else None
    url = client_url(url) if isinstance(url, str) else url
    if not (isinstance(url, str) and url.startswith(REDIS_SCHEMES)):
        shown = maybe_sanitize_url(url) if isinstance(url, str) else "amqp:// (Celery's default)"
        raise BrokerNotSupported(f"dead letters can only be managed on a Redis broker; the broker is {shown}")
    return url


@dataclass(frozen=True)
class QueueLists:
    """Where kombu's Redis transport keeps a queue: a LIST per priority step."""

    global_keyprefix: str = ""
    steps: tuple[int, ...] = PRIORITY_STEPS
    sep: str = SEP

    def keys(self, queue: str) -> list[str]:
        """Every list of ``queue``, priority 0 first; ``LLEN`` of the first alone undercounts."""
        return [self.key(queue, step) for step in self.steps]

    def key(self, queue: str, priority: Any = 0) -> str:
        """The list kombu pushes a message of ``priority`` onto (as ``Channel._q_for_pri``)."""
        try:
            priority = min(max(int(priority), 0), 9)
        except (TypeError, ValueError):
            priority = 0
        step = self.steps[max(bisect(self.steps, priority) - 1, 0)]
        return self.global_keyprefix + (f"{queue}{self.sep}{step}" if step else queue)

    def queue_of(self, key: str) -> str:
        key = key[len(self.global_keyprefix):] if key.startswith(self.global_keyprefix) else key
        return key.rsplit(self.sep, 1)[0]


def queue_lists(app: Any, global_keyprefix: str) -> QueueLists:
    """The lists of the app's broker, with its ``priority_steps``/``sep`` transport options."""
    options = app.conf.broker_transport_options or {}
    return QueueLists(global_keyprefix, tuple(options.get("priority_steps") or PRIORITY_STEPS),
                      options.get("sep") or SEP)


def broker_client(app: Any, client: Any, redis_url: str) -> Any:
    """A client on the broker's Redis: ``client`` itself when it is ``redis_url``'s and that is the broker."""
    url = broker_url(app)
    return client if url == redis_url else connect(url)
