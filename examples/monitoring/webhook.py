"""Post every dead letter to a webhook without blocking the worker: an example receiver of ``task_dead_lettered``.

celery-dlq sends :data:`celery_dlq.task_dead_lettered` in the worker's main
process, right after the dead letter is stored and before the original
message is acknowledged. A receiver that makes an HTTP request there holds up
that worker's event loop for as long as the webhook takes. This one only
puts a small JSON document on a bounded queue; a background thread posts it:

* the queue holds at most ``max_queue`` notices; when the webhook is slower
  than the dead letters arrive, new notices are dropped and counted
  (``dropped``), never waited for;
* each POST gives up after ``timeout`` seconds; failures are counted
  (``failed``) and logged with the webhook's host only (a webhook URL's path
  is often its secret);
* the notice carries the task id and name, the queues, the reason, the
  delivery count and the exception type, never the task's arguments or
  traceback.

In the app module the workers import (``celery -A proj worker``)::

    from examples.monitoring.webhook import WebhookNotifier

    notifier = WebhookNotifier(os.environ["DLQ_WEBHOOK_URL"], max_queue=1000, timeout=5.0)
    notifier.connect()

``connect()`` also connects Celery's ``worker_shutdown`` signal, so a stopping
worker gives the queued notices up to ``timeout`` seconds to go out. The
signal's receivers are isolated (a raising receiver is logged and the message
is still dead-lettered), but this one does not raise anyway.

The dead letters themselves stay in Redis whatever happens to a notice: the
notice is for humans; alert on the exporter's metrics for what must not be
missed (``docs/monitoring.md``).
"""
from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

from celery import signals

from celery_dlq import task_dead_lettered

logger = logging.getLogger(__name__)

_STOP = object()


class WebhookNotifier:
    """POSTs a JSON notice per dead letter to ``url`` from a background thread; see the module's docstring."""

    def __init__(self, url: str, *, max_queue: int = 1000, timeout: float = 5.0,
                 headers: dict[str, str] | None = None) -> None:
        self.url, self.timeout = url, timeout
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.host = urlsplit(url).netloc.rpartition("@")[2]   # what the logs may show
        self.sent = self.failed = self.dropped = 0
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid: int | None = None

    # -- the signal side (the worker's main process): never blocks ---------------------

    def connect(self) -> WebhookNotifier:
        task_dead_lettered.connect(self.receive, weak=False)
        signals.worker_shutdown.connect(self._on_shutdown, weak=False)
        return self

    def receive(self, sender: Any = None, **kwargs: Any) -> None:
        """The ``task_dead_lettered`` receiver: queue a notice, or drop and count it when the queue is full."""
        notice = {
            "event": "task_dead_lettered",
            "task_id": kwargs.get("task_id"),
            "task_name": kwargs.get("task_name"),
            "queue": kwargs.get("original_queue"),
            "dead_letter_queue": kwargs.get("dead_letter_queue"),   # None: dropped by its policy
            "reason": kwargs.get("reason"),
            "delivery_count": kwargs.get("delivery_count"),
            "exception_type": (kwargs.get("exception") or {}).get("type"),
        }
        self._ensure_thread()
        try:
            self._queue.put_nowait(notice)
        except queue.Full:
            with self._lock:
                self.dropped += 1

    def _ensure_thread(self) -> None:
        if self._pid == os.getpid() and self._thread is not None and self._thread.is_alive():
            return
        with self._lock:
            if self._pid != os.getpid() or self._thread is None or not self._thread.is_alive():
                self._pid = os.getpid()   # a forked child does not inherit the thread: start its own
                self._thread = threading.Thread(target=self._run, name="dlq-webhook", daemon=True)
                self._thread.start()

    # -- the posting thread ------------------------------------------------------------

    def _run(self) -> None:
        while True:
            notice = self._queue.get()
            if notice is _STOP:
                return
            ok = self._post(notice)
            with self._lock:
                if ok:
                    self.sent += 1
                else:
                    self.failed += 1

    def _post(self, notice: dict) -> bool:
        request = urllib.request.Request(self.url, data=json.dumps(notice).encode(), headers=self.headers,
                                         method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                response.read()
            return True
        except (urllib.error.URLError, OSError, ValueError) as exc:   # HTTPError is a URLError; timeouts OSError
            logger.warning("dead-letter webhook on %s failed for %s[%s]: %s", self.host, notice["task_name"],
                           notice["task_id"], getattr(exc, "code", None) or type(exc).__name__)
            return False

    # -- shutdown ------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> bool:
        """Let the queued notices go out (at most ``timeout`` s, default the POST timeout); True if all went."""
        thread = self._thread
        if thread is None or not thread.is_alive() or self._pid != os.getpid():
            return self._queue.empty()
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        try:
            self._queue.put(_STOP, timeout=limit)
        except queue.Full:
            return False
        thread.join(max(0.0, deadline - time.monotonic()))
        return not thread.is_alive()

    def _on_shutdown(self, sender: Any = None, **kwargs: Any) -> None:
        self.close()
