"""The contract suite's worker app: every task of tests/integration/proj.py, and one whose live traceback is kept.

``contract.traced`` fails once, for good (``dead_letter_on``). The pool child
records the text of its traceback while the exception is live (Celery's
``task_failure`` signal, sent in the child), so the test can compare it with
the traceback the dead letter stores, which crossed the pool's result pipe in
billiard's pickled ``ExceptionInfo``.
"""
from __future__ import annotations

import json
import traceback

from celery import signals

from celery_dlq import RedeliveryTask
from tests.integration.proj import PREFIX, app, client, record

__all__ = ["app"]

TRACED = "contract.traced"


def lookup(table: dict, key: str) -> int:
    """A frame below the task's, with an expression whose carets Python 3.11+ prints."""
    return table["prices"][key] * 2


@app.task(bind=True, base=RedeliveryTask, name=TRACED,
          redelivery_policy={"redelivery_delay": 0.1, "dead_letter_on": (KeyError,)})
def traced(self, key="missing"):
    record(self)
    return lookup({"prices": {"known": 1}}, key) + 1


@signals.task_failure.connect
def _live_traceback(sender=None, task_id=None, exception=None, **kwargs):
    if getattr(sender, "name", None) == TRACED and exception is not None:
        text = "".join(traceback.format_exception(type(exception), exception, exception.__traceback__))
        client().rpush(f"{PREFIX}:live-tracebacks", json.dumps({"id": task_id, "text": text}))
