"""Edit before replay: a dead letter's args, kwargs and selected headers changed as it is replayed.

The message is otherwise untouched: its id, its place in a chain or chord (the body's ``embed``, the
``group``/``root_id``/``parent_id`` headers) and its routing stay. The body is decoded only when
``accept_content`` allows its content type, and encoded again with that same serializer
(:func:`celery_dlq.message.with_arguments`, as ``self.retry(args=...)`` does): an edit never changes
how a message is serialized, and a pickled letter cannot be edited unless the app accepts pickle.
"""
from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from celery_dlq.errors import DLQError
from celery_dlq.message import with_arguments
from celery_dlq.ops.audit import Actor, Audit, outcome_counts
from celery_dlq.ops.letters import DeadLetter, TaskIds
from celery_dlq.ops.queue import DeadLetterQueue, Outcome
from celery_dlq.ops.selection import Selection

#: Headers an edit may not change: the task's identity, its place in a workflow, Celery's own bookkeeping.
PROTECTED_HEADERS = frozenset({
    "id", "task", "lang", "root_id", "parent_id", "group", "group_index", "origin", "retries", "argsrepr",
    "kwargsrepr", "stamped_headers", "stamps", "replaced_task_nesting", "compression", "chord"})


class BadEdit(DLQError, ValueError):
    """An edit that cannot be made: bad JSON, a protected header, or a body outside ``accept_content``."""


def parse_json(text: str, what: str, kind: type) -> Any:
    """``text`` read as JSON of ``kind`` (list for args, dict for kwargs); :class:`BadEdit` saying why not."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise BadEdit(f"{what} is not JSON: {exc}") from None
    if not isinstance(value, kind):
        raise BadEdit(f"{what} must be a JSON {'array' if kind is list else 'object'}, got {type(value).__name__}")
    return value


def parse_headers(pairs: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``k=v`` pairs: ``v`` as JSON when it reads as JSON, else as text."""
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name.strip():
            raise BadEdit(f"a header is name=value, got {pair!r}")
        try:
            out[name.strip()] = json.loads(text)
        except ValueError:
            out[name.strip()] = text
    return out


@dataclass(frozen=True)
class Edit:
    """New ``args`` and/or ``kwargs`` (None: kept) and header values for the dead letter of ``task_id``."""

    task_id: str
    args: list | None = None
    kwargs: dict | None = None
    headers: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        refused = sorted(name for name in self.headers   # any case: kombu's headers are a plain dict
                         if name.lower() in PROTECTED_HEADERS or name.lower().startswith("x-dlq-"))
        if refused:
            raise BadEdit(f"header {refused[0]!r} cannot be edited: it is the task's identity, its place in a "
                          "workflow or celery-dlq's history")
        if self.args is None and self.kwargs is None and not self.headers:
            raise BadEdit("an edit changes args, kwargs or a header: nothing given")

    def original(self, letter: DeadLetter) -> dict:
        """What the edit replaces (for the audit record): args, kwargs, and the edited headers' old values."""
        arguments = letter.arguments()
        return {"args": arguments[0] if arguments else None, "kwargs": arguments[1] if arguments else None,
                "headers": {name: letter.header(name) for name in self.headers}}

    def as_dict(self) -> dict:
        return {"args": self.args, "kwargs": self.kwargs, "headers": dict(self.headers)}

    def check(self, letter: DeadLetter) -> None:
        """Raise :class:`BadEdit` now when the letter's body cannot be edited (before anything moves)."""
        self.apply(letter, dict(letter.message, headers=dict(letter.headers)))

    def apply(self, letter: DeadLetter, message: dict) -> dict:
        """``message`` (the letter as its replay delivers it, ``DeadLetter.replayed``) with the edit made;
        any other letter unchanged."""
        if letter.task_id != self.task_id:
            return message
        headers = dict(message.get("headers") or {}, **self.headers)
        if self.args is None and self.kwargs is None:
            return dict(message, headers=headers)
        arguments = letter.arguments()
        if arguments is None:
            raise BadEdit(f"the arguments of {self.task_id} cannot be edited: its body ({letter.content_type}) is "
                          "not in accept_content, or not a Celery task body")
        args = self.args if self.args is not None else arguments[0]
        kwargs = self.kwargs if self.kwargs is not None else arguments[1]
        try:
            edited = with_arguments(letter.decoded.as_envelope().with_headers(headers), args, kwargs, letter.accept)
        except Exception as exc:   # the serializer refused the new values: nothing moved
            raise BadEdit(f"cannot encode the edited arguments as {letter.content_type}: {exc}") from None
        properties = dict(message.get("properties") or {}, body_encoding="base64")
        return dict(message, body=base64.b64encode(edited.body).decode("ascii"), headers=edited.headers,
                    properties=properties, **{"content-type": edited.content_type,
                                              "content-encoding": edited.content_encoding})


def replay_edited(dead: DeadLetterQueue, edit: Edit, actor: Actor, *, to: str | None = None) -> Outcome:
    """Replay the oldest dead letter of ``edit.task_id`` from ``dead`` with the edit made; audited with the
    original arguments and headers. :class:`BadEdit` before anything moves when the edit cannot be made."""
    letter = dead.get(edit.task_id)
    if letter is None:
        return Outcome(not_found=[edit.task_id])
    edit.check(letter)
    out = dead.replay(TaskIds([edit.task_id]), to=to, limit=1, edit=edit.apply)
    Audit(dead.op).record("edit", actor, dlq=dead.name, selection=Selection.of([edit.task_id]),
                          counts=outcome_counts(out), task_id=edit.task_id, task_name=letter.task_name, to=to,
                          original=edit.original(letter), edited=edit.as_dict())
    return out
