"""Publishing replayed letters to RabbitMQ (issue 48): what a confirmed, routed publish costs, and what it keeps.

N ~1 kB messages to a classic and a quorum queue, four ways: no confirms; a confirm waited for after
each publish (py-amqp's basic_publish_confirm); pipelined confirms (a window of 500 in flight); AMQP
transactions committing every 500. Then: a mandatory publish to an unbound routing key comes back as
basic.return; priority and headers survive the trip. Every queue is deleted at the end.
"""
from __future__ import annotations

import json
import sys
import time

from common import connect, message, name, publish_confirmed


def plain(conn, q, n):
    ch = conn.channel()
    started = time.perf_counter()
    for i in range(n):
        ch._basic_publish(message(i), exchange="", routing_key=q)
    ch.basic_qos(0, 0, False)            # a round trip: everything before it was sent
    return time.perf_counter() - started


def each_confirmed(conn, q, n):
    ch = conn.channel()
    ch.confirm_select()
    started = time.perf_counter()
    for i in range(n):
        ch.basic_publish_confirm(message(i), exchange="", routing_key=q)
    return time.perf_counter() - started


def transactions(conn, q, n, batch=500):
    ch = conn.channel()
    ch.tx_select()
    started = time.perf_counter()
    for i in range(n):
        ch._basic_publish(message(i), exchange="", routing_key=q)
        if (i + 1) % batch == 0 or i + 1 == n:
            ch.tx_commit()
    return time.perf_counter() - started


def depth(conn, q):
    return conn.channel().queue_declare(q, passive=True)[1]


def rates(conn, n, arguments):
    out = {}
    for how, fn in (("no_confirms", plain), ("confirm_each", each_confirmed),
                    ("confirm_window_500", lambda c, q, k: publish_confirmed(c.channel(), q, k)),
                    ("tx_commit_per_500", transactions)):
        q = name("pub")
        conn.channel().queue_declare(q, durable=True, auto_delete=False, arguments=arguments)
        took = fn(conn, q, n)
        time.sleep(0.2)
        out[how] = {"per_s": round(n / took), "landed": depth(conn, q)}
        conn.channel().queue_delete(q)
    return out


def returned_and_kept(conn):
    ch = conn.channel()
    returns = []
    ch.events["basic_return"].add(lambda *a: returns.append(a[:4]))
    ch.confirm_select()
    ch.basic_publish_confirm(message(1), exchange="amq.direct", routing_key=name("nowhere"), mandatory=True)
    q = name("prio")
    ch.queue_declare(q, durable=True, auto_delete=False, arguments={"x-max-priority": 9})
    ch.basic_publish_confirm(message(7, priority=7, headers={"x-dlq-replay-count": 1}), exchange="", routing_key=q)
    got = ch.basic_get(queue=q, no_ack=True)
    ch.queue_delete(q)
    return {"mandatory_unroutable_returned": [str(r[0]) for r in returns],
            "priority_kept": got.properties.get("priority"),
            "headers_kept": {k: got.headers[k] for k in ("id", "x-dlq-reason", "x-dlq-replay-count")}}


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    conn = connect()
    out = {"n": n, "server": conn.server_properties.get("version"),
           "classic": rates(conn, n, {}), "quorum": rates(conn, n, {"x-queue-type": "quorum"}),
           **returned_and_kept(conn)}
    conn.close()
    print(json.dumps(out))
