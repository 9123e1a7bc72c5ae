"""Workflows and dead letters (pure): the chord rules, the ``continue`` placeholder, a letter's place in a canvas.

A chord member that is dead-lettered settles its chord by one of three rules
(docs/workflows.md):

``wait`` (the default)
    the chord stays open while the member is in its DLQ; the member's replay,
    once it succeeds, completes the chord and the body runs once, with every
    result in order. Purging the letter (or retention dropping it) fails the
    chord then.
``fail``
    the chord fails now: the body's errbacks get a ``ChordError`` naming the
    DLQ and the letter (:class:`~celery_dlq.errors.ChordMemberDeadLettered`).
``continue``
    the body runs now; the member's slot holds :func:`placeholder`.

The rule comes from the redelivery policy's ``chord_rule`` or, per call,
from the member message's ``x-dlq-chord-rule`` header (:func:`chord_rule`).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery_dlq import headers as H

CHORD_WAIT, CHORD_FAIL, CHORD_CONTINUE = "wait", "fail", "continue"
CHORD_RULES = (CHORD_WAIT, CHORD_FAIL, CHORD_CONTINUE)

#: The key that marks a ``continue`` placeholder (a dict, so any result serializer carries it).
PLACEHOLDER_KEY = "celery_dlq_dead_lettered"


def chord_rule(rule: str) -> dict[str, str]:
    """Headers that set one call's chord rule: ``add.s(1).set(headers=chord_rule("continue"))``."""
    if rule not in CHORD_RULES:
        raise ValueError(f"chord rule must be one of {', '.join(CHORD_RULES)}, got {rule!r}")
    return {H.CHORD_RULE: rule}


def rule_of(headers: Mapping[str, Any] | None, policy_rule: str) -> str:
    """A member message's chord rule: its own header when valid, else the policy's."""
    value = (headers or {}).get(H.CHORD_RULE)
    return value if value in CHORD_RULES else policy_rule


def placeholder(task_id: str, task: str | None, dlq: str | None, failure: Mapping[str, str]) -> dict[str, Any]:
    """What a dead-lettered member's slot holds under ``continue``: a dict the body can recognise.

    ``{"celery_dlq_dead_lettered": True, "task_id": ..., "task": ..., "dlq": ..., "exception": "Type: message"}``
    """
    return {PLACEHOLDER_KEY: True, "task_id": task_id, "task": task or "", "dlq": dlq or "",
            "exception": H.summary(failure)}


def is_placeholder(value: Any) -> bool:
    """Whether a chord body's argument item is a dead-lettered member's placeholder."""
    return isinstance(value, Mapping) and value.get(PLACEHOLDER_KEY) is True


def describe_failure(task_id: str, task: str | None, dlq: str | None, delivery: int,
                     failure: Mapping[str, str]) -> str:
    """The message of the exception a chord fails with under ``fail`` (and when a waiting letter is purged)."""
    where = f"dead-lettered to {dlq} (letter {task_id})" if dlq else "dropped (dead_letter=False)"
    return f"chord member {task or 'task'}[{task_id}] {where} after delivery {delivery}: {H.summary(failure)}"


def _task_name(signature: Any) -> str:
    if isinstance(signature, Mapping):
        name = signature.get("task")
        if name:
            return str(name)
        tasks = (signature.get("kwargs") or {}).get("tasks")
        if isinstance(tasks, list) and tasks:
            return f"{signature.get('subtask_type') or 'canvas'} of {len(tasks)}"
    return "?"


def membership(headers: Mapping[str, Any], embed: Any) -> dict[str, Any] | None:
    """Which workflow a message belongs to, from its headers and body embed; None when none.

    ``{"kind": "chord", "group": id, "member": 4, "body": "tsum"}`` for a chord
    member (``member`` counts from 1; None when unordered), ``{"kind": "chain",
    "remaining": 2, "next": "record"}`` for a chain step, both when both.
    """
    embed = embed if isinstance(embed, Mapping) else {}
    out: dict[str, Any] = {}
    chord = embed.get("chord")
    if chord:
        index = headers.get("group_index")
        out["chord"] = {"group": headers.get("group"), "member": None if index is None else int(index) + 1,
                        "body": _task_name(chord)}
    chain = embed.get("chain")
    if chain:
        # Celery keeps the chain's rest reversed: the next step is last.
        out["chain"] = {"remaining": len(chain), "next": _task_name(chain[-1])}
    return out or None


_STATES = {
    "waiting": "the chord waits for this letter's replay ({waiting} member(s) in DLQs)",
    "failed": "the chord failed (rule fail, or the letter was purged)",
    "continued": "the body ran without it (rule continue)",
    "released": "the chord completed with its replay",
}


def summary(info: Mapping[str, Any] | None) -> str:
    """One line for ``celery dlq show`` and the dashboard.

    "member 4 of 4 of chord 66d7...; 3 done; body tsum; the chord waits ..." /
    "step 2 of 3 of a chain; next record". The chord's size and what is done,
    and the chain step's number, are there when the result backend told them
    (:mod:`celery_dlq.ops.workflows`).
    """
    if not info:
        return ""
    parts = []
    chord = info.get("chord")
    if chord:
        member = f"member {chord['member']} " if chord.get("member") else "member "
        size = f"of {chord['size']} " if chord.get("size") else ""
        parts.append(f"{member}{size}of chord {chord.get('group')}")
        if chord.get("done") is not None:
            parts.append(f"{chord['done']} done")
        parts.append(f"body {chord.get('body')}")
        state = _STATES.get(chord.get("state") or "")
        if state:
            parts.append(state.format(waiting=chord.get("waiting", 0)))
    chain = info.get("chain")
    if chain:
        parts.append(_chain_line(chain))
    return "; ".join(parts)


def _chain_line(chain: Mapping[str, Any]) -> str:
    step = chain.get("step")
    if not step:
        return f"chain: next {chain['next']} ({chain['remaining']} step(s) left)"
    at_least = "" if chain.get("exact", True) else "at least "
    return f"step {at_least}{step} of {at_least}{step + chain['remaining']} of a chain; next {chain['next']}"
