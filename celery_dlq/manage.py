"""The operator API, from one import: ``from celery_dlq.manage import Operator, Filter, TaskIds``.

The code lives in :mod:`celery_dlq.ops`; this module names its public parts.
"""
from __future__ import annotations

from celery_dlq.errors import BrokerNotSupported, ForceRequired, UnknownQueue
from celery_dlq.ops.groups import FailureGroup, GroupReport
from celery_dlq.ops.letters import DeadLetter, Filter, Selector, TaskIds
from celery_dlq.ops.operator import Operator, QueueInfo
from celery_dlq.ops.parked import ParkedRetries, ParkedRetry
from celery_dlq.ops.queue import DeadLetterQueue, Outcome
from celery_dlq.storage.groups import GroupStats

__all__ = [
    "BrokerNotSupported", "DeadLetter", "DeadLetterQueue", "FailureGroup", "Filter", "ForceRequired", "GroupReport",
    "GroupStats", "Operator", "Outcome",
    "ParkedRetries", "ParkedRetry", "QueueInfo", "Selector", "TaskIds", "UnknownQueue",
]
