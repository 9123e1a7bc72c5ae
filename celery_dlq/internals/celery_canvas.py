"""Celery's ``celery.chord_unlock``: the builtin task that joins a chord by polling, wrapped to park.

A backend without native chords (the database backend, ...) joins a chord
by sending ``celery.chord_unlock``, which polls every
``result_chord_retry_interval`` until every member is ready. celery-dlq
replaces the ``run`` of that task on the app, in place, when the app is
finalized (``worker/features/chords.py``): a worker's tracer calls the task's
``run`` as it finds it when it builds (no custom ``__call__``), and the
builtin's parameters start with the chord's group id, its body, the poll's
interval and retry limit and the header's result tuples. Both are Celery's
own business, so they are stated here and checked. The wrapper reads the
header before the chord ledger and, when the header is not ready, raises
the retry Celery's own body would (:func:`poll_again`): Celery's body then
runs only on a header read before the ledger was.
"""
from __future__ import annotations

import inspect
from typing import Any

from celery import Celery
from celery.app.task import Task
from celery.result import result_from_tuple

from celery_dlq.internals.base import METHOD, Feature, Internal

#: The builtin task's name.
CHORD_UNLOCK_TASK = "celery.chord_unlock"
#: The leading parameters of its ``run`` that celery-dlq reads.
UNLOCK_PARAMS = ("group_id", "callback", "interval", "max_retries", "result")
#: The keyword Celery >= 5.7 keeps a retry's exchange type in (absent before: nothing to keep).
_EXCHANGE_TYPE = "_chord_unlock_exchange_type"


def chord_unlock_of(app: Any) -> Any:
    """The app's ``celery.chord_unlock`` task, or None."""
    return app.tasks.get(CHORD_UNLOCK_TASK)


def group_of_unlock(args: tuple, kwargs: dict) -> Any:
    """The group id of a ``celery.chord_unlock`` call (its first parameter)."""
    return args[0] if args else kwargs.get(UNLOCK_PARAMS[0])


def header_ready(app: Any, args: tuple, kwargs: dict) -> bool | None:
    """Whether every header result of a ``chord_unlock`` call is ready, read as Celery's own poll reads it
    (``result``: the header's result tuples); None when the call carries none."""
    results = kwargs.get("result")
    if results is None:
        return None
    return app.GroupResult(group_of_unlock(args, kwargs), [result_from_tuple(r, app=app) for r in results],
                           app=app).ready()


def poll_again(task: Any, kwargs: dict, exc: BaseException | None = None) -> None:
    """Raise the retry Celery's ``chord_unlock`` raises while its header is not ready, or its read failed with
    ``exc`` (same interval and limit)."""
    interval = kwargs.get("interval")
    options = {"exchange_type": kwargs[_EXCHANGE_TYPE]} if kwargs.get(_EXCHANGE_TYPE) is not None else {}
    raise task.retry(exc=exc, countdown=task.default_retry_delay if interval is None else interval,
                     max_retries=kwargs.get("max_retries"), **options)


def _unlock_takes_the_group_first() -> str | None:
    app = Celery("celery-dlq-check", set_as_current=False)
    app.finalize()
    task = chord_unlock_of(app)
    if task is None:
        return f"a finalized app has no {CHORD_UNLOCK_TASK} task"
    if type(task).__call__ is not Task.__call__:
        return f"{CHORD_UNLOCK_TASK} has its own __call__: a wrapped run would not be called"
    names = list(inspect.signature(task.run).parameters)
    if names[:len(UNLOCK_PARAMS)] != list(UNLOCK_PARAMS):
        return f"{CHORD_UNLOCK_TASK} takes ({', '.join(names)}), expected ({', '.join(UNLOCK_PARAMS)}, ...)"
    return None


CHORD_UNLOCK = Feature(
    name="chord unlock",
    does="parking celery.chord_unlock while a member of its chord waits in a DLQ",
    fallback="celery.chord_unlock polls as Celery's own until the member's replay or purge",
    internals=(
        Internal("celery.app.task:Task", "run", METHOD,
                 "the body a worker's tracer calls: celery.chord_unlock's is wrapped in place", ("self",)),
    ),
    behaves=_unlock_takes_the_group_first,
)
