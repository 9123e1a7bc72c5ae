"""The chord ledger: dead-lettered chord members held open or settled, and settling one through the result backend.

Celery records a chord's progress in its result backend (on Redis: the
``<group>.j``/``.t``/``.s``/``.d``/``.c`` keys of ``on_chord_part_return``);
celery-dlq writes it only through the backend's own API
(``on_chord_part_return``, ``store_result``), and keeps a waiting chord's
Redis keys from expiring (``internals/celery_backend.py``). When a chord
member is dead-lettered its worker withholds Celery's part return and the
member is recorded here
(:meth:`ChordLedger.hold`), in the state its rule gives it
(:mod:`celery_dlq.workflow`):

``waiting``
    rule ``wait``: no part return yet, the chord stays open (a
    ``chord_unlock`` polling for it is parked, :meth:`ChordLedger.park_or_settled`).
    The entry never expires. The member's replay that succeeds makes the part
    return Celery's own way and then settles the entry ``released``; a purge (or
    retention) settles it ``failed`` and makes a FAILURE part return
    (:func:`part_return`) naming the letter. Either settles it once
    (``lua/chord_settle.lua``).
``failed``, ``continued``
    rules ``fail`` and ``continue``: the part return was made when the member
    was dead-lettered (a FAILURE naming the DLQ, or a SUCCESS with the
    placeholder). A replay that succeeds later makes none: the chord is
    settled once.

Everything lives in the home key set (``{<prefix>}``), so one script sees a
member and its sets on Redis Cluster.
"""
from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

from celery import states
from celery.app.task import Context
from celery.backends.base import Backend, DisabledBackend
from kombu.utils import json

from celery_dlq.errors import ChordMemberDeadLettered, ChordMemberPurged, ConfigurationError
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.scripts import Scripts

WAITING, RELEASED, FAILED, CONTINUED = "waiting", "released", "failed", "continued"
#: How long a settled entry is kept (it stops a late copy of the member settling its chord twice).
SETTLED_TTL_S = 7 * 24 * 3600


def request_fields(request: Any) -> dict[str, Any]:
    """What a part return needs of a member's request (``id``, ``group``, ``chord``, ...).

    Stored with kombu's JSON, which the task message itself went through: a body or errback carrying
    bytes, dates or UUIDs in its arguments round-trips as Celery's own json serializer has it.
    """
    get = request.get if hasattr(request, "get") else (lambda name, default=None: getattr(request, name, default))
    return {name: get(name) for name in ("id", "task", "group", "group_index", "chord", "root_id", "parent_id")}


def chord_fields(request: Any) -> dict[str, Any] | None:
    """The chord part a failed task stands for; None when it stands for none.

    A chord member stands for itself. The first steps of a chain in a
    chord's header stand for the chain's last step, the chord member, which
    Celery tells the chord of their failure (``mark_as_failure`` walks the
    chain); it carries ``chord``, ``task_id``, ``group_id`` and
    ``group_index`` in its options.
    """
    fields = request_fields(request)
    if fields.get("chord"):
        return fields if fields.get("group") and fields.get("id") else None
    get = request.get if hasattr(request, "get") else (lambda name, default=None: getattr(request, name, default))
    for step in get("chain") or ():
        options = step.get("options") or {} if isinstance(step, dict) else {}
        if options.get("chord") and options.get("task_id") and options.get("group_id"):
            return {"id": options["task_id"], "task": step.get("task"), "group": options["group_id"],
                    "group_index": options.get("group_index"), "chord": options["chord"],
                    "root_id": fields.get("root_id"), "parent_id": fields.get("id")}
    return None


def take_chord(context: Any) -> dict[str, Any] | None:
    """Take the chord off a failed task's context so Celery's FAILURE does not tell it; what it was, or None.

    Returns the context as it was (a dict, its chain copied) when it stands
    for a chord part (:func:`chord_fields`): what the rule is applied with
    once the letter is stored. The chord goes from the context itself, or
    from the options of the chord member ending its chain.
    """
    if chord_fields(context) is None:
        return None
    before = dict(vars(context), chain=copy.deepcopy(getattr(context, "chain", None)))
    if getattr(context, "chord", None):
        context.chord = None
    for step in getattr(context, "chain", None) or ():
        if isinstance(step, dict):
            (step.get("options") or {}).pop("chord", None)
    return before


def uses_chord_unlock(backend: Any) -> bool:
    """Whether the backend joins chords by polling (``celery.chord_unlock``: the database backend, ...).

    Celery's base ``Backend.apply_chord`` sends ``chord_unlock``; the Redis
    backend and the key-value backends that count parts (``implements_incr``)
    replace it with their own and report parts in ``on_chord_part_return``.
    """
    return getattr(type(backend), "apply_chord", None) is Backend.apply_chord and \
        getattr(backend.apply_chord, "__func__", None) is Backend.apply_chord


def part_return(app: Any, fields: dict[str, Any], state: str, value: Any, unlock: str = "") -> None:
    """Tell a chord one member's outcome, as Celery does when a member's result is stored.

    ``state`` FAILURE with an exception fails the chord (its body's errbacks
    get a ``ChordError`` with the exception's text); SUCCESS counts the
    member with ``value`` as its result. A backend that reports parts
    (Redis) gets ``on_chord_part_return``; one that polls
    (``chord_unlock``) gets the member's result stored, and its parked
    ``chord_unlock`` call (``unlock``) is sent again to join the chord.
    """
    backend = app.backend
    if not uses_chord_unlock(backend):
        # Celery < 5.7 restores the header's GroupResult with the *current* app: in an operator's process
        # (a purge) that would be a default app without a result backend.
        app.set_current()
        backend.on_chord_part_return(Context(fields), state, value)
        return
    backend.store_result(fields["id"], value, state)
    resume_unlock(app, unlock)


def resume_unlock(app: Any, unlock: str) -> None:
    """Send a parked ``celery.chord_unlock`` call again (nothing when ``unlock`` is empty)."""
    if not unlock:
        return
    call = json.loads(unlock)
    app.send_task("celery.chord_unlock", args=call["args"], kwargs=call["kwargs"], queue=call.get("queue"))


#: The exceptions a settled member's slot may hold, by the name the ledger records.
_SLOT_ERRORS = {cls.__name__: cls for cls in (ChordMemberDeadLettered, ChordMemberPurged)}


def slot(state: str, value: Any) -> str:
    """What a settled member's slot holds, as the ledger records it (JSON): a FAILURE's exception by type
    and message (one of :data:`_SLOT_ERRORS`), a SUCCESS's value (the ``continue`` placeholder)."""
    if state == states.FAILURE:
        return json.dumps({"state": state, "exc": type(value).__name__, "message": str(value)})
    return json.dumps({"state": state, "value": value})


def slot_value(raw: Any) -> tuple[str, Any]:
    """``(state, value)`` of a slot recorded by :func:`slot`."""
    data = json.loads(raw)
    if data["state"] == states.FAILURE:
        return data["state"], _SLOT_ERRORS[data["exc"]](data["message"])
    return data["state"], data["value"]


def store_slots(app: Any, slots: dict[str, tuple[str, Any]]) -> None:
    """Write settled members' slots to a polling backend, as :func:`part_return` does, before its
    ``chord_unlock`` joins the chord: the join reads what the ledger decided, not the member's own failure."""
    for task_id, (state, value) in slots.items():
        app.backend.store_result(task_id, value, state)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


def require_backend(app: Any, what: str) -> None:
    """Raise before ``what`` when the app cannot tell a chord anything (no ``result_backend`` configured)."""
    if isinstance(app.backend, DisabledBackend):
        raise ConfigurationError(f"{what}: this app has no result_backend, so their chords cannot be told; "
                                 "run it with the workers' result_backend setting")


class ChordLedger:
    """Dead-lettered chord members on our Redis (the home key set); see the module docstring."""

    def __init__(self, client: Any, keys: Keys, scripts: Scripts | None = None) -> None:
        self.client, self.keys = client, keys
        self.scripts = scripts or Scripts(client)

    def _keys(self, task_id: str, group: str, dlq: str) -> list[str]:
        return [self.keys.chord_member(task_id), self.keys.chord_waiting(group), self.keys.chord_waiting_in(dlq),
                self.keys.chord_unlock(group), self.keys.chord_outcomes(group)]

    def dying(self, task_id: str, group: str) -> bool:
        """In the child, as a member's last failure is raised: its chord counts it as waiting already.

        Celery stores the member's FAILURE before the worker's main process
        stores the dead letter and applies the rule; a ``chord_unlock`` that
        polls in between finds the member waiting and parks, instead of
        failing the chord. A member whose entry is settled is left so
        (``lua/chord_dying.lua``); returns whether it counts as waiting.
        """
        return bool(self.scripts.run("chord_dying", [self.keys.chord_member(task_id), self.keys.chord_waiting(group)],
                                     [task_id]))

    def hold(self, letter: str, fields: dict[str, Any], *, state: str, rule: str, dlq: str | None,
             failure_group: str = "", now: float | None = None, outcome: str = "") -> tuple[str, str]:
        """Record the dead letter ``letter`` (a task id) of chord member ``fields`` in ``state``.

        ``letter`` is the member itself, or a step of a chain that ends in the
        member; ``outcome`` is what the member's slot holds when ``state`` settles
        it (:func:`slot`). Returns the state it had before ('' when new) and the
        chord's parked ``chord_unlock`` call when this settled its last waiting member ('' if none).
        """
        group = str(fields.get("group") or "")
        before, unlock = self.scripts.run("chord_hold", self._keys(letter, group, dlq or ""),
                                          [letter, state, rule, dlq or "", group, json.dumps(fields),
                                           repr(time.time() if now is None else now), SETTLED_TTL_S,
                                           str(fields["id"]), failure_group, outcome])
        return _text(before), _text(unlock)

    def release(self, group: str, member: str) -> list[str]:
        """Chord member ``member`` was reported to its chord: settle the waiting letters that stood for it.

        Returns the chord's parked ``chord_unlock`` call(s) to send again.
        """
        unlocks = []
        for letter in self.client.smembers(self.keys.chord_waiting(group)):
            letter = _text(letter)
            if letter == member or _text(self.client.hget(self.keys.chord_member(letter), "member")) == member:
                settled = self.settle(letter, RELEASED)
                if settled is not None and settled[1]:
                    unlocks.append(settled[1])
        return unlocks

    def park_or_settled(self, group: str, call: dict[str, Any]) -> dict[str, tuple[str, Any]] | None:
        """Park a chord's ``chord_unlock`` call while one of its members waits (None).

        When none waits, returns the slots the ledger settled (member id ->
        ``(state, value)``), read in the same step: what the join must find.
        """
        reply = self.scripts.run("chord_park_unlock", [self.keys.chord_waiting(group), self.keys.chord_unlock(group),
                                                       self.keys.chord_outcomes(group)], [json.dumps(call)])
        if int(reply[0]):
            return None
        pairs = reply[1:]
        return {_text(pairs[i]): slot_value(pairs[i + 1]) for i in range(0, len(pairs), 2)}

    def parked_unlock(self, group: str) -> dict[str, Any] | None:
        """The chord's parked ``chord_unlock`` call (its ``kwargs["result"]``: the header's results); None if none."""
        raw = self.client.get(self.keys.chord_unlock(group))
        return json.loads(raw) if raw else None

    def state(self, task_id: str) -> str | None:
        """The member's state, or None when it was never held."""
        value = self.client.hget(self.keys.chord_member(task_id), "state")
        return value.decode() if isinstance(value, bytes) else value

    def entry(self, task_id: str) -> dict[str, str]:
        """The member's ledger entry (empty when never held), context left as JSON."""
        raw = self.client.hgetall(self.keys.chord_member(task_id))
        return {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                for k, v in raw.items()}

    def settle(self, task_id: str, state: str, *, only_in: str | None = None,
               failure: Callable[[dict[str, Any]], BaseException] | None = None) -> tuple[dict[str, Any], str] | None:
        """Settle a waiting member (``released`` or ``failed``) once.

        ``failure`` gives, from the member's request fields, the exception
        its slot holds when failed (recorded in the same step, :func:`slot`).
        Returns its request fields and the chord's parked ``chord_unlock`` call
        ('' if none, or other members still wait) when this call settled it.
        """
        entry = self.entry(task_id)
        if entry.get("state") != WAITING:
            return None
        outcome = slot(states.FAILURE, failure(json.loads(entry["context"]))) if failure else ""
        found = self.scripts.run("chord_settle", self._keys(task_id, entry.get("group", ""), entry.get("dlq", "")),
                                 [task_id, state, SETTLED_TTL_S, only_in or "", outcome])
        if not found:
            return None
        return json.loads(found[0]), _text(found[1])

    def waiting(self, group: str) -> int:
        """How many of a chord's members wait in a DLQ."""
        return int(self.client.scard(self.keys.chord_waiting(group)))

    def waiting_in(self, dlq: str) -> int:
        """How many waiting chord members were dead-lettered to ``dlq``."""
        return int(self.client.scard(self.keys.chord_waiting_in(dlq)))

    def held_open(self, dlqs: list[str]) -> dict[str, int]:
        """Failure group id -> how many chords its waiting letters in ``dlqs`` hold open (two round trips)."""
        pipe = self.client.pipeline(transaction=False)
        for dlq in dlqs:
            pipe.smembers(self.keys.chord_waiting_in(dlq))
        letters = sorted({_text(letter) for members in pipe.execute() for letter in members})
        for letter in letters:
            pipe.hmget(self.keys.chord_member(letter), "state", "fgroup", "group")
        chords: dict[str, set[str]] = {}
        for state, fgroup, group in pipe.execute() if letters else ():
            if _text(state) == WAITING and fgroup:
                chords.setdefault(_text(fgroup), set()).add(_text(group))
        return {fgroup: len(groups) for fgroup, groups in chords.items()}


def fail_purged(ledger: ChordLedger, app: Any, letters: list[tuple[str, str]], *, dlq: str,
                why: str = "purged") -> int:
    """Fail the chords of waiting members whose letters (``(task_id, task_name)``) left ``dlq`` for good.

    One path for a purge and for retention: each member is settled once, and
    its chord gets a FAILURE part return naming the DLQ and the letter. Returns
    how many chords were failed.
    """
    failed = 0
    for task_id, task in letters:
        def purged(fields: dict[str, Any], task_id: str = task_id, task: str = task) -> ChordMemberPurged:
            return ChordMemberPurged(f"chord member {task or fields.get('task') or 'task'}[{task_id}] {why} from "
                                     f"{dlq} (letter {task_id}) while its chord waited for its replay")
        settled = ledger.settle(task_id, FAILED, only_in=dlq, failure=purged)
        if settled is None:
            continue
        fields, unlock = settled
        part_return(app, fields, states.FAILURE, purged(fields), unlock)
        failed += 1
    return failed
