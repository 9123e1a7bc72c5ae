"""The hook chain: features plug into a delivery's events, and the delivery path calls the chain once per event.

As Dramatiq's middleware, a feature is one :class:`Middleware` subclass that
overrides the hooks it needs; every hook here does nothing. The runtime holds
one :class:`Chain` of them, in order (``worker/runtime.py``), and the
delivery path calls it once per event, naming no feature:

* ``worker/run/strategy.py`` (main process, a message arrives): :meth:`~Middleware.fetched`;
* ``worker/run/task.py`` (the pool's child, the task runs): :meth:`~Middleware.raised`,
  :meth:`~Middleware.last_failure`, :meth:`~Middleware.before_success`, :meth:`~Middleware.after_success`;
* ``worker/run/request.py`` (main process, the outcome): :meth:`~Middleware.taking_over`,
  :meth:`~Middleware.delivery_failed`, :meth:`~Middleware.recording_failure`, :meth:`~Middleware.dead_lettered`,
  :meth:`~Middleware.delivery_succeeded`, :meth:`~Middleware.acknowledged`, :meth:`~Middleware.requeued`;
* ``worker/park/parking.py`` (main process, a direct park): :meth:`~Middleware.park_settles`,
  :meth:`~Middleware.park_settled`;
* ``worker/install.py``: :meth:`~Middleware.finalized`, once per app.

The chain is built once: for each hook it keeps the bound methods of the
features that override it, so an event no feature implements costs one
empty loop. It catches nothing: a hook catches what it expects (a Redis
error, a user's backend or callback, logged as the feature says), and
anything else is a bug of ours and propagates. docs/architecture.md ("The
hook chain") lists the features in chain order and the hooks each
implements; a test holds the table and the code together.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery_dlq.policy import RedeliveryPolicy
    from celery_dlq.worker.config import MessageContext


@dataclass
class Letter:
    """A task's message whose dead letter is stored (``dlq`` None: dropped): what :meth:`Middleware.dead_lettered`
    is told."""

    task_name: str | None
    task_id: str | None
    headers: Mapping[str, Any]
    dlq: str | None
    reason: str
    delivery: int
    failure: Mapping[str, str]
    policy: RedeliveryPolicy
    #: What a feature keeps between :meth:`Middleware.recording_failure` and :meth:`Middleware.dead_lettered`.
    notes: dict[str, Any] = field(default_factory=dict)


class Middleware:
    """One feature of the delivery path; a subclass overrides the hooks it needs (each here does nothing)."""

    #: The feature's name in docs/architecture.md's table.
    name = ""

    # -- installing ------------------------------------------------------------

    def finalized(self, app: Any) -> None:
        """The app is finalized (its tasks registered), before a worker builds its tracers."""

    # -- main process: a message arrives (worker/run/strategy.py) ------------------

    def fetched(self, task: Any, message: Any, ctx: MessageContext, hostname: str) -> bool:
        """A valid message is about to be handed to Celery (not one that waits for its ETA).

        True: the feature took the message (held it, dead-lettered it,
        acknowledged it): it must not run, and the features after it are not asked.
        """
        return False

    # -- child process: the task runs (worker/run/task.py) -------------------------

    def raised(self, task: Any, request: Any, exc: Exception) -> BaseException | None:
        """The task raised ``exc``: the exception to raise instead when it is the feature's own, else None.

        The first feature that answers decides; what it answers is the last
        failure (:meth:`last_failure`) unless it is a Celery ``Retry``.
        """
        return None

    def last_failure(self, task: Any, request: Any) -> None:
        """The task's last failure is about to be raised: the worker dead-letters the message after it."""

    def before_success(self, task: Any, request: Any) -> None:
        """The task returned; Celery records its success next."""

    def after_success(self, task: Any, request: Any) -> None:
        """Celery recorded the task's success (``after_return`` with SUCCESS)."""

    # -- main process: the outcome (worker/run/request.py) -------------------------

    def taking_over(self, request: Any, exc: BaseException) -> bool:
        """The delivery ended with ``exc``: True when the feature stored its outcome (``exc`` was its own).

        Raises when that write failed: the message is left unacknowledged and
        the write tried again, as for a park. The first feature that says
        True has taken it; Celery then records the outcome as a retry.
        """
        return False

    def park_settles(self, message: Any, delivery_tag: str) -> Any:
        """A consumed message is about to be parked by one script on the broker's Redis (a direct park).

        What that script also settles in the same round trip, as
        ``(keys, delivery_tag)``, or None. The first feature that answers decides.
        """
        return None

    def park_settled(self, message: Any, delivery_tag: str) -> None:
        """The park script ran with what :meth:`park_settles` answered."""

    def delivery_failed(self, request: Any, ctx: MessageContext, failure: Mapping[str, str]) -> None:
        """A delivery failed, and its message is parked or dead-lettered already."""

    def recording_failure(self, letter: Letter, context: Any) -> None:
        """Celery is about to record the FAILURE of a dead-lettered task itself (a lost worker, a hard time
        limit, a message dead-lettered before it ran), with the task context ``context``."""

    def dead_lettered(self, letter: Letter, context: Any) -> None:
        """The letter is stored (and its FAILURE recorded): ``context`` is the task context."""

    def delivery_succeeded(self, request: Any) -> None:
        """A delivery that ran succeeded: its message was just acknowledged."""

    def acknowledged(self, request: Any) -> None:
        """The request's message was just acknowledged (whatever the outcome)."""

    def requeued(self, request: Any) -> None:
        """The task put its own message back (``Reject(requeue=True)``)."""


#: Every hook, in the order of a delivery.
HOOKS: tuple[str, ...] = (
    "finalized", "fetched", "raised", "last_failure", "before_success", "after_success", "taking_over",
    "park_settles", "park_settled", "delivery_failed", "recording_failure", "dead_lettered", "delivery_succeeded",
    "acknowledged", "requeued",
)


def overridden(feature: Middleware) -> tuple[str, ...]:
    """The hooks ``feature`` implements (overrides), in :data:`HOOKS` order."""
    return tuple(hook for hook in HOOKS if getattr(type(feature), hook) is not getattr(Middleware, hook))


class Chain:
    """The features of one app, in order; each method calls the hook of every feature that implements it."""

    def __init__(self, features: Iterable[Middleware]) -> None:
        self.features: tuple[Middleware, ...] = tuple(features)
        by_hook: dict[str, list[Callable[..., Any]]] = {hook: [] for hook in HOOKS}
        for feature in self.features:
            for hook in overridden(feature):
                by_hook[hook].append(getattr(feature, hook))
        #: Per hook, the bound hooks of the features that override it (precomputed: an event costs one loop).
        self.implementers: dict[str, tuple[Callable[..., Any], ...]] = {h: tuple(f) for h, f in by_hook.items()}
        i = self.implementers
        self._finalized, self._fetched, self._raised = i["finalized"], i["fetched"], i["raised"]
        self._last_failure, self._before_success = i["last_failure"], i["before_success"]
        self._after_success, self._taking_over = i["after_success"], i["taking_over"]
        self._park_settles, self._park_settled = i["park_settles"], i["park_settled"]
        self._delivery_failed, self._recording_failure = i["delivery_failed"], i["recording_failure"]
        self._dead_lettered, self._delivery_succeeded = i["dead_lettered"], i["delivery_succeeded"]
        self._acknowledged, self._requeued = i["acknowledged"], i["requeued"]

    def finalized(self, app: Any) -> None:
        for hook in self._finalized:
            hook(app)

    def fetched(self, task: Any, message: Any, ctx: MessageContext, hostname: str) -> bool:
        for hook in self._fetched:
            if hook(task, message, ctx, hostname):
                return True
        return False

    def raised(self, task: Any, request: Any, exc: Exception) -> BaseException | None:
        for hook in self._raised:
            instead = hook(task, request, exc)
            if instead is not None:
                return instead
        return None

    def last_failure(self, task: Any, request: Any) -> None:
        for hook in self._last_failure:
            hook(task, request)

    def before_success(self, task: Any, request: Any) -> None:
        for hook in self._before_success:
            hook(task, request)

    def after_success(self, task: Any, request: Any) -> None:
        for hook in self._after_success:
            hook(task, request)

    def taking_over(self, request: Any, exc: BaseException) -> bool:
        for hook in self._taking_over:
            if hook(request, exc):
                return True
        return False

    def park_settles(self, message: Any, delivery_tag: str) -> Any:
        for hook in self._park_settles:
            settles = hook(message, delivery_tag)
            if settles is not None:
                return settles
        return None

    def park_settled(self, message: Any, delivery_tag: str) -> None:
        for hook in self._park_settled:
            hook(message, delivery_tag)

    def delivery_failed(self, request: Any, ctx: MessageContext, failure: Mapping[str, str]) -> None:
        for hook in self._delivery_failed:
            hook(request, ctx, failure)

    def recording_failure(self, letter: Letter, context: Any) -> None:
        for hook in self._recording_failure:
            hook(letter, context)

    def dead_lettered(self, letter: Letter, context: Any) -> None:
        for hook in self._dead_lettered:
            hook(letter, context)

    def delivery_succeeded(self, request: Any) -> None:
        for hook in self._delivery_succeeded:
            hook(request)

    def acknowledged(self, request: Any) -> None:
        for hook in self._acknowledged:
            hook(request)

    def requeued(self, request: Any) -> None:
        for hook in self._requeued:
            hook(request)
