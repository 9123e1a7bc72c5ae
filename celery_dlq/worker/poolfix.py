"""Keep the prefork pool's half-done pipe reads and writes across a broker reconnect.

When the consumer loses its broker connection (a Redis restart, a failover),
Celery's event loop resets its hub (``asynloop``: ``hub.reset()``), dropping
every reader and writer, among them the generators that are half-way through
reading a result message from a pool process's pipe (or writing a job to
one). On reconnect the pool registers a fresh reader for that pipe, which
reads the rest of the half-read message as a new one: pickle raises
``UnpicklingError("invalid load key")`` and the worker stops with
"Unrecoverable error", its running tasks with it (seen in Celery 5.7.0 under
repeated Redis restarts, tests/integration/test_fetch_path.py; cf. celery#1314).

:func:`keep_half_done_io` stashes those generators when the hub is reset and
puts them back right after the pool registers with the event loop again, so
each pipe carries on from where it was.
"""
from __future__ import annotations

import logging
import types
from typing import Any

from celery_dlq.internals.celery_worker import pool_fds

logger = logging.getLogger(__name__)

_MARK = "_celery_dlq_keeps_half_done_io"


def _generators(table: dict, fds: set[int]) -> dict[int, tuple]:
    return {fd: entry for fd, entry in list(table.items())
            if fd in fds and entry and isinstance(entry[0], types.GeneratorType)}


def keep_half_done_io(hub: Any, pool: Any) -> bool:
    """Wrap ``hub.reset`` and ``pool.register_with_event_loop`` of one worker; returns whether it did."""
    if hub is None or pool is None or getattr(hub, _MARK, False) \
            or not hasattr(hub, "readers") or not hasattr(pool, "register_with_event_loop"):
        return False
    readers: dict[int, tuple] = {}
    writers: dict[int, tuple] = {}
    reset, register = hub.reset, pool.register_with_event_loop

    def reset_keeping_half_done_io() -> Any:
        readers.update(_generators(hub.readers, pool_fds(pool, "out")))
        writers.update(_generators(hub.writers, pool_fds(pool, "in")))
        return reset()

    def register_and_restore(loop: Any) -> Any:
        result = register(loop)
        outq, inq = pool_fds(pool, "out"), pool_fds(pool, "in")
        kept = 0
        for fd, (generator, args) in readers.items():
            if fd in outq:
                loop.add_reader(fd, generator, *args)
                kept += 1
        for fd, (generator, args) in writers.items():
            if fd in inq:
                loop.add_writer(fd, generator, *args)
                kept += 1
        if kept:
            logger.info("celery-dlq: %d pool pipe read(s)/write(s) half-done at the reconnect carry on", kept)
        readers.clear()
        writers.clear()
        return result

    hub.reset = reset_keeping_half_done_io
    pool.register_with_event_loop = register_and_restore
    setattr(hub, _MARK, True)
    return True
