"""A letter's place in its workflow, with what the chord ledger and the result backend know (docs/workflows.md).

The letter's own message says which chord it is a member of and what is left
of its chain (:func:`celery_dlq.workflow.membership`). This adds, cheaply:

- of a chord: the ledger's ``state`` and ``waiting`` (two reads); the
  chord's ``size`` and how many members are ``done``: on the Redis result
  backend three reads of its chord keys; on a ``chord_unlock`` backend the
  header's results of its parked ``chord_unlock``, done being those that
  succeeded (read only for a header of at most :data:`COUNT_AT_MOST`);
- of a chain step: its ``step`` number, counted back through each parent's
  ``parent_id`` in the result backend (one read per step before it, at most
  :data:`HOPS_AT_MOST`); ``exact`` False when a parent's result was gone.

Nothing is added without a result backend, or when it cannot be read (a
warning says why: ``show`` must work while the result backend is down);
nothing here writes.
"""
from __future__ import annotations

import logging
from typing import Any

from celery import states
from celery.backends.base import DisabledBackend

from celery_dlq.internals.celery_backend import chord_keys
from celery_dlq.storage.chords import ChordLedger, uses_chord_unlock
from celery_dlq.storage.result_backend import chord_progress

logger = logging.getLogger(__name__)

#: The most header results whose states are read to count a polled chord's done members.
COUNT_AT_MOST = 200
#: The most parents a chain step's number is counted through.
HOPS_AT_MOST = 100


def describe(workflow: dict | None, headers: dict, ledger: ChordLedger, backend: Any, task_id: str | None) -> None:
    """Add to ``workflow`` (a letter's ``as_dict()["workflow"]``) what the ledger and ``backend`` know, in place."""
    if not workflow:
        return
    chord = workflow.get("chord")
    if chord is not None and task_id:
        chord["state"] = ledger.state(task_id)
        chord["waiting"] = ledger.waiting(chord["group"]) if chord.get("group") else 0
    if backend is None or isinstance(backend, DisabledBackend):
        return
    chain = workflow.get("chain")
    try:
        progress = _progress(ledger, backend, chord["group"]) if chord and chord.get("group") else None
        before, exact = steps_before(backend, headers.get("parent_id")) if chain is not None else (0, True)
    except Exception as exc:  # any backend's connection errors (redis, SQLAlchemy, ...): say less, not nothing
        logger.warning("celery-dlq: the result backend could not be read for %s's workflow: %r", task_id, exc)
        return
    if chord is not None and progress is not None:
        chord["size"], chord["done"] = progress
    if chain is not None:
        chain.update(step=before + 1, steps=before + 1 + chain["remaining"], exact=exact)


def _progress(ledger: ChordLedger, backend: Any, group: str) -> tuple[int | None, int | None]:
    if not uses_chord_unlock(backend):
        return chord_progress(backend, chord_keys(backend, group))
    call = ledger.parked_unlock(group)
    results = (call or {}).get("kwargs", {}).get("result")
    if not isinstance(results, list):
        return None, None
    if len(results) > COUNT_AT_MOST:
        return len(results), None
    ids = [_result_id(item) for item in results]
    done = sum(1 for i in ids if i and backend.get_task_meta(i).get("status") == states.SUCCESS)
    return len(results), done


def _result_id(item: Any) -> str | None:
    """A result's id from its ``as_tuple()`` form, ``[[id, parent], None]``."""
    while isinstance(item, (list, tuple)) and item:
        item = item[0]
    return item if isinstance(item, str) else None


def steps_before(backend: Any, parent_id: str | None) -> tuple[int, bool]:
    """How many steps ran before a chain step whose parent is ``parent_id``, and whether that count is exact."""
    steps, parent = 0, parent_id
    while parent and steps < HOPS_AT_MOST:
        steps += 1
        meta = backend.get_task_meta(parent)
        if meta.get("status") == states.PENDING:    # gone (result_expires) or never stored: the rest is unknown
            return steps, False
        parent = meta.get("parent_id")
    return steps, not parent
