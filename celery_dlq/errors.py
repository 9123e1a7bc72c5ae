"""Every exception celery-dlq raises, under one root, so callers can catch everything of ours."""
from __future__ import annotations

from celery.exceptions import ChordError, ImproperlyConfigured


class DLQError(Exception):
    """Root of every error celery-dlq raises."""


class ConfigurationError(DLQError, ImproperlyConfigured, ValueError):
    """A policy field or a ``dlq_*`` setting is unknown or has a bad value.

    It is also Celery's :class:`~celery.exceptions.ImproperlyConfigured`, so a
    worker fails at start the way it does for Celery's own bad settings, and a
    :class:`ValueError`, which is what a bad constructor argument usually is.
    """


class StoreError(DLQError):
    """Redis could not store a parked message or a dead letter."""


class BrokerNotSupported(DLQError):
    """Dead letters are read from the broker's Redis lists: other brokers have none."""


class UnknownQueue(DLQError):
    """No dead-letter queue by that name exists or is configured."""


class ForceRequired(DLQError):
    """A destructive operation was asked for without ``force=True``."""


class PlanError(DLQError):
    """A replay plan is missing, unfinished or malformed."""


class ExportError(DLQError):
    """An export destination holds something else, or its checkpoint is unreadable."""


class MessageExpired(DLQError):
    """Raised by ``self.retry()`` when the next delivery would come after the message's ``expires``.

    The worker then dead-letters the message with reason ``expired`` (or
    drops it: policy field ``expired``) instead of parking it.
    """


class SnoozeLimitExceeded(DLQError):
    """A task snoozed more often, or for longer in all, than ``max_snoozes`` / ``max_snooze_time`` allow.

    Raised in the task instead of the snooze: the message is dead-lettered (``non_retryable``) with it.
    """


class InvalidMessage(DLQError):
    """A queue held something that cannot become a task message (the transport dead-letters it raw)."""


class ChordMemberDeadLettered(DLQError, ChordError):
    """A chord member was dead-lettered under the chord rule ``fail``: the chord's ``ChordError`` wraps this.

    Its message names the member, the DLQ and the letter (docs/workflows.md). It is a Celery
    :class:`~celery.exceptions.ChordError` too: the tasks of a group body are failed with it as it is.
    """


class ChordMemberPurged(ChordMemberDeadLettered):
    """A waiting chord's dead-lettered member was purged (or dropped by retention): the chord fails with this."""
