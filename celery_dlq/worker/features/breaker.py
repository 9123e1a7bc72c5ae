"""The worker's side of the circuit breakers: count, hold, probe, close and release.

A feature of the hook chain (``worker/middleware.py``): :class:`WorkerBreakers`
implements ``fetched`` (hold), ``delivery_failed`` and ``delivery_succeeded`` (count).

* **Count.** A failure of a task whose policy says ``breaker=True`` is
  recorded on its group's breaker, after the message is parked or
  dead-lettered (the request's existing paths); its successes are counted in
  this process's memory and go along with the next failure, so a success
  costs no Redis call. Policies without a breaker cost nothing.
* **Hold.** The strategy asks :meth:`WorkerBreakers.hold` before a delivery
  runs. The breakers' index is read at most every ``dlq_breaker_refresh``
  seconds, and only for tasks whose policy has a breaker (``True`` or
  ``"manual"``). A delivery of a task an open breaker holds on its queue is
  parked without running and without using an attempt
  (:meth:`~celery_dlq.worker.park.parking.Parking.park_again`).
* **Probe.** Once the cool-down is over, one delivery wins the probe and runs;
  its success closes the breaker, its failure opens it again.
* **Hold in Redis.** Where the broker is the store, once a breaker has
  parked its first delivery (the one that comes back to probe), the fetch
  script itself keeps the task's deliveries in Redis (``fetch.lua``): no
  worker fetches, decodes or parks them during the outage.
* **Close.** The deliveries held meanwhile are released at a rising pace (in
  a thread, off the consumer's loop; those the fetch held onto the queue's
  lowest-priority list, so the queue's other traffic goes first), then each
  callable of :attr:`WorkerBreakers.on_close` is called with ``(queue, group, task)`` (``worker/features/redrive.py``).
  Held deliveries no breaker holds any more (a resume from the CLI, a
  releasing worker that died) are released by :meth:`WorkerBreakers.sweep`,
  which the worker holding the mover lease calls (``worker/leader/jobs.py``).

Every state change sends a ``task-breaker-changed`` event (Flower) and is
archived (``breaker`` events).
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from celery_dlq.fingerprint import failure_group
from celery_dlq.storage import breaker_state as B
from celery_dlq.storage.breakers import Breakers, Change, Summary, summaries_for
from celery_dlq.storage.lease import Lease
from celery_dlq.worker.config import Config, MessageContext
from celery_dlq.worker.connections import Connections
from celery_dlq.worker.middleware import Middleware
from celery_dlq.worker.park.parking import Parking
from celery_dlq.worker.run.events import TaskEvents

logger = logging.getLogger(__name__)

#: How often a release of what the fetch held pushes the next deliveries back (seconds).
RELEASE_TICK = 0.05
#: The release's lease (ms): a releasing process that dies leaves it to another after this.
RELEASE_LOCK_MS = 5000


class WorkerBreakers(Middleware):
    """One app's breakers as one worker process sees them (``redis``: this process's connections)."""

    name = "breakers"

    def __init__(self, config: Config, redis: Callable[[], Connections], parking: Parking, events: TaskEvents,
                 clock: Callable[[], float] = time.time) -> None:
        self.config, self.redis, self.parking, self.events, self.clock = config, redis, parking, events, clock
        #: Called with ``(queue, group, task)`` after a breaker this process closed released its held deliveries.
        self.on_close: list[Callable[[str, str, str], Any]] = []
        self.hostname = ""
        self._index: list[Summary] = []
        self._read_at = float("-inf")
        self._successes: Counter[tuple[str, str]] = Counter()
        self._probes: dict[str, tuple[str, str]] = {}   # task id -> (queue, group) of the probe it runs
        #: Tasks whose policy counts failures (seen by :meth:`hold`): only their successes are counted.
        self._counting: set[str] = set()
        self._store: tuple[Connections, Breakers] | None = None
        self._lock = threading.Lock()
        self._releasing: set[tuple[str, str]] = set()   # (queue, task) this process pushes back

    def store(self) -> Breakers:
        redis = self.redis()
        if self._store is None or self._store[0] is not redis:
            self._store = (redis, Breakers(redis.client, redis.keys, self.clock, archive=redis.archive))
        return self._store[1]

    def index(self) -> list[Summary]:
        """The breakers' summaries, read again when older than ``dlq_breaker_refresh``."""
        now = self.clock()
        if now - self._read_at >= self.config.settings.breaker_refresh:
            self._read_at = now
            try:
                self._index = self.store().index()
            except Exception:
                logger.warning("celery-dlq: could not read the circuit breakers; keeping what was read",
                               exc_info=True)
        return self._index

    # -- hooks (worker/middleware.py) ---------------------------------------------

    def fetched(self, task: Any, message: Any, ctx: MessageContext, hostname: str) -> bool:
        """An open breaker holds the delivery (:meth:`hold`): not run, no attempt used."""
        return bool(ctx.policy.breaker.enabled) and self.hold(task.name, message.headers["id"], ctx)

    def delivery_failed(self, request: Any, ctx: MessageContext, failure: Mapping[str, str]) -> None:
        self.failed(request.id, ctx, dict(failure))

    def delivery_succeeded(self, request: Any) -> None:
        self.succeeded(request.task.name, request.id, request.dlq_context)

    # -- before a delivery runs -------------------------------------------------

    def hold(self, task_name: str, task_id: str, ctx: MessageContext) -> bool:
        """True when an open breaker held this delivery (parked it, acknowledged it): it must not run."""
        if not ctx.policy.breaker.enabled:
            return False
        if ctx.policy.breaker.opens_on_failures and task_name not in self._counting:
            self._counting.add(task_name)
        holding = summaries_for(self.index(), ctx.queue, task_name)
        if not holding or not task_id:
            return False
        now = self.clock()
        for summary in holding:
            if not summary.paused and now >= summary.probe_due and self._probe(summary, task_id):
                return False   # this delivery probes, or the breaker closed meanwhile
        holding = summaries_for(self._index, ctx.queue, task_name)
        if not holding:
            return False
        summary = holding[0]
        try:
            store = self.store()
            entry_id = f"{task_id}:{ctx.delivery}"   # the entry park_again makes
            due = store.hold(summary.queue, summary.group, entry_id, B.Thresholds.of(ctx.policy))
            self.parking.park_again(ctx, delay=max(0.0, due - now))
        except Exception:
            logger.exception("celery-dlq: could not hold %s[%s] for its open breaker; running it", task_name,
                             task_id)
            return False
        ctx.message.ack()
        return True

    def _probe(self, summary: Summary, task_id: str) -> bool:
        """Try to make this delivery the breaker's probe: True when it probes, or the breaker is closed now."""
        try:
            change = self.store().claim_probe(summary.queue, summary.group, task_id)
        except Exception:
            logger.warning("celery-dlq: could not claim the probe of breaker %s/%s", summary.queue, summary.group,
                           exc_info=True)
            return False
        now = change.after
        won = now is not None and now.state == B.HALF_OPEN and now.probe_id == task_id
        with self._lock:
            self._index = [s for s in self._index if (s.queue, s.group) != (summary.queue, summary.group)]
            if now is not None:
                self._index.append(Summary.of(now))
            if won:
                self._probes[task_id] = (summary.queue, summary.group)
        if won:
            self._changed(change, task_id)
        return won or now is None or now.state == B.CLOSED

    # -- outcomes ----------------------------------------------------------------

    def failed(self, task_id: str, ctx: MessageContext, failure: dict) -> None:
        """A delivery failed (parked or dead-lettered already): count it on its group's breaker."""
        probe = self._probes.pop(task_id, None)
        if not ctx.policy.breaker.opens_on_failures and probe is None:
            return
        task = ctx.envelope.task_name or ""
        group = failure_group(task, failure)
        with self._lock:
            successes = self._successes.pop((ctx.queue, task), 0)
        thresholds = B.Thresholds.of(ctx.policy)
        try:
            changes = [self.store().record_failure(ctx.queue, task, group, failure, thresholds, task_id=task_id,
                                                   successes=successes)]
            if probe is not None and probe[1] != group:   # the probe failed otherwise: its own breaker reopens
                changes.append(self.store().apply(probe[0], probe[1], lambda s: B.record_failure(
                    s, self.clock(), thresholds, task_id=task_id)))
        except Exception:
            logger.warning("celery-dlq: could not count a failure of %s on its breaker", task, exc_info=True)
            return
        for change in changes:
            self._changed(change, task_id)

    def succeeded(self, task_name: str, task_id: str, context: Callable[[], MessageContext]) -> None:
        """A delivery succeeded: counted in memory; a probe's success closes its breaker.

        A task no breaker counts returns at once (two lookups in memory).
        """
        probe = self._probes.pop(task_id, None)
        if probe is None and task_name not in self._counting:
            return
        try:
            if probe is None:
                ctx = context()
                if ctx.policy.breaker.opens_on_failures:
                    with self._lock:
                        self._successes[(ctx.queue, ctx.envelope.task_name or "")] += 1
                return
            ctx = context()
            change = self.store().record_success(probe[0], probe[1], task_id)
        except Exception:
            logger.warning("celery-dlq: could not tell the breakers of %s's success", task_id, exc_info=True)
            return
        if self._changed(change, task_id) and change.after is not None and change.after.state == B.CLOSED:
            policy = ctx.policy
            threading.Thread(target=self._release, args=(change.after, policy.breaker.release_rate,
                                                         policy.breaker.max_release_rate),
                             name="celery-dlq-breaker-release", daemon=True).start()

    def _changed(self, change: Change, task_id: str) -> bool:
        """Log, announce and index a state change; whether there was one."""
        after = change.after
        if not change.changed or after is None:
            return False
        summary = Summary.of(after)
        with self._lock:
            self._index = [s for s in self._index if (s.queue, s.group) != (summary.queue, summary.group)]
            self._index.append(summary)
        logger.warning("celery-dlq: breaker %s/%s (%s: %s) is %s", after.queue, after.group, after.task,
                       after.exception_type or "paused", after.state)
        self.events.breaker_changed(task_id, after.task, queue=after.queue, group=after.group, state=after.state,
                                    cooldown=after.cooldown)
        return True

    def _release(self, closed: B.BreakerState, rate: float, max_rate: float) -> None:
        for q, task in self.store().held_in_fetch(closed.queue, closed.task):
            self.start_release(q, task, rate, max_rate)
        try:
            n = self.store().release(self.redis().sharded, closed.queue, closed.group, rate, max_rate)
            logger.warning("celery-dlq: breaker %s/%s closed: %d held deliveries released", closed.queue,
                           closed.group, n)
        except Exception:
            logger.exception("celery-dlq: could not release the deliveries held by breaker %s/%s; they come "
                             "back at their own time", closed.queue, closed.group)
        for hook in list(self.on_close):
            try:
                hook(closed.queue, closed.group, closed.task)
            except Exception:
                logger.exception("celery-dlq: a breaker on_close hook failed")

    # -- what the fetch held ----------------------------------------------------------

    def sweep(self) -> int:
        """Release what the fetch holds for tasks no breaker holds now (closed from elsewhere, a releaser gone);
        how many (queue, task) pairs the fetch holds deliveries of."""
        store = self.store()
        held = store.held_in_fetch()
        for queue, task in held:
            if not store.holding_in_fetch(queue, task):
                policy = self.config.settings.policy_for(task, queue)
                self.start_release(queue, task, policy.breaker.release_rate, policy.breaker.max_release_rate)
        return len(held)

    def release_lease(self, queue: str, task: str) -> Lease:
        """The lease of the release of ``task`` on ``queue`` for this thread: a releasing process that dies
        leaves it to another after :data:`RELEASE_LOCK_MS`; only its owner renews or gives it up."""
        redis = self.redis()
        owner = f"{self.hostname}:{id(self)}:{threading.get_ident()}"
        return Lease(redis.client, redis.keys.breaker_release(queue, task), owner, RELEASE_LOCK_MS)

    def start_release(self, queue: str, task: str, rate: float, max_rate: float) -> None:
        """Release, in a thread, what the fetch held of ``task`` on ``queue``, unless this process does already."""
        with self._lock:
            if (queue, task) in self._releasing:
                return
            self._releasing.add((queue, task))
        threading.Thread(target=self.release_held, args=(queue, task, rate, max_rate),
                         name="celery-dlq-breaker-release-held", daemon=True).start()

    def release_held(self, queue: str, task: str, rate: float, max_rate: float) -> int:
        """Push back what the fetch held of ``task`` on ``queue`` at the rising pace of :func:`B.released_by`,
        onto the queue's lowest-priority list; stops if the breaker holds the task again. One thread at a time
        (the release's lease: :meth:`release_lease`); returns how many it pushed back."""
        store, lease = self.store(), self.release_lease(queue, task)
        target = self.config.lists.lowest(queue)
        done = 0
        try:
            if not lease.acquire():
                return 0   # another process releases them
            start = self.clock()
            while not store.holding_in_fetch(queue, task):
                due = int(B.released_by(self.clock() - start, rate, max_rate)) + 1 - done
                if due > 0:
                    pushed = store.release_held(queue, task, target, due)
                    done += pushed
                    if pushed < due:
                        break   # none left
                if not lease.renew():
                    break   # stalled past the lease, which another took: it carries on
                time.sleep(RELEASE_TICK)
            lease.release()
        except Exception:
            logger.exception("celery-dlq: could not push back what the fetch held of %s on %s; the next sweep "
                             "carries on", task, queue)
        finally:
            with self._lock:
                self._releasing.discard((queue, task))
        if done:
            logger.warning("celery-dlq: %d deliveries of %s held on %s pushed back", done, task, queue)
        return done
