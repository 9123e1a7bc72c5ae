"""A chord member's dead letter and replay inside the worker: the rule applied once the letter is stored.

The child withholds Celery's part return of a chord member's last failure
(:meth:`ChordMembers.withhold`): nothing may tell the chord before the dead letter is
safely stored. The main process, having stored it, applies the member's rule
(:meth:`ChordMembers.dead_lettered`, docs/workflows.md). A replayed member's
success goes through Celery's own part return, unless its chord was settled
already (:meth:`ChordMembers.before_success`); afterwards its ledger entry is
settled ``released`` (:meth:`ChordMembers.after_success`). While any member
of a chord waits, each success of another member keeps the chord's result
keys from expiring.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from celery import states
from redis.exceptions import RedisError

from celery_dlq import headers as H
from celery_dlq.errors import ChordMemberDeadLettered
from celery_dlq.fingerprint import failure_group
from celery_dlq.internals.celery_backend import keep_chord_keys
from celery_dlq.policy import RedeliveryPolicy
from celery_dlq.storage.chords import (
    CONTINUED,
    FAILED,
    WAITING,
    ChordLedger,
    chord_fields,
    part_return,
    resume_unlock,
    take_chord,
)
from celery_dlq.storage.keys import Keys
from celery_dlq.workflow import CHORD_CONTINUE, CHORD_FAIL, CHORD_WAIT, describe_failure, placeholder, rule_of

logger = logging.getLogger(__name__)

_STATE_OF = {CHORD_WAIT: WAITING, CHORD_FAIL: FAILED, CHORD_CONTINUE: CONTINUED}


class ChordMembers:
    """Dead-lettered chord members of one app (one per runtime and process)."""

    def __init__(self, app: Any, client: Any, keys: Keys) -> None:
        self.app = app
        self.ledger = ChordLedger(client, keys)

    def withhold(self, request: Any) -> None:
        """In the child, on a task's last failure: Celery must not tell a chord of it itself.

        A chord member's ``chord`` is taken off its request; for the first
        steps of a chain in a chord's header, off the options of the chain's
        chord member (Celery walks the chain to report it).
        """
        before = take_chord(request)
        fields = chord_fields(before) if before is not None else None
        if fields is None:
            return
        try:
            self.ledger.dying(request.id, fields["group"])
        except RedisError:  # the task's own failure must stay what is raised; the dead letter's hold marks it
            logger.warning("celery-dlq: could not mark %s[%s] dying in its chord's waiting set", request.get("task"),
                           request.id, exc_info=True)

    def dead_lettered(self, request: Any, *, headers: Mapping[str, Any], dlq: str | None, delivery: int,
                      failure: Mapping[str, str], policy: RedeliveryPolicy) -> str | None:
        """Apply the rule now that the letter of ``request`` is stored (``dlq`` None: dropped, so ``fail``).

        Returns the rule applied, or None when the task stands for no chord
        part (:func:`~celery_dlq.storage.chords.chord_fields`). Runs again for a
        redelivered copy whose letter was stored already; the ledger makes
        that a no-op for a settled chord.
        """
        fields = chord_fields(request)
        if fields is None:
            return None
        letter = str(request.get("id"))
        rule = rule_of(headers, policy.chord_rule) if dlq else CHORD_FAIL
        before, unlock = self.ledger.hold(letter, fields, state=_STATE_OF[rule], rule=rule, dlq=dlq,
                                          failure_group=failure_group(headers.get("task"), failure))
        if rule == CHORD_WAIT:
            keep_chord_keys(self.app.backend, fields["group"])
            logger.warning("celery-dlq: chord %s waits for %s[%s] in %s (chord_rule wait): replay it to "
                           "complete the chord, purge it to fail it", fields["group"], request.get("task"),
                           letter, dlq)
        elif before in ("", WAITING):
            task = request.get("task")
            if rule == CHORD_FAIL:
                part_return(self.app, fields, states.FAILURE, ChordMemberDeadLettered(
                    describe_failure(letter, task, dlq, delivery, failure)), unlock)
            else:
                part_return(self.app, fields, states.SUCCESS, placeholder(letter, task, dlq, failure), unlock)
        else:
            resume_unlock(self.app, unlock)
        return rule

    def before_success(self, request: Any) -> None:
        """In the child, before Celery records a replayed member's success: settled chords hear nothing more."""
        if not getattr(request, "chord", None) or not request.get(H.REPLAY_COUNT):
            return
        try:
            state = self.ledger.state(request.id)
        except RedisError:  # a success stays a success: the chord is told, and Celery >= 5.7 drops a duplicate
            logger.warning("celery-dlq: could not read the chord ledger for %s[%s]; telling its chord",
                           request.get("task"), request.id, exc_info=True)
            return
        if state not in (None, WAITING):
            logger.info("celery-dlq: %s[%s] succeeded after its chord %s was settled (%s): the chord is "
                        "not told again", request.get("task"), request.id, request.group, state)
            request.chord = None

    def after_success(self, request: Any) -> None:
        """In the child, after a chord member's success was recorded (and with it Celery's part return).

        Settles the waiting letters that stood for it (its own, or a chain
        step's before it), sending a parked ``chord_unlock`` again; while
        others still wait, keeps the chord's result keys from expiring.
        """
        group = getattr(request, "group", None)
        if not group:
            return
        try:
            if not self.ledger.waiting(group):
                return
            for unlock in self.ledger.release(group, request.id):
                resume_unlock(self.app, unlock)   # a polling backend joins the chord now
            if self.ledger.waiting(group):
                keep_chord_keys(self.app.backend, group)
        except RedisError:  # the success is stored; the letter stays waiting, settled by a later copy or a purge
            logger.warning("celery-dlq: could not settle the chord ledger after %s[%s] succeeded", request.get("task"),
                           request.id, exc_info=True)

    def park_unlock(self, request: Any, args: tuple, kwargs: dict) -> bool:
        """In ``celery.chord_unlock``: park the call while a member of its chord waits in a DLQ.

        Celery's ``chord_unlock`` polls every ``result_chord_retry_interval``
        (1 s) until every member is ready; a member waiting for its replay
        could keep it polling for days. Parked, the call costs nothing until
        the member's replay succeeds or its letter is purged; then it is sent
        again and joins the chord as Celery does.
        """
        group = args[0] if args else kwargs.get("group_id")
        if not group:
            return False
        queue = (getattr(request, "delivery_info", None) or {}).get("routing_key")
        parked = self.ledger.park_unlock(group, {"args": list(args), "kwargs": kwargs, "queue": queue})
        if parked:
            logger.info("celery-dlq: chord %s waits for a dead-lettered member: its chord_unlock is parked until "
                        "the member's replay succeeds or its letter is purged", group)
        return parked


def wrap_chord_unlock(app: Any, members: Callable[[], ChordMembers]) -> None:
    """Make the app's ``celery.chord_unlock`` park while a member of its chord waits (``members``: this process's).

    The task's ``run`` is wrapped in place (Celery's own body runs when no
    member waits); done when the app is finalized, before a worker builds
    its tracers.
    """
    task = app.tasks.get("celery.chord_unlock")
    if task is None or getattr(task.run, "_celery_dlq_parks", False):
        return
    original = task.run

    def run(*args: Any, **kwargs: Any) -> Any:
        if members().park_unlock(task.request, args, kwargs):
            return None
        return original(*args, **kwargs)

    run._celery_dlq_parks = True  # type: ignore[attr-defined]
    task.run = run
