"""Everything that runs inside ``celery worker``.

:mod:`~celery_dlq.worker.install` builds the :class:`~celery_dlq.worker.runtime.Runtime`
and adds the consumer bootsteps (:mod:`~celery_dlq.worker.steps`,
:mod:`~celery_dlq.worker.mover`); :mod:`~celery_dlq.worker.task` (the child
process), :mod:`~celery_dlq.worker.strategy` and
:mod:`~celery_dlq.worker.request` (the main process) take a failing message
over; :mod:`~celery_dlq.worker.deadletter` and
:mod:`~celery_dlq.worker.retention` write and trim DLQs, and
:mod:`~celery_dlq.worker.recorder` records every dead letter and drop.
"""
