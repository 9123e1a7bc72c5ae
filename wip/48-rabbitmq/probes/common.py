"""Shared helpers of the issue-48 probes: a py-amqp connection to the local RabbitMQ, unique queue names."""
from __future__ import annotations

import os
import time
import uuid

import amqp

URL = dict(host="127.0.0.1:5672", userid="guest", password="guest", virtual_host="/")
BODY = b'[[1], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]' + b" " * 900  # ~1 kB


def connect() -> amqp.Connection:
    conn = amqp.Connection(**URL)
    conn.connect()
    return conn


def name(kind: str) -> str:
    return f"probe48.{kind}.{os.getpid()}.{uuid.uuid4().hex[:6]}"


def message(i: int, **props) -> amqp.Message:
    headers = {"id": f"task-{i}", "task": "proj.fails", "x-dlq-reason": "max_delivery_attempts", "i": i}
    headers.update(props.pop("headers", {}))
    return amqp.Message(BODY, content_type="application/json", content_encoding="utf-8",
                        delivery_mode=2, application_headers=headers, **props)


def publish_confirmed(ch, queue: str, n: int, window: int = 500, **props) -> float:
    """Publish n messages to queue with pipelined publisher confirms (a window in flight); seconds taken."""
    acked = [0]

    def on_ack(tag, multiple):
        acked[0] = tag if multiple else max(acked[0], tag)

    ch.confirm_select()
    ch.events["basic_ack"].add(on_ack)
    started = time.perf_counter()
    for i in range(n):
        ch._basic_publish(message(i, **props), exchange="", routing_key=queue)
        while i + 1 - acked[0] >= window:
            ch.connection.drain_events(timeout=10)
    while acked[0] < n:
        ch.connection.drain_events(timeout=10)
    return time.perf_counter() - started


def nack(ch, tag: int, multiple: bool = True, requeue: bool = True) -> None:
    """basic.nack (py-amqp has no method for it): every unacked delivery up to ``tag`` back, requeued."""
    ch.send_method(amqp.spec.Basic.Nack, "Lbb", (tag, multiple, requeue))
