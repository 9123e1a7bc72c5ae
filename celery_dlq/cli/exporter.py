"""The verb that serves Prometheus metrics: ``exporter``.

prometheus-client is imported when the verb runs, not when Celery loads the
``dlq`` group (which it does for every command, ``celery worker`` included).
"""
from __future__ import annotations

import logging
import signal
import threading

import click
from celery.bin.base import CeleryCommand

from celery_dlq.cli.base import Failure, dlq

DEFAULT_PORT = 9808   # celery_dlq.exporter.DEFAULT_PORT, kept here so --help imports nothing


@dlq.command(cls=CeleryCommand)
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
              help="TCP port of /metrics (0: any free port).")
@click.option("--bind", default="127.0.0.1", show_default=True,
              help="Address to listen on; 0.0.0.0 for every interface (the metrics name queues and tasks).")
@click.pass_context
def exporter(ctx: click.Context, port: int, bind: str) -> None:
    """Serve Prometheus metrics of the DLQs, parked retries and counters on http://BIND:PORT/metrics.

    Redis is read at each scrape, so one exporter covers every worker; when
    Redis cannot be read the exporter keeps serving celery_dlq_redis_up 0.
    """
    from celery_dlq.exporter import serve

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="[%(asctime)s: %(levelname)s] %(message)s")
    try:
        running = serve(ctx.obj.app, port=port, bind=bind)
    except OSError as exc:
        raise Failure(f"cannot listen on {bind}:{port}: {exc}") from None
    host, bound = running.address
    logging.getLogger(__name__).info("celery-dlq exporter: serving http://%s:%s/metrics, reading Redis at %s",
                                     host, bound, running.collector.where)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        running.close()
