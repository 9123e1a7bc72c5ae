"""Celery internals: the Request's revoke path and task context, the prefork pool's pipes, consumer callbacks.

celery-dlq's Request subclass (:mod:`celery_dlq.worker.run.request`) takes
over a discarded expired message in ``_announce_revoked`` and records
results with the request's ``_context``; the pool fix
(:mod:`celery_dlq.worker.run.poolfix`) wraps the hub's reset and the pool's registration through
:func:`wrap_reset_and_registration` and reads the pipe tables here; the
consumer callbacks it wraps are public names whose arguments it relies on.
"""
from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from celery.app.task import Context

from celery_dlq.internals.base import ATTRIBUTE, INSTANCE_ATTRIBUTE, METHOD, Feature, Internal

_REQUEST, _CONSUMER = "celery.worker.request:Request", "celery.worker.consumer.consumer:Consumer"
_HUB = "kombu.asynchronous.hub:Hub"

EXPIRED_TAKEOVER = Feature(
    name="expired takeover",
    does="dead-lettering a redelivered copy that expires before it runs (reason expired)",
    fallback="Celery discards such a copy as REVOKED (expired), as it does without celery-dlq",
    internals=(Internal(_REQUEST, "_announce_revoked", METHOD, "sees an expired message before Celery drops it",
                        ("self", "reason", "terminated", "signum", "expired")),),
)

REQUEST_STATE = Feature(
    name="request state",
    does="reading a request's task context and revoke flags",
    fallback="the context is rebuilt from the public request_dict, and revoke flags read as unset",
    internals=(
        Internal(_REQUEST, "_context", ATTRIBUTE, "the task context Celery records results with"),
        Internal(_REQUEST, "_already_revoked", ATTRIBUTE, "a revoked request's exit is not a lost worker"),
        Internal(_REQUEST, "_already_cancelled", ATTRIBUTE, "a cancelled request's exit is not a lost worker"),
    ),
)

POOL_IO = Feature(
    name="pool io",
    does="keeping half-done prefork pipe reads across a broker reconnect",
    fallback="a reconnect during a result read behaves as in plain Celery",
    internals=(
        Internal("celery.concurrency.prefork:TaskPool", "_pool", INSTANCE_ATTRIBUTE, "the billiard pool behind "
                 "the task pool", assigned_in="on_start"),
        Internal("celery.concurrency.asynpool:AsynPool", "_fileno_to_outq", INSTANCE_ATTRIBUTE,
                 "which hub readers are result pipes"),
        Internal("celery.concurrency.asynpool:AsynPool", "_fileno_to_inq", INSTANCE_ATTRIBUTE,
                 "which hub writers are job pipes"),
        Internal(_HUB, "reset", METHOD, "wrapped to keep the pipe generators", ("self",)),
        Internal(_HUB, "readers", INSTANCE_ATTRIBUTE, "fd -> (callback, args): a half-done pipe read is a generator"),
        Internal(_HUB, "writers", INSTANCE_ATTRIBUTE, "fd -> (callback, args): a half-done pipe write is a generator"),
        Internal("celery.concurrency.prefork:TaskPool", "register_with_event_loop", METHOD,
                 "wrapped to put them back", ("self", "loop")),
    ),
)

DISCARDS = Feature(
    name="discards",
    does="dead-lettering unknown-task, invalid and undecodable messages",
    fallback="Celery rejects them as it does without celery-dlq (they are not dead-lettered)",
    internals=(
        Internal(_CONSUMER, "on_unknown_task", METHOD, "wrapped: message is argument 2",
                 ("self", "body", "message", "exc")),
        Internal(_CONSUMER, "on_invalid_task", METHOD, "wrapped: message is argument 2",
                 ("self", "body", "message", "exc")),
        Internal(_CONSUMER, "on_unknown_message", METHOD, "wrapped: message is argument 2",
                 ("self", "body", "message")),
        Internal(_CONSUMER, "on_decode_error", METHOD, "wrapped: message is argument 1", ("self", "message", "exc")),
    ),
)

UNCOUNT = Feature(
    name="uncount",
    does="taking back the delivery counts of reserved messages that never started, at shutdown",
    fallback="those counts stay (each restart may use up one delivery of a message that never ran)",
    internals=(Internal("celery.bootsteps:Blueprint", "on_close", INSTANCE_ATTRIBUTE,
                        "wrapped: runs before the consumer forgets its reserved requests"),),
)


def revoked_expired(args: tuple, kwargs: dict) -> bool:
    """Whether an ``_announce_revoked(reason, terminated, signum, expired)`` call is for an expired message."""
    if "expired" in kwargs:
        return bool(kwargs["expired"])
    return bool(args[3]) if len(args) > 3 else False


def request_context(request: Any) -> Any:
    """The task context Celery records a request's result with (``request._context``)."""
    context = getattr(request, "_context", None)
    if context is None:
        context = Context(request.request_dict)
    return context


def was_revoked_or_cancelled(request: Any) -> bool:
    return bool(getattr(request, "_already_revoked", False) or getattr(request, "_already_cancelled", False))


def mark_revoked(request: Any) -> None:
    """Make Celery treat the request as revoked (it is not run while our write is retried)."""
    request._already_revoked = True


def pool_fds(pool: Any, table: str) -> set[int]:
    """The pipe fds of a prefork task pool: ``"out"`` (results) or ``"in"`` (jobs)."""
    inner = getattr(pool, "_pool", None)
    return set(getattr(inner, f"_fileno_to_{table}q", None) or ())


#: Set on a hub whose reset is wrapped (once per worker).
_WRAPPED = "_celery_dlq_keeps_half_done_io"


def wrap_reset_and_registration(hub: Any, pool: Any, before_reset: Callable[[], None],
                                after_register: Callable[[Any], None]) -> bool:
    """Call ``before_reset()`` before each ``hub.reset()`` and ``after_register(loop)`` after each
    ``pool.register_with_event_loop(loop)``; once per hub. Returns whether it wrapped them."""
    if hub is None or pool is None or getattr(hub, _WRAPPED, False) \
            or not hasattr(hub, "readers") or not hasattr(pool, "register_with_event_loop"):
        return False
    reset, register = hub.reset, pool.register_with_event_loop

    def reset_after_hook() -> Any:
        before_reset()
        return reset()

    def register_then_hook(loop: Any) -> Any:
        result = register(loop)
        after_register(loop)
        return result

    hub.reset = reset_after_hook
    pool.register_with_event_loop = register_then_hook
    setattr(hub, _WRAPPED, True)
    return True


def half_done_io(hub: Any, fds: set[int], writers: bool = False) -> dict[int, tuple]:
    """The hub's readers (``writers``: writers) on ``fds`` that are half-done: a generator callback, as AsynPool
    registers one in the middle of a message."""
    table = hub.writers if writers else hub.readers
    return {fd: entry for fd, entry in list(table.items())
            if fd in fds and entry and isinstance(entry[0], types.GeneratorType)}


def resume_io(loop: Any, fd: int, entry: tuple, writers: bool = False) -> None:
    """Register a half-done read (``writers``: write) of :func:`half_done_io` again, to carry on where it was."""
    generator, args = entry
    (loop.add_writer if writers else loop.add_reader)(fd, generator, *args)
