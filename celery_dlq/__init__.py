"""celery-dlq: redelivery policies and dead-letter queues for Celery on Redis.

Quick start::

    from celery import Celery
    import celery_dlq

    app = Celery("proj", broker="redis://localhost:6379/0")
    celery_dlq.install(app)

    @app.task(base=celery_dlq.RedeliveryTask,
              redelivery_policy={"redelivery_delay": 5, "max_delivery_attempts": 3})
    def charge(order_id): ...
"""
from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from celery_dlq.breaker_policy import BreakerPolicy
from celery_dlq.errors import ConfigurationError, DLQError, StoreError
from celery_dlq.headers import Reason
from celery_dlq.policy import RedeliveryPolicy
from celery_dlq.signals import task_dead_lettered, task_redelivery_scheduled

if TYPE_CHECKING:
    from celery_dlq.worker.features.snooze import Snooze
    from celery_dlq.worker.install import install, resolve_policy
    from celery_dlq.worker.run.task import Redeliver, RedeliveryTask
    from celery_dlq.worker.runtime import delivery_count

__version__ = "0.1.0"

#: The worker-side names, imported on first use (PEP 562): ``import celery_dlq.ops``
#: or the ``celery dlq`` command loads no worker module.
_WORKER = {
    "install": "celery_dlq.worker.install",
    "resolve_policy": "celery_dlq.worker.install",
    "delivery_count": "celery_dlq.worker.runtime",
    "Redeliver": "celery_dlq.worker.run.task",
    "RedeliveryTask": "celery_dlq.worker.run.task",
    "Snooze": "celery_dlq.worker.features.snooze",
}


def __getattr__(name: str) -> Any:
    try:
        module = _WORKER[name]
    except KeyError:
        raise AttributeError(f"module 'celery_dlq' has no attribute {name!r}") from None
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)

__all__ = [
    "BreakerPolicy",
    "ConfigurationError",
    "DLQError",
    "Reason",
    "Redeliver",
    "RedeliveryPolicy",
    "RedeliveryTask",
    "Snooze",
    "StoreError",
    "__version__",
    "delivery_count",
    "install",
    "resolve_policy",
    "task_dead_lettered",
    "task_redelivery_scheduled",
]
