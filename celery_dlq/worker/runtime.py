"""One app's celery-dlq parts inside a worker, built together once by ``install()``.

:class:`Runtime` only makes the parts and holds them; each has one job:

* ``config`` (:class:`~celery_dlq.worker.config.Config`): the settings, each
  task's policy, each consumed message's context; no Redis;
* ``redis`` (:class:`~celery_dlq.worker.connections.PerProcess`): this
  process's :class:`~celery_dlq.worker.connections.Connections` (clients,
  store, counters, dead-letterer, chords), made on first use in each process;
* ``parking`` (:class:`~celery_dlq.worker.park.parking.Parking`): the park of a failed message;
* ``consumer`` and ``events``: the worker's consumer (bound by a bootstep)
  and the task events sent through it;
* ``fetch_moved``: what this process's fetches moved, until flushed;
* ``chain`` (:class:`~celery_dlq.worker.middleware.Chain`): the features of
  the delivery path, in order (circuit breakers, delivery counting,
  in-flight records, chord rules, snooze), each called at the events of a delivery it implements.

The bootsteps (:mod:`celery_dlq.worker.steps`) are handed the runtime and
pass each component only the parts it uses. The classes Celery instantiates
itself (the Task base, its Request and Strategy) find it on their app with
:func:`runtime_of`: the one lookup.
"""
from __future__ import annotations

import threading
from typing import Any

from celery_dlq import headers as H
from celery_dlq.worker.config import Config
from celery_dlq.worker.connections import Connections, PerProcess
from celery_dlq.worker.consumer_link import ConsumerLink
from celery_dlq.worker.features.breaker import WorkerBreakers
from celery_dlq.worker.features.chords import ChordMembers, ChordRules
from celery_dlq.worker.features.delivery_counts import DeliveryCounts
from celery_dlq.worker.features.inflight_records import InFlightRecords
from celery_dlq.worker.features.redrive import AutoRedrive
from celery_dlq.worker.features.snooze import Snoozing
from celery_dlq.worker.fetch.moves import MoveTally
from celery_dlq.worker.middleware import Chain
from celery_dlq.worker.park.parking import Parking
from celery_dlq.worker.run.events import TaskEvents

#: The app attribute holding its runtime.
ATTR = "_celery_dlq"


class Runtime:
    """celery-dlq's parts for one app (see the module docstring)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        #: Whether ``install()`` added the bootsteps already.
        self.installed = False
        self.config = Config(app)
        self.consumer = ConsumerLink()
        self.events = TaskEvents(app, self.consumer)
        self.redis: PerProcess[Connections] = PerProcess(lambda: Connections(app, self.config.settings, self.events))
        self.parking = Parking(self.config, self.redis, self.events, lambda: self.chain)
        #: Circuit breakers (worker/features/breaker.py); a close starts the group's redrive where the policy asks.
        self.breakers = WorkerBreakers(self.config, self.redis, self.parking, self.events)
        self.breakers.on_close.append(AutoRedrive(app, self.config))
        self.fetch_moved = MoveTally()
        #: Set while this worker holds the mover lease (the Mover step's heartbeat): shared work such as taking
        #: over redrive jobs (``worker/leader/jobs.py``) is done by the holder alone, so it costs the same however many.
        self.mover_holder = threading.Event()
        #: The hook chain (worker/middleware.py), in the order of docs/architecture.md's table: a breaker's hold
        #: comes before a delivery is counted (a held delivery uses no attempt).
        self.chain = Chain((self.breakers, DeliveryCounts(self.redis, lambda: self.chain), InFlightRecords(),
                            ChordRules(self._chords), Snoozing(self.config, self.parking)))

    def _chords(self) -> ChordMembers:
        """This process's chord members."""
        return self.redis().chords


def runtime_of(app: Any) -> Runtime:
    """The app's runtime, made on first use (``install()`` makes it and adds the worker bootsteps)."""
    runtime = app.__dict__.get(ATTR)
    if runtime is None:
        runtime = Runtime(app)
        setattr(app, ATTR, runtime)
    return runtime


def delivery_count(request: Any) -> int:
    """This delivery's number inside a task (1 on the first delivery).

    ``request`` is ``task.request``; the count is the persisted one when
    ``persist_delivery_count_before_delivery`` is on, else the header's.
    """
    getter = request.get if hasattr(request, "get") else (lambda k, d=None: getattr(request, k, d))
    return H.delivery_count_of({H.DELIVERY_COUNT: getter(H.DELIVERY_COUNT, None)})
