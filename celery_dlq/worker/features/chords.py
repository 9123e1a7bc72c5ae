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

:class:`ChordRules` is the feature of the hook chain (``worker/middleware.py``)
that calls them at a delivery's events, and makes ``celery.chord_unlock``
park while a member of its chord waits (:func:`wrap_chord_unlock`, on the
internal :data:`~celery_dlq.internals.celery_canvas.CHORD_UNLOCK`).
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from celery import states
from redis.exceptions import RedisError

from celery_dlq import headers as H
from celery_dlq.errors import ChordMemberDeadLettered
from celery_dlq.fingerprint import failure_group
from celery_dlq.internals.base import usable
from celery_dlq.internals.celery_backend import chord_keys
from celery_dlq.internals.celery_canvas import CHORD_UNLOCK, chord_unlock_of, group_of_unlock, header_ready, poll_again
from celery_dlq.policy import RedeliveryPolicy
from celery_dlq.storage.chords import (
    CONTINUED,
    FAILED,
    WAITING,
    ChordLedger,
    chord_fields,
    part_return,
    resume_unlock,
    slot,
    store_slots,
    take_chord,
)
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.result_backend import keep_chord_keys
from celery_dlq.worker.middleware import Letter, Middleware
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
        letter, task = str(request.get("id")), request.get("task")
        rule = rule_of(headers, policy.chord_rule) if dlq else CHORD_FAIL
        value: Any
        if rule == CHORD_FAIL:
            state, value = states.FAILURE, ChordMemberDeadLettered(describe_failure(letter, task, dlq, delivery,
                                                                                    failure))
        else:
            state, value = states.SUCCESS, placeholder(letter, task, dlq, failure)
        before, unlock = self.ledger.hold(letter, fields, state=_STATE_OF[rule], rule=rule, dlq=dlq,
                                          failure_group=failure_group(headers.get("task"), failure),
                                          outcome="" if rule == CHORD_WAIT else slot(state, value))
        if rule == CHORD_WAIT:
            keep_chord_keys(self.app.backend, chord_keys(self.app.backend, fields["group"]))
            logger.warning("celery-dlq: chord %s waits for %s[%s] in %s (chord_rule wait): replay it to "
                           "complete the chord, purge it to fail it", fields["group"], task, letter, dlq)
        elif before in ("", WAITING):
            part_return(self.app, fields, state, value, unlock)
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
                keep_chord_keys(self.app.backend, chord_keys(self.app.backend, group))
        except RedisError:  # the success is stored; the letter stays waiting, settled by a later copy or a purge
            logger.warning("celery-dlq: could not settle the chord ledger after %s[%s] succeeded", request.get("task"),
                           request.id, exc_info=True)

    def park_unlock(self, request: Any, args: tuple, kwargs: dict, *, joining: bool = True) -> bool:
        """In ``celery.chord_unlock``: park the call while a member of its chord waits in a DLQ.

        Celery's ``chord_unlock`` polls every ``result_chord_retry_interval``
        (1 s) until every member is ready; a member waiting for its replay
        could keep it polling for days. Parked, the call costs nothing until
        the member's replay succeeds or its letter is purged; then it is sent
        again and joins the chord as Celery does. Not parked and ``joining``
        (the header was read ready), the slots the ledger settled are written
        to the backend first, so the join finds them even when it runs between
        a settle and its part return; a poll that will only poll again writes
        nothing.
        """
        group = group_of_unlock(args, kwargs)
        if not group:
            return False
        queue = (getattr(request, "delivery_info", None) or {}).get("routing_key")
        settled = self.ledger.park_or_settled(group, {"args": list(args), "kwargs": kwargs, "queue": queue})
        if settled is None:
            logger.info("celery-dlq: chord %s waits for a dead-lettered member: its chord_unlock is parked until "
                        "the member's replay succeeds or its letter is purged", group)
            return True
        if joining and settled:
            logger.info("celery-dlq: chord %s joins with %d member(s) its ledger settled", group, len(settled))
            store_slots(self.app, settled)
        return False


class ChordRules(Middleware):
    """Chord rules as a feature of the hook chain (``members``: this process's :class:`ChordMembers`)."""

    name = "chord rules"

    def __init__(self, members: Callable[[], ChordMembers]) -> None:
        self.members = members

    def finalized(self, app: Any) -> None:
        wrap_chord_unlock(app, self.members)

    def last_failure(self, task: Any, request: Any) -> None:
        self.members().withhold(request)

    def before_success(self, task: Any, request: Any) -> None:
        if request.chord:
            self.members().before_success(request)

    def after_success(self, task: Any, request: Any) -> None:
        if request.chord:
            self.members().after_success(request)

    def recording_failure(self, letter: Letter, context: Any) -> None:
        """Celery's FAILURE must not tell the chord: its chord is taken off the context, kept for the rule."""
        letter.notes["chord"] = take_chord(context)

    def dead_lettered(self, letter: Letter, context: Any) -> None:
        """The letter is stored: apply its chord rule (Celery's part return was withheld)."""
        request = letter.notes.pop("chord") if "chord" in letter.notes else context
        if request is None:
            return
        try:
            self.members().dead_lettered(request, headers=letter.headers, dlq=letter.dlq, delivery=letter.delivery,
                                         failure=letter.failure, policy=letter.policy)
        except Exception:
            logger.exception("celery-dlq: %s[%s] is dead-lettered, but its chord %s could not be told; "
                             "replaying the letter completes it", letter.task_name, letter.task_id,
                             request.get("group"))


def wrap_chord_unlock(app: Any, members: Callable[[], ChordMembers]) -> None:
    """Make the app's ``celery.chord_unlock`` park while a member of its chord waits (``members``: this process's).

    The task's ``run`` is wrapped in place (Celery's own body runs when no
    member waits, and wherever the internal's assumption fails); done when
    the app is finalized, before a worker builds its tracers. Whether the
    assumption holds is asked at the first call (a worker has checked every
    feature by then, and warned once where one moved).
    """
    task = chord_unlock_of(app)
    if task is None or getattr(task.run, "_celery_dlq_parks", False):
        return
    original = task.run

    @functools.wraps(original)   # the check of CHORD_UNLOCK reads Celery's parameters through this wrapper
    def run(*args: Any, **kwargs: Any) -> Any:
        if not usable(CHORD_UNLOCK):
            return original(*args, **kwargs)
        # The header is read before the ledger: a member failing in between is
        # marked dying before its FAILURE is stored, so it parks the call.
        try:
            ready = header_ready(app, args, kwargs)
            if members().park_unlock(task.request, args, kwargs, joining=ready is not False):
                return None
        except Exception as exc:   # backend or ledger unreachable: never join unchecked; poll again, as Celery does
            logger.warning("celery-dlq: chord %s: could not check its members (%r); its chord_unlock polls again",
                           group_of_unlock(args, kwargs), exc)
            poll_again(task, kwargs, exc)
        if ready is False:
            poll_again(task, kwargs)
        return original(*args, **kwargs)

    run._celery_dlq_parks = True  # type: ignore[attr-defined]
    task.run = run
