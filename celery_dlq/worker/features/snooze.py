"""Waits that are not failures: a task says "deliver me again in N seconds", and uses no attempt.

A rate limit or a ``Retry-After`` is not a failure of the task (Oban's
``{:snooze, n}``, River's ``JobSnooze``, BullMQ's ``RateLimitError``). In a
:class:`~celery_dlq.RedeliveryTask`, ``raise Snooze(30)`` or
``self.snooze(30)`` parks the message like a retry, but the next delivery
keeps this delivery's number, and the parked copy carries how often and how
long it snoozed (``x-dlq-snoozes``, ``x-dlq-snoozed-seconds``); it is counted
as ``snoozed_total``, not ``parked_total``. The policy bounds it
(``max_snoozes``, ``max_snooze_time``): a snooze past either is raised as
:class:`~celery_dlq.errors.SnoozeLimitExceeded` instead, a failure the
worker dead-letters (``non_retryable``), so nothing waits forever.

:class:`Snoozing` is the feature of the hook chain (``worker/middleware.py``):
in the child it bounds a snooze (``raised``), in the main process it parks
the message (``taking_over``).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

from celery.exceptions import Retry

from celery_dlq import headers as H
from celery_dlq.errors import SnoozeLimitExceeded
from celery_dlq.message import queue_of
from celery_dlq.policy import UNLIMITED, RedeliveryPolicy
from celery_dlq.worker.config import Config, MessageContext
from celery_dlq.worker.middleware import Middleware


class Snooze(Retry):
    """Raised in a task: deliver this message again in ``seconds``; this delivery is not an attempt."""

    def __init__(self, seconds: float = 0.0, message: str | None = None, **kwargs: Any) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
                or seconds < 0:
            raise ValueError(f"Snooze takes a finite number of seconds >= 0, got {seconds!r}")
        self.seconds = float(seconds)
        super().__init__(message or f"snoozed for {self.seconds:g}s", None, self.seconds, **kwargs)

    def __reduce__(self):
        return self.__class__, (self.seconds, self.message)


def snoozed_so_far(get: Any) -> tuple[int, float]:
    """How often and how many seconds in all a message snoozed, read with ``get(header, default)``."""
    try:
        return int(get(H.SNOOZES, 0) or 0), float(get(H.SNOOZED_SECONDS, 0.0) or 0.0)
    except (TypeError, ValueError):
        return 0, 0.0


def check_snooze(policy: RedeliveryPolicy, get: Any, snooze: Snooze, task_name: str) -> BaseException:
    """What the task raises for ``snooze``: itself, or :class:`SnoozeLimitExceeded` past the policy's bound."""
    snoozes, snoozed = snoozed_so_far(get)
    if policy.snooze_left(snoozes, snoozed, snooze.seconds):
        return snooze
    bound = f"max_snoozes={policy.max_snoozes}" if policy.max_snoozes != UNLIMITED and \
        snoozes >= policy.max_snoozes else f"max_snooze_time={policy.max_snooze_time:g}s"
    return SnoozeLimitExceeded(f"{task_name} snoozed {snoozes} time(s), {snoozed:g}s in all; another "
                               f"{snooze.seconds:g}s would pass {bound}")


def snooze_headers(headers: Mapping[str, Any], seconds: float) -> dict[str, Any]:
    """The headers of the snoozed copy: one more snooze, ``seconds`` more in all."""
    snoozes, snoozed = snoozed_so_far(headers.get)
    return {**headers, H.SNOOZES: snoozes + 1, H.SNOOZED_SECONDS: snoozed + seconds}


def snooze_failure(seconds: float) -> dict[str, str]:
    """The ``failure`` a snoozed copy records (its ``x-dlq-last-exception`` and parked event)."""
    return {"type": "celery_dlq.Snooze", "message": f"snoozed for {seconds:g}s (no attempt used)", "traceback": ""}


class _Parks(Protocol):
    def park_again(self, ctx: MessageContext, *, delay: float, snooze: bool = False) -> float: ...


class Snoozing(Middleware):
    """Snoozes as a feature of the hook chain (``parking``: :class:`~celery_dlq.worker.park.parking.Parking`)."""

    name = "snooze"

    def __init__(self, config: Config, parking: _Parks) -> None:
        self.config, self.parking = config, parking

    def raised(self, task: Any, request: Any, exc: Exception) -> BaseException | None:
        """In the child: a snooze within the policy's bound is raised as it is, past it as a failure."""
        if not isinstance(exc, Snooze):
            return None
        policy = self.config.policy(task, queue_of(task.app, request.delivery_info))
        return check_snooze(policy, request.get, exc, task.name)

    def taking_over(self, request: Any, exc: BaseException) -> bool:
        """In the main process: park the snoozed message without using an attempt (raises if that fails)."""
        if not isinstance(exc, Snooze):
            return False
        self.parking.park_again(request.dlq_context(), delay=exc.seconds, snooze=True)
        return True
