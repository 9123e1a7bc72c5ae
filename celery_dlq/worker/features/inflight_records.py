"""In-flight records as a feature of the hook chain: a consumed message the park script settles itself.

Every message celery-dlq's fetch pops is recorded in its process's
in-flight hash (``worker/fetch/transport.py``, ``worker/leader/inflight.py``). Where the
park is direct (kombu's own element moved back inside Redis), the park
script also removes the message's record, in the same round trip
(``park_settles``); the channel is then told (``park_settled``), so its ack only
forgets the message and costs no round trip. A message fetched by kombu's
own BRPOP has no such record: nothing is answered, and kombu's ack settles it.
"""
from __future__ import annotations

from typing import Any

from celery_dlq.worker.fetch.transport import Channel
from celery_dlq.worker.middleware import Middleware


class InFlightRecords(Middleware):
    """Settles a parked message's in-flight record in the park script (no state: the channel holds it)."""

    name = "in-flight records"

    def park_settles(self, message: Any, delivery_tag: str) -> Any:
        channel = getattr(message, "channel", None)
        return (channel.ack_keys(), delivery_tag) if isinstance(channel, Channel) else None

    def park_settled(self, message: Any, delivery_tag: str) -> None:
        channel = getattr(message, "channel", None)
        if isinstance(channel, Channel):
            channel.settled(delivery_tag)
