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
each pipe carries on from where it was. This module is the policy; the
wrapping and the hub's and pool's tables are touched in
:mod:`celery_dlq.internals.celery_worker`.
"""
from __future__ import annotations

import logging
from typing import Any

from celery_dlq.internals.celery_worker import half_done_io, pool_fds, resume_io, wrap_reset_and_registration

logger = logging.getLogger(__name__)


def keep_half_done_io(hub: Any, pool: Any) -> bool:
    """Keep one worker's half-done pipe reads and writes across hub resets; returns whether it did (once per
    worker, and only with a hub and a pool)."""
    readers: dict[int, tuple] = {}
    writers: dict[int, tuple] = {}

    def stash() -> None:   # the hub is about to drop every reader and writer
        readers.update(half_done_io(hub, pool_fds(pool, "out")))
        writers.update(half_done_io(hub, pool_fds(pool, "in"), writers=True))

    def put_back(loop: Any) -> None:   # the pool registered fresh readers: those of a pipe still its own go back
        outq, inq = pool_fds(pool, "out"), pool_fds(pool, "in")
        kept = 0
        for fd, entry in readers.items():
            if fd in outq:
                resume_io(loop, fd, entry)
                kept += 1
        for fd, entry in writers.items():
            if fd in inq:
                resume_io(loop, fd, entry, writers=True)
                kept += 1
        if kept:
            logger.info("celery-dlq: %d pool pipe read(s)/write(s) half-done at the reconnect carry on", kept)
        readers.clear()
        writers.clear()

    return wrap_reset_and_registration(hub, pool, stash, put_back)
