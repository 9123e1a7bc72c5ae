"""Consume-and-requeue browsing of a DLQ on RabbitMQ: what it changes (issue 48, design (c)).

1. Classic queue, 10 letters: the management UI's "Get messages" one at a time with requeue
   returns the head every time (and sets redelivered); holding 5 then nack-requeue restores order.
2. Two browsers at once: the second sees only what the first does not hold.
3. Quorum queue with x-delivery-limit=2 and no dead-letter exchange: every browse counts a
   delivery (x-delivery-count) and the third browse drops the letter.
4. Time to browse-and-requeue N letters (hold all, nack multiple requeue) on a classic queue.
"""
from __future__ import annotations

import json
import sys
import time

from common import connect, nack, name, publish_confirmed


def order(ch, queue):
    got, last = [], None
    while (m := ch.basic_get(queue=queue, no_ack=False)) is not None:
        got.append((m.headers["i"], m.delivery_info["redelivered"], m.headers.get("x-delivery-count")))
        last = m
    if last is not None:
        nack(ch, last.delivery_tag)
    return got


def classic_one_at_a_time(conn):
    ch = conn.channel()
    q = name("classic")
    ch.queue_declare(q, durable=True, auto_delete=False)
    publish_confirmed(conn.channel(), q, 10)
    heads = []
    for _ in range(3):                      # "Get messages", count 1, "Nack message requeue true"
        m = ch.basic_get(queue=q, no_ack=False)
        heads.append((m.headers["i"], m.delivery_info["redelivered"]))
        ch.basic_reject(m.delivery_tag, requeue=True)
    held = [ch.basic_get(queue=q, no_ack=False) for _ in range(5)]   # count 5: held, then requeued
    nack(ch, held[-1].delivery_tag)
    after = order(ch, q)
    ch.queue_delete(q)
    return {"one_at_a_time_heads": heads, "after_holding_5_then_requeue": after}


def two_browsers(conn):
    a, b = conn.channel(), conn.channel()
    q = name("classic2")
    a.queue_declare(q, durable=True, auto_delete=False)
    publish_confirmed(conn.channel(), q, 10)
    held = [a.basic_get(queue=q, no_ack=False) for _ in range(5)]   # browser A on page 1
    seen_by_b = order(b, q)                                          # browser B lists "everything"
    nack(a, held[-1].delivery_tag)
    a.queue_delete(q)
    return {"browser_b_saw": [i for i, _, _ in seen_by_b], "of": 10}


def quorum_delivery_limit(conn):
    ch = conn.channel()
    q = name("quorum")
    ch.queue_declare(q, durable=True, auto_delete=False,
                     arguments={"x-queue-type": "quorum", "x-delivery-limit": 2})
    publish_confirmed(conn.channel(), q, 3)
    browses = []
    for _ in range(4):
        browses.append(order(ch, q))
        time.sleep(0.2)
    _, depth, _ = ch.queue_declare(q, passive=True)
    ch.queue_delete(q)
    return {"browses": browses, "depth_after": depth}


def timing(conn, n):
    ch = conn.channel()
    q = name("classicn")
    ch.queue_declare(q, durable=True, auto_delete=False)
    publish_confirmed(conn.channel(), q, n)
    ch.basic_qos(0, 0, False)
    started = time.perf_counter()
    got = []
    tag = ch.basic_consume(q, no_ack=False, callback=got.append)
    while len(got) < n:
        conn.drain_events(timeout=10)
    ch.basic_cancel(tag)      # first: a live consumer takes requeued letters straight back
    nack(ch, got[-1].delivery_tag)
    read_s = time.perf_counter() - started
    immediately = order(conn.channel(), q)      # another reader right after the requeue
    time.sleep(1.0)
    again = order(conn.channel(), q)
    ch.queue_delete(q)
    return {"n": n, "browse_and_requeue_s": round(read_s, 3),
            "order_kept": [i for i, _, _ in again] == list(range(n)), "read_back": len(again),
            "read_back_immediately": len(immediately),
            "first_out_of_place": next(([k, i] for k, (i, _, _) in enumerate(again) if i != k), None),
            "redelivered_after": sum(1 for _, r, _ in again if r)}


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    conn = connect()
    out = {"classic": classic_one_at_a_time(conn), "two_browsers": two_browsers(conn),
           "quorum_limit_2": quorum_delivery_limit(conn), "timing": timing(conn, n),
           "server": conn.server_properties.get("version")}
    conn.close()
    print(json.dumps(out, default=str))
