"""The operator API over dead-letter queues and parked retries: what ``celery dlq``, export and the tests use.

:mod:`~celery_dlq.ops.operator` (one app), :mod:`~celery_dlq.ops.queue` (one
DLQ), :mod:`~celery_dlq.ops.letters` (a dead letter and selections),
:mod:`~celery_dlq.ops.parked` (parked retries). The public import path is
:mod:`celery_dlq.manage`. Nothing here imports the worker side.
"""
