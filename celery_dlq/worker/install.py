"""``install(app)``: enable celery-dlq on an app; the public lookups that go with it."""
from __future__ import annotations

from typing import Any

from celery_dlq.policy import RedeliveryPolicy
from celery_dlq.worker.runtime import Runtime, runtime_of
from celery_dlq.worker.steps import bound_steps


def install(app: Any, validate: bool = True) -> Runtime:
    """Enable celery-dlq on ``app``: idempotent; adds the worker bootsteps, validates settings.

    Settings are validated now (unless ``validate=False``: binding a
    ``RedeliveryTask`` installs that way, since the app may not be configured
    yet), and always again when a worker starts, so a bad setting stops the
    worker with the setting's name. The runtime is handed to the bootsteps;
    nothing connects to Redis until a worker uses it.
    """
    runtime = runtime_of(app)
    if not runtime.installed:
        runtime.installed = True
        for step in bound_steps(runtime):
            app.steps["consumer"].add(step)
        # the hook chain's features hear of the finalized app (chord rules wrap chord_unlock: worker/features/chords.py)
        if app.finalized:
            runtime.chain.finalized(app)
        else:
            app.on_after_finalize.connect(lambda sender, **_: runtime.chain.finalized(sender), weak=False)
    if validate:
        runtime.config.validate()
    return runtime


def resolve_policy(app: Any, task_name: str, queue: str | None) -> RedeliveryPolicy:
    """The effective :class:`RedeliveryPolicy` of a task on a queue (cached per pair)."""
    return install(app, validate=False).config.policy(task_name, queue)
