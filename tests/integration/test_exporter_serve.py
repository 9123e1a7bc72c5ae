"""The exporter's HTTP server on a real redis-server."""
from __future__ import annotations

import urllib.request

from celery import Celery

from celery_dlq.exporter import serve


def test_serve_answers_on_the_address_it_bound_until_closed(redis_server, unique):
    app = Celery("served", broker=redis_server.url, set_as_current=False)
    app.conf.update(task_default_queue=f"q{unique}", dlq_key_prefix=f"s{unique}")
    running = serve(app, port=0)
    try:
        host, port = running.address
        assert host == "127.0.0.1" and port > 0
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
        assert f'celery_dlq_dead_letters{{dlq="DLQ.q{unique}",queue="q{unique}"}} 0.0' in text
    finally:
        running.close()
    assert not running.thread.is_alive()


