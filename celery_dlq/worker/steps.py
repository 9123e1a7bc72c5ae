"""celery-dlq's consumer bootsteps, one job each.

``install()`` adds them to the app's consumer blueprint, bound to the app's
runtime (:func:`bound_steps`). Every step but :class:`Settings` requires it,
so a bad setting stops the worker before anything else is done. A step that
rests on another library's internals is included only when they hold
(:mod:`celery_dlq.internals`): otherwise the worker logs one WARNING naming
the internal and runs without the step, on the fallback. The mover is
:class:`celery_dlq.worker.park.mover.Mover`. Like Celery's ``Heart``, which
takes ``c.timer``, each step hands its component only the parts of the
runtime it uses.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import bootsteps
from celery.utils import timer2

from celery_dlq.errors import ConfigurationError
from celery_dlq.headers import Reason
from celery_dlq.internals import base as internals
from celery_dlq.internals.base import Feature
from celery_dlq.internals.billiard_einfo import COMPACT_TRACEBACKS, compact_tracebacks
from celery_dlq.internals.celery_worker import DISCARDS, POOL_IO, UNCOUNT
from celery_dlq.internals.features import FEATURES
from celery_dlq.internals.kombu_redis import FETCH
from celery_dlq.worker.connections import Connections
from celery_dlq.worker.fetch.moves import MoveTally
from celery_dlq.worker.fetch.setup import FetchContext, use_in_worker
from celery_dlq.worker.leader.jobs import RedriveJobs
from celery_dlq.worker.park.mover import Mover
from celery_dlq.worker.run.discards import dead_letter_first, uncount_first
from celery_dlq.worker.run.poolfix import keep_half_done_io
from celery_dlq.worker.runtime import Runtime

logger = logging.getLogger(__name__)


class Settings(bootsteps.Step):
    """Validates the ``dlq_*`` settings (a bad one stops the worker, naming it) and checks every internal."""

    runtime: Runtime

    def create(self, c: Any) -> None:
        config = self.runtime.config
        try:
            config.validate()
            _ = config.settings.redis_url   # a worker needs the store, even where install() did not
        except ConfigurationError as exc:
            # One line naming the setting, exit status 1: not a traceback through Celery's bootsteps.
            raise SystemExit(f"celery-dlq: the worker cannot start: {exc}") from None
        for warning in config.capped_delay_warnings():
            logger.warning("celery-dlq: %s", warning)
        for feature in FEATURES:   # one WARNING per moved internal, before the first fetch
            internals.usable(feature)


class BindConsumer(bootsteps.Step):
    """Lends the consumer (its timer, its event dispatcher) to the Request and the task events."""

    runtime: Runtime

    def create(self, c: Any) -> None:
        self.runtime.consumer.bind(c)


class FeatureStep(bootsteps.Step):
    """A step resting on library internals: included only when its ``feature`` holds (else one WARNING, at
    Settings, and the step is left out). Every step requires Settings (:func:`bound_steps`)."""

    feature: Feature

    def include_if(self, c: Any) -> bool:
        return internals.usable(self.feature)


class FetchTransport(FeatureStep):
    """The worker's broker connections use celery-dlq's fetch (before the Connection step connects)."""

    feature = FETCH
    runtime: Runtime

    def create(self, c: Any) -> None:
        rt = self.runtime
        use_in_worker(c.app, FetchContext.of(rt.config, rt.redis, rt.fetch_moved), rt.config.settings.fetch_transport)


class KeepPoolIO(FeatureStep):
    """Half-done prefork pipe reads and writes carry on across a broker reconnect (worker/run/poolfix.py)."""

    feature = POOL_IO

    def create(self, c: Any) -> None:
        controller = getattr(c, "controller", None)
        keep_half_done_io(getattr(controller, "hub", None), getattr(controller, "pool", None))


class CompactTracebacks(FeatureStep):
    """Failed tasks pickle one code position per frame (before the pool forks)."""

    feature = COMPACT_TRACEBACKS

    def create(self, c: Any) -> None:
        compact_tracebacks()


class DeadLetterDiscards(FeatureStep):
    """Unknown-task, invalid and undecodable messages are dead-lettered before Celery discards them."""

    feature = DISCARDS
    runtime: Runtime

    def create(self, c: Any) -> None:
        cf, redis = self.runtime.config, self.runtime.redis
        c.on_unknown_task = dead_letter_first(cf, redis, c, c.on_unknown_task, Reason.UNKNOWN_TASK, body_first=True)
        c.on_invalid_task = dead_letter_first(cf, redis, c, c.on_invalid_task, Reason.INVALID_MESSAGE,
                                              body_first=True)
        c.on_unknown_message = dead_letter_first(cf, redis, c, c.on_unknown_message, Reason.INVALID_MESSAGE,
                                                 body_first=True)
        c.on_decode_error = dead_letter_first(cf, redis, c, c.on_decode_error, Reason.INVALID_MESSAGE,
                                              body_first=False)


class UncountUnstarted(FeatureStep):
    """When the consumer closes, reserved messages that never started give their delivery counts back."""

    feature = UNCOUNT
    runtime: Runtime

    def create(self, c: Any) -> None:
        c.blueprint.on_close = uncount_first(self.runtime.config, self.runtime.redis, c.blueprint.on_close)


class FlushCounts(bootsteps.StartStopStep):
    """Every heartbeat interval, on a timer of its own, writes what the worker counted (:func:`flush_counts`):
    a flush that fails or is slow never delays the mover. Flushes once more when the consumer stops."""

    runtime: Runtime

    def __init__(self, c: Any, **kwargs: Any) -> None:
        self.timer: timer2.Timer | None = None
        super().__init__(c, **kwargs)

    def start(self, c: Any) -> None:
        self.timer = timer2.Timer()
        self.timer.call_repeatedly(self.runtime.config.settings.heartbeat_interval, flush_counts,
                                   (self.runtime.redis, self.runtime.fetch_moved))

    def stop(self, c: Any) -> None:
        if self.timer is not None:
            self.timer.stop()
            self.timer = None
        flush_counts(self.runtime.redis, self.runtime.fetch_moved)   # what was counted since the last tick

    shutdown = stop


def flush_counts(redis: Callable[[], Connections], moved: MoveTally) -> None:
    """Delete the delivery counters of acknowledged messages and count the fetches' moves (never raises;
    counters of tasks finishing later expire with their TTL)."""
    try:
        redis().counters.flush()
    except Exception:
        logger.exception("celery-dlq: could not delete the counters of acknowledged messages")
    try:
        moved.flush(redis().store)
    except Exception:
        logger.exception("celery-dlq: could not count the messages this worker's fetches redelivered")


STEPS: tuple[type[bootsteps.Step], ...] = (Settings, BindConsumer, FetchTransport, KeepPoolIO, CompactTracebacks,
                                          DeadLetterDiscards, UncountUnstarted, FlushCounts, Mover, RedriveJobs)


def bound_steps(runtime: Runtime) -> list[type]:
    """:data:`STEPS` for one app's runtime: subclasses of the same name, requiring each other's bound class."""
    made: dict[type, type] = {}
    for step in STEPS:
        requires = tuple(made.get(dep, dep) for dep in step.requires)
        if step is not Settings:
            requires += (made[Settings],)
        made[step] = type(step.__name__, (step,), {"__module__": step.__module__, "runtime": runtime,
                                                  "requires": requires})
    return list(made.values())
