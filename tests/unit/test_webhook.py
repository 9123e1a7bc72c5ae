"""The example webhook receiver (examples/monitoring/webhook.py) posting to a real local HTTP server.

With a real worker dead-lettering a task: tests/integration/test_webhook.py.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from celery_dlq import task_dead_lettered
from examples.monitoring.webhook import WebhookNotifier


class Sink:
    """A real HTTP server on 127.0.0.1: records each POST's path, headers and JSON body; can be made to hang."""

    def __init__(self) -> None:
        self.posts: list[dict] = []
        self.arrived = threading.Condition()
        self.release = threading.Event()
        self.release.set()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:   # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with sink.arrived:
                    sink.posts.append({"path": self.path, "headers": dict(self.headers), "body": body})
                    sink.arrived.notify_all()
                sink.release.wait(30)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/s3cr3t"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def wait_for(self, n: int, timeout: float = 10) -> list[dict]:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.posts) >= n, timeout), f"{len(self.posts)} of {n} posts"
            return list(self.posts)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sink():
    started = Sink()
    yield started
    started.close()


@pytest.fixture
def notifiers():
    made: list[WebhookNotifier] = []
    yield made
    for notifier in made:
        task_dead_lettered.disconnect(notifier.receive)
        notifier.close(timeout=5)


def dead_lettered(n: int, **overrides) -> None:
    """What the dead-letterer sends (celery_dlq.worker.deadletter.dead_letterer)."""
    fields = dict(task_id=f"id-{n}", task_name="shop.charge", original_queue="orders",
                  dead_letter_queue="DLQ.orders", reason="max_delivery_attempts",
                  exception={"type": "ValueError", "message": "card 4242 declined", "traceback": "Traceback..."},
                  delivery_count=3)
    fields.update(overrides)
    task_dead_lettered.send(sender=fields["task_name"], **fields)


def test_each_dead_letter_is_posted_as_json(sink, notifiers):
    notifier = WebhookNotifier(sink.url, headers={"Authorization": "Bearer t"}).connect()
    notifiers.append(notifier)
    dead_lettered(1)
    dead_lettered(2, dead_letter_queue=None, reason="non_retryable")
    first, second = sink.wait_for(2)
    assert first["path"] == "/hooks/s3cr3t"
    assert first["headers"]["Content-Type"] == "application/json" and first["headers"]["Authorization"] == "Bearer t"
    assert first["body"] == {"event": "task_dead_lettered", "task_id": "id-1", "task_name": "shop.charge",
                             "queue": "orders", "dead_letter_queue": "DLQ.orders", "reason": "max_delivery_attempts",
                             "delivery_count": 3, "exception_type": "ValueError"}
    assert (second["body"]["dead_letter_queue"], second["body"]["reason"]) == (None, "non_retryable")
    assert notifier.close(timeout=5)
    assert (notifier.sent, notifier.failed, notifier.dropped) == (2, 0, 0)


def test_a_slow_webhook_never_blocks_the_sender_overflow_is_dropped_and_counted(sink, notifiers):
    notifier = WebhookNotifier(sink.url, max_queue=2, timeout=20).connect()
    notifiers.append(notifier)
    sink.release.clear()           # the webhook hangs on every request
    dead_lettered(1)
    sink.wait_for(1)               # notice 1 is in flight, held by the hanging webhook
    for n in range(2, 6):          # 2 and 3 fill the queue; 4 and 5 find it full
        dead_lettered(n)           # (were a send to wait for the webhook, this would never return)
    assert notifier.dropped == 2
    sink.release.set()
    posted = sink.wait_for(3)
    assert [post["body"]["task_id"] for post in posted] == ["id-1", "id-2", "id-3"]
    assert notifier.close(timeout=5)
    assert (notifier.sent, notifier.dropped) == (3, 2)


def test_a_webhook_past_its_timeout_is_counted_failed_and_the_next_goes_out(sink, notifiers, caplog):
    notifier = WebhookNotifier(sink.url, timeout=0.5).connect()
    notifiers.append(notifier)
    sink.release.clear()
    with caplog.at_level(logging.WARNING, logger="examples.monitoring.webhook"):
        dead_lettered(1)
        sink.wait_for(1)
        # The webhook still hangs; the client gives up on its own after 0.5 s.
        assert wait_until(lambda: notifier.failed == 1, timeout=10)
        sink.release.set()
        dead_lettered(2)
        assert notifier.close(timeout=10)
    assert (notifier.sent, notifier.failed) == (1, 1)
    assert "failed for shop.charge[id-1]: TimeoutError" in caplog.text
    assert [post["body"]["task_id"] for post in sink.posts] == ["id-1", "id-2"]


def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_an_unreachable_webhook_is_logged_without_its_secret_path(notifiers, caplog):
    from tests.redis_server import free_port
    notifier = WebhookNotifier(f"http://user:pw@127.0.0.1:{free_port()}/hooks/s3cr3t", timeout=2).connect()
    notifiers.append(notifier)
    with caplog.at_level(logging.WARNING, logger="examples.monitoring.webhook"):
        dead_lettered(1)
        assert notifier.close(timeout=5)
    assert (notifier.sent, notifier.failed) == (0, 1)
    assert "dead-letter webhook on 127.0.0.1:" in caplog.text and "shop.charge[id-1]" in caplog.text
    assert "s3cr3t" not in caplog.text and "pw" not in caplog.text
