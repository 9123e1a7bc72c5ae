"""An operator's process on a real redis-server installs nothing of the worker."""
from __future__ import annotations

import uuid

from celery import Celery


def test_the_operator_api_installs_no_worker_bootsteps(redis_server):
    from celery_dlq.ops import Operator

    app = Celery("ops-only", broker=redis_server.url, set_as_current=False)
    app.conf.task_default_queue = queue = f"ops-only-{uuid.uuid4().hex}"   # the server is shared with other tests
    operator = Operator(app)
    rows = {info.name: info.dead_letters for info in operator.queues()}
    assert rows[f"DLQ.{queue}"] == 0                                       # configured, empty
    assert app.steps["consumer"] == set()
    assert "_celery_dlq" not in app.__dict__


