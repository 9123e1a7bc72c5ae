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
from typing import Any, Mapping

from celery import states

from celery_dlq import headers as H
from celery_dlq.errors import ChordMemberDeadLettered
from celery_dlq.internals.celery_backend import keep_chord_keys
from celery_dlq.policy import RedeliveryPolicy
from celery_dlq.redis.chords import (CONTINUED, FAILED, RELEASED, WAITING, ChordLedger, part_return,
                                     request_fields, resume_unlock)
from celery_dlq.redis.keys import Keys
from celery_dlq.workflow import CHORD_CONTINUE, CHORD_FAIL, CHORD_WAIT, describe_failure, placeholder, rule_of

logger = logging.getLogger(__name__)

_STATE_OF = {CHORD_WAIT: WAITING, CHORD_FAIL: FAILED, CHORD_CONTINUE: CONTINUED}
#: Task request attribute: this replayed member's success is to settle its waiting ledger entry.
RELEASE = "celery_dlq_chord_release"


class ChordMembers:
    """Dead-lettered chord members of one app (one per runtime and process)."""

    def __init__(self, app: Any, client: Any, keys: Keys) -> None:
        self.app = app
        self.ledger = ChordLedger(client, keys)

    def withhold(self, request: Any) -> None:
        """In the child, on a chord member's last failure: Celery must not report it to the chord itself."""
        if not getattr(request, "chord", None):
            return
        request.chord = None
        if request.group and request.id:
            self.ledger.dying(request.id, request.group)

    def dead_lettered(self, request: Any, *, headers: Mapping[str, Any], dlq: str | None, delivery: int,
                      failure: Mapping[str, str], policy: RedeliveryPolicy) -> str | None:
        """Apply the member's rule now that its letter is stored (``dlq`` None: dropped, so ``fail``).

        Returns the rule applied, or None when ``request`` is no chord member.
        Runs again for a redelivered copy whose letter was stored already; the
        ledger makes that a no-op for a settled chord.
        """
        fields = request_fields(request)
        if not fields.get("chord") or not fields.get("group") or not fields.get("id"):
            return None
        rule = rule_of(headers, policy.chord_rule) if dlq else CHORD_FAIL
        before, unlock = self.ledger.hold(fields, state=_STATE_OF[rule], rule=rule, dlq=dlq)
        if rule == CHORD_WAIT:
            keep_chord_keys(self.app.backend, fields["group"])
            logger.warning("celery-dlq: chord %s waits for %s[%s] in %s (chord_rule wait): replay it to "
                           "complete the chord, purge it to fail it", fields["group"], fields.get("task"),
                           fields["id"], dlq)
        elif before in ("", WAITING):
            if rule == CHORD_FAIL:
                part_return(self.app, fields, states.FAILURE, ChordMemberDeadLettered(
                    describe_failure(fields["id"], fields.get("task"), dlq, delivery, failure)), unlock)
            else:
                part_return(self.app, fields, states.SUCCESS,
                            placeholder(fields["id"], fields.get("task"), dlq, failure), unlock)
        else:
            resume_unlock(self.app, unlock)
        return rule

    def before_success(self, request: Any) -> None:
        """In the child, before Celery records a replayed member's success: settled chords hear nothing more."""
        if not getattr(request, "chord", None) or not request.get(H.REPLAY_COUNT):
            return
        state = self.ledger.state(request.id)
        if state == WAITING:
            setattr(request, RELEASE, True)
        elif state is not None:
            logger.info("celery-dlq: %s[%s] succeeded after its chord %s was settled (%s): the chord is "
                        "not told again", request.task, request.id, request.group, state)
            request.chord = None

    def after_success(self, request: Any) -> None:
        """In the child, after a chord member's success was recorded (and with it Celery's part return)."""
        if getattr(request, RELEASE, False):
            settled = self.ledger.settle(request.id, RELEASED)
            if settled is not None:
                resume_unlock(self.app, settled[1])   # a polling backend joins the chord now
        group = getattr(request, "group", None)
        if group and self.ledger.waiting(group):
            keep_chord_keys(self.app.backend, group)

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


def wrap_chord_unlock(app: Any, members: Any) -> None:
    """Make the app's ``celery.chord_unlock`` park while a member of its chord waits (``members``: a runtime).

    The task's ``run`` is wrapped in place (Celery's own body runs when no
    member waits); done when the app is finalized, before a worker builds
    its tracers.
    """
    task = app.tasks.get("celery.chord_unlock")
    if task is None or getattr(task.run, "_celery_dlq_parks", False):
        return
    original = task.run

    def run(*args: Any, **kwargs: Any) -> Any:
        if members.chords.park_unlock(task.request, args, kwargs):
            return None
        return original(*args, **kwargs)

    run._celery_dlq_parks = True  # type: ignore[attr-defined]
    task.run = run
