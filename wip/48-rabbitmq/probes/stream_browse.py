"""A RabbitMQ stream as the DLQ (issue 48, design (a)): read without consuming, by offset; what it cannot do.

Declares a stream, publishes N letters with pipelined confirms, reads them all twice from
``x-stream-offset: first`` (prefetch, manual acks) and once from an offset, and tries what a DLQ
needs and a stream refuses: basic.get, queue.purge, a requeue. Deletes the stream at the end.
"""
from __future__ import annotations

import json
import sys
import time

import amqp
from common import connect, name, publish_confirmed


def read(conn, q, offset, limit, prefetch=500):
    """Read up to ``limit`` letters from ``offset``; (seconds, offsets seen, redelivered flags seen)."""
    ch = conn.channel()
    ch.basic_qos(0, prefetch, False)   # a stream consumer must have a prefetch and ack
    got = []

    def on(m):
        got.append(m)
        ch.basic_ack(m.delivery_tag)

    started = time.perf_counter()
    tag = ch.basic_consume(q, no_ack=False, callback=on, arguments={"x-stream-offset": offset})
    while len(got) < limit:
        try:
            conn.drain_events(timeout=1)
        except TimeoutError:
            break
    ch.basic_cancel(tag)
    took = time.perf_counter() - started
    ch.close()
    return took, [m.headers["x-stream-offset"] for m in got], {m.delivery_info["redelivered"] for m in got}


def refused(q, what):
    conn = connect()   # one each: some refusals close the connection
    ch = conn.channel()
    try:
        if what == "basic.get":
            ch.basic_get(queue=q, no_ack=False)
        elif what == "queue.purge":
            ch.queue_purge(q)
        elif what == "nack requeue":
            ch.basic_qos(0, 10, False)
            got = []
            tag = ch.basic_consume(q, no_ack=False, callback=got.append, arguments={"x-stream-offset": "first"})
            conn.drain_events(timeout=2)
            ch.basic_reject(got[0].delivery_tag, requeue=True)
            ch.basic_cancel(tag)
        ch.close()
        return "accepted"
    except (amqp.exceptions.AMQPError, amqp.exceptions.RecoverableConnectionError) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        try:
            conn.close()
        except Exception:
            pass


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    conn = connect()
    q = name("stream")
    conn.channel().queue_declare(q, durable=True, auto_delete=False, arguments={"x-queue-type": "stream"})
    publish_s = publish_confirmed(conn.channel(), q, n)
    _, depth, consumers = conn.channel().queue_declare(q, durable=True, passive=True)
    first = read(conn, q, "first", n)
    second = read(conn, q, "first", n)
    middle = read(conn, q, n // 2, 10)
    out = {"n": n, "server": conn.server_properties.get("version"),
           "publish_confirmed_per_s": round(n / publish_s),
           "passive_declare_message_count": depth,
           "read1": {"s": round(first[0], 3), "count": len(first[1]), "per_s": round(len(first[1]) / first[0]),
                     "offsets": [first[1][0], first[1][-1]], "redelivered": sorted(first[2])},
           "read2_same": first[1] == second[1], "read2_s": round(second[0], 3),
           "from_offset_n_over_2": middle[1][:3],
           "basic.get": refused(q, "basic.get"),
           "nack requeue": refused(q, "nack requeue"),
           "queue.purge": refused(q, "queue.purge")}
    conn.channel().queue_delete(q)
    conn.close()
    print(json.dumps(out))
