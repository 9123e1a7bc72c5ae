"""The shop app with a flight recorder: every delivery and outcome goes to a Redis list.

    celery -A examples.timeline worker -Q orders,payments

is the shop worker plus signal receivers that RPUSH one JSON event per
delivery, success, scheduled redelivery and dead letter to the list named by
``SHOP_TIMELINE_KEY`` (default ``shop:timeline``). The demo reads it back and
prints the timeline. Deliveries and successes are recorded in the pool
process that runs the task (``task_prerun``/``task_success``); redeliveries
and dead letters in the worker's main process, where celery-dlq sends its
signals after the parked copy or the dead letter is stored.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery.signals import task_prerun, task_success

from celery_dlq import delivery_count, task_dead_lettered, task_redelivery_scheduled
from examples.shop import app

__all__ = ["app", "read_events"]

KEY = os.environ.get("SHOP_TIMELINE_KEY", "shop:timeline")
_client: tuple[int, redis.Redis] | None = None


def _redis() -> redis.Redis:
    """One client per process: a prefork child must not share its parent's socket."""
    global _client
    if _client is None or _client[0] != os.getpid():
        _client = (os.getpid(), redis.Redis.from_url(app.conf.broker_url))
    return _client[1]


def _record(event: str, **fields: Any) -> None:
    try:
        _redis().rpush(KEY, json.dumps({"event": event, "at": time.time(), **fields}))
    except Exception:  # the recorder must never break the shop
        pass


@task_prerun.connect
def _delivered(sender=None, task_id=None, task=None, **_: Any) -> None:
    info = task.request.delivery_info or {}
    _record("delivery", id=task_id, task=task.name, queue=info.get("routing_key"),
            delivery=delivery_count(task.request))


@task_success.connect
def _succeeded(sender=None, result=None, **_: Any) -> None:
    _record("success", id=sender.request.id, task=sender.name, result=repr(result)[:60])


@task_redelivery_scheduled.connect
def _scheduled(sender=None, task_id=None, delivery_count=None, due=None, exception=None, **_: Any) -> None:
    _record("redelivery", id=task_id, task=sender, next_delivery=delivery_count, due=due,
            exception=f"{exception['type']}: {exception['message']}")


@task_dead_lettered.connect
def _dead_lettered(sender=None, task_id=None, dead_letter_queue=None, reason=None, exception=None,
                   delivery_count=None, **_: Any) -> None:
    _record("dead_letter", id=task_id, task=sender, dlq=dead_letter_queue, reason=reason,
            delivery=delivery_count, exception=f"{exception['type']}: {exception['message']}")


def read_events(client: redis.Redis, key: str = KEY) -> list[dict[str, Any]]:
    return sorted((json.loads(raw) for raw in client.lrange(key, 0, -1)), key=lambda e: e["at"])
