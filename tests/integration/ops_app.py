"""The operator's app for ``celery -A tests.integration.ops_app dlq ...`` in the integration tests.

What an operator runs the ``dlq`` commands with: the workers' broker, queue
and key prefix (DLQ_TEST_BROKER, DLQ_TEST_QUEUE, DLQ_TEST_PREFIX, as
tests/integration/proj.py reads them), but no tasks and no
``celery_dlq.install``: the operator tools must work from configuration
alone. The broker has no default, so a missing variable fails the import
instead of reaching some other Redis.
"""
from __future__ import annotations

import json
import os

from celery import Celery

app = Celery("ops", broker=os.environ["DLQ_TEST_BROKER"], set_as_current=False)
app.conf.update(
    task_default_queue=os.environ["DLQ_TEST_QUEUE"],
    dlq_key_prefix=os.environ["DLQ_TEST_PREFIX"],
)
if os.environ.get("DLQ_TEST_OPS_CONF"):   # settings an operator adds (a store of its own: test_cluster.py)
    app.conf.update(json.loads(os.environ["DLQ_TEST_OPS_CONF"]))
