"""The operator API over dead-letter queues and parked retries: what ``celery dlq``, the dashboard and the exporter use.

The one public import path (``celery_dlq.manage`` is its deprecated alias)::

    from celery_dlq.ops import Operator, Filter, Selection, TaskIds

:mod:`~celery_dlq.ops.operator` (one app), :mod:`~celery_dlq.ops.queue` (one
DLQ), :mod:`~celery_dlq.ops.letters` (a dead letter and selectors),
:mod:`~celery_dlq.ops.selection` (selections from options or query strings),
:mod:`~celery_dlq.ops.plan` (replaying a report's plan),
:mod:`~celery_dlq.ops.parked` (parked retries). Nothing here imports the
worker side.
"""
from __future__ import annotations

from celery_dlq.errors import BrokerNotSupported, ForceRequired, PlanError, UnknownQueue
from celery_dlq.ops.backend import Size
from celery_dlq.ops.breakers import BreakerControls, BreakerRow
from celery_dlq.ops.groups import FailureGroup, GroupReport
from celery_dlq.ops.letters import DeadLetter, Filter, Selector, TaskIds
from celery_dlq.ops.operator import Operator, QueueInfo
from celery_dlq.ops.parked import Overdue, ParkedRetries, ParkedRetry
from celery_dlq.ops.plan import NotInPlan, PlanReplay
from celery_dlq.ops.queue import DeadLetterQueue, Outcome, ReplayIntoItself
from celery_dlq.ops.selection import PARAMS, BadSelection, NothingSelected, Selection, parse_filter
from celery_dlq.storage.groups import GroupStats

__all__ = [
    "PARAMS", "BadSelection", "BreakerControls", "BreakerRow",
    "BrokerNotSupported", "DeadLetter", "DeadLetterQueue", "FailureGroup", "Filter",
    "ForceRequired", "GroupReport", "GroupStats", "NotInPlan", "NothingSelected", "Operator", "Outcome", "Overdue",
    "ParkedRetries", "ParkedRetry", "PlanError", "PlanReplay", "QueueInfo", "ReplayIntoItself", "Selection",
    "Selector", "Size", "TaskIds", "UnknownQueue", "parse_filter",
]
