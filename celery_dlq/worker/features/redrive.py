"""Automatic redrive: when a breaker this worker closed belongs to a policy with ``auto_redrive``, its failure
group's dead letters are replayed by a redrive job (``ops/jobs.py``).

The job starts at the policy's ``breaker_release_rate`` messages/s and doubles every :data:`INTERVAL` seconds
while none of the group's letters comes back, up to ``breaker_max_release_rate``; it stops when the group's
breaker opens again. It is kept in Redis, so the worker holding the mover lease runs it (``worker/leader/jobs.py``)
and another takes it over if that one dies. One job per DLQ: a redrive already running there is left to run.
"""
from __future__ import annotations

import logging
from typing import Any

from celery_dlq.ops.audit import Actor
from celery_dlq.ops.jobs import Jobs
from celery_dlq.ops.operator import Operator
from celery_dlq.storage.jobs import DLQBusy
from celery_dlq.worker.config import Config

logger = logging.getLogger(__name__)

#: Seconds between two doublings of an automatic redrive's velocity.
INTERVAL = 5.0


class AutoRedrive:
    """A breaker's ``on_close`` hook: starts the redrive job of ``(queue, group)`` where ``task``'s policy asks."""

    def __init__(self, app: Any, config: Config) -> None:
        self.app, self.config = app, config

    def __call__(self, queue: str, group: str, task: str) -> None:
        policy = self.config.policy(task, queue)
        dlq = policy.dead_letter_queue(queue)
        if not policy.breaker.auto_redrive or not dlq:
            return
        actor = Actor.of(who=f"breaker {queue}/{group}", why="automatic redrive: the breaker closed")
        try:
            job = Jobs(Operator(self.app)).start_redrive(
                dlq, group, start=policy.breaker.release_rate,
                cap=policy.breaker.max_release_rate, interval=INTERVAL, actor=actor)
        except DLQBusy as exc:
            logger.warning("celery-dlq: no automatic redrive of %s/%s: %s", queue, group, exc)
            return
        logger.warning("celery-dlq: breaker %s/%s closed: redrive job %s replays its dead letters", queue, group,
                       job.id)
