"""``celery -A proj dlq ...``: inspect, replay and purge dead letters and parked retries; export and report.

The group is :data:`dlq` (:mod:`~celery_dlq.cli.base`); each module below
adds its verbs to it: :mod:`~celery_dlq.cli.letters` (``queues``, ``list``,
``show``, ``replay``, ``purge``; ``replay --plan`` in
:mod:`~celery_dlq.cli.plan`), :mod:`~celery_dlq.cli.groups` (``groups``),
:mod:`~celery_dlq.cli.parked` (``parked``, ``redeliver``, ``stats``),
:mod:`~celery_dlq.cli.analytics` (``export``, ``report``),
:mod:`~celery_dlq.cli.exporter` (``exporter``), :mod:`~celery_dlq.cli.web`
(``web``), :mod:`~celery_dlq.cli.policy` (``policy``), :mod:`~celery_dlq.cli.jobs` (``jobs``),
:mod:`~celery_dlq.cli.audit` (``audit``), :mod:`~celery_dlq.cli.breakers` (``breakers``, ``pause``,
``resume``); an edited replay is :mod:`~celery_dlq.cli.edit`. Printing is
:mod:`~celery_dlq.cli.output`.

rich is imported only when something is printed, pyarrow only by ``export``
and ``replay --plan``, pyspark only by ``report``, prometheus-client only by
``exporter``: Celery imports every
``celery.commands`` plugin for every command, ``celery worker`` included.
"""
# each adds its verbs to the group
from celery_dlq.cli import analytics, audit, breakers, exporter, groups, jobs, letters, parked, policy, web  # noqa: F401
from celery_dlq.cli.base import dlq

__all__ = ["dlq"]
