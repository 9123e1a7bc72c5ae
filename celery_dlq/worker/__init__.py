"""Everything that runs inside ``celery worker``.

:mod:`~celery_dlq.worker.install` builds the :class:`~celery_dlq.worker.runtime.Runtime`
and adds the consumer bootsteps (:mod:`~celery_dlq.worker.steps`,
:mod:`~celery_dlq.worker.park.mover`); :mod:`~celery_dlq.worker.run.task` (the child
process), :mod:`~celery_dlq.worker.run.strategy` and
:mod:`~celery_dlq.worker.run.request` (the main process) take a failing message
over; :mod:`~celery_dlq.worker.deadletter.dead_letterer` and
:mod:`~celery_dlq.worker.deadletter.retention` write and trim DLQs, and
:mod:`~celery_dlq.worker.deadletter.recorder` records every dead letter and drop.
"""
