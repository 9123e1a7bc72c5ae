"""A message dead-lettered before it ran: its FAILURE recorded as Celery records a lost worker's.

Without it a message dead-lettered by the strategy (an invalid message, a
delivery counted past its limit) stays PENDING in the result backend:
``result.get()`` and chords would wait forever.
"""
from __future__ import annotations

import logging
from typing import Any

from celery import signals
from kombu.utils.imports import symbol_by_name

from celery_dlq.internals.celery_worker import request_context
from celery_dlq.worker.middleware import Chain, Letter

logger = logging.getLogger(__name__)


def mark_failed(task: Any, message: Any, hostname: str, exc: BaseException, chain: Chain | None = None,
                stored: Letter | None = None) -> None:
    """Record FAILURE, with error callbacks, as Celery does for a lost worker.

    The dead letter is stored already, so a backend error is logged, not
    raised. With the ``stored`` letter, the chain hears of it around Celery's record
    (:meth:`~celery_dlq.worker.middleware.Middleware.recording_failure`, then
    :meth:`~celery_dlq.worker.middleware.Middleware.dead_lettered`): a chord
    member's chord by its rule (worker/features/chords.py), not from Celery's FAILURE.
    """
    try:
        request_cls = symbol_by_name(task.Request)  # Celery allows a class or its dotted name
        request = request_cls(message, app=task.app, hostname=hostname, task=task)
        context = request_context(request)
        if chain is not None and stored is not None:
            chain.recording_failure(stored, context)
        task.backend.mark_as_failure(request.id, exc, request=context, store_result=request.store_errors)
        if chain is not None and stored is not None:
            chain.dead_lettered(stored, context)
        signals.task_failure.send(sender=task, task_id=request.id, exception=exc, args=request.args,
                                  kwargs=request.kwargs, traceback=None, einfo=None)
    except Exception:
        logger.exception("celery-dlq: dead-lettered %s[%s] but could not record its FAILURE",
                         task.name, (message.headers or {}).get("id"))
