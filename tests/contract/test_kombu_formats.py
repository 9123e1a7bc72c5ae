"""What celery-dlq copies of kombu's Redis formats is still kombu's, on the installed kombu.

* A queue's priority lists: :class:`celery_dlq.storage.keys.QueueLists` names them without a channel (the
  operator, the mover, dead-lettering) as kombu's ``Channel._q_for_pri`` does, for priorities 0 to 9 with
  default and custom ``priority_steps``, ``sep`` and ``global_keyprefix``; and kombu publishes to them.
* A message: ``fetch.lua`` takes what kombu publishes (it reads ``properties.delivery_tag`` and
  ``properties.delivery_info``); a message it gives back is delivered again as kombu's own restore
  delivers one (``Channel._do_restore_message``: ``redelivered`` in the headers and the delivery info),
  to the list kombu would restore it to, and kombu's own fetch reads it (a worker on the fallback).
  celery-dlq's in-flight records are its own format (list and element); kombu's ``unacked`` hash and
  its ``[payload, exchange, routing_key]`` records are never written by celery-dlq's fetch.
"""
from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from kombu import Connection, Consumer, Producer, Queue
from kombu.transport import redis as kombu_redis

from celery_dlq.storage.keys import PRIORITY_STEPS, SEP, QueueLists
from celery_dlq.worker.fetch.transport import Transport
from celery_dlq.worker.fetch.setup import OPTION_FETCH, FetchContext, hand_over

pytestmark = pytest.mark.contract

OPTIONS = [
    {},
    {"priority_steps": [0, 5]},
    {"priority_steps": list(range(10))},
    {"priority_steps": [3, 6, 9]},                       # no step 0: kombu puts 0 to 2 on the last list
    {"sep": ":"},
    {"global_keyprefix": "tenant:"},
    {"global_keyprefix": "t:", "priority_steps": [0, 4, 8], "sep": "|"},
]


def kombus_list(options: dict, queue: str, priority: int) -> str:
    """The list kombu's Channel._q_for_pri names, with the channel's options (no connection made)."""
    channel = object.__new__(kombu_redis.Channel)
    channel.priority_steps = options.get("priority_steps", kombu_redis.Channel.priority_steps)
    channel.sep = options.get("sep", kombu_redis.Channel.sep)
    return options.get("global_keyprefix", "") + kombu_redis.Channel._q_for_pri(channel, queue, priority)


def test_our_defaults_are_kombus():
    assert (tuple(kombu_redis.Channel.priority_steps), kombu_redis.Channel.sep) == (PRIORITY_STEPS, SEP)


@pytest.mark.parametrize("options", OPTIONS, ids=json.dumps)
def test_our_priority_list_names_are_kombus_q_for_pri(options):
    lists = QueueLists.of(options)
    assert [lists.key("orders", p) for p in range(10)] == [kombus_list(options, "orders", p) for p in range(10)]


@pytest.mark.integration
@pytest.mark.parametrize("options", OPTIONS, ids=json.dumps)
def test_kombu_publishes_each_priority_to_the_list_we_name(redis_server, unique, options):
    queue, client = f"prio{unique}", redis.Redis.from_url(redis_server.url)
    try:
        with Connection(redis_server.url, transport="redis", transport_options=options) as conn:
            producer = Producer(conn)
            for priority in range(10):
                producer.publish({"p": priority}, routing_key=queue, priority=priority, serializer="json")
        lists = QueueLists.of(options)
        found = {key.decode(): client.llen(key) for key in client.keys(f"*{queue}*")}
        expected: dict[str, int] = {}
        for priority in range(10):
            expected[lists.key(queue, priority)] = expected.get(lists.key(queue, priority), 0) + 1
        assert found == expected
    finally:
        client.delete(*client.keys(f"*{queue}*") or ["-"])
        client.close()


def consume_twice(url: str, first: Any, second: Any, queue: str) -> tuple[list[dict], list[str], int]:
    """Publish with kombu's transport, take it with ``first`` and requeue it, take it again with ``second``;
    the raw elements delivered, the lists holding the message after the requeue, and how many records
    kombu's ``unacked`` hash held while ``first`` held the message."""
    options = {"priority_steps": [0, 5], "sep": ":p:", "global_keyprefix": "gk:",
               OPTION_FETCH: hand_over(FetchContext(key_prefix=f"fmt{queue}", listener=False), queue)}
    raw: list[dict] = []
    client = redis.Redis.from_url(url)
    with Connection(url, transport="redis", transport_options=options) as conn:
        Producer(conn).publish({"a": 1}, routing_key=queue, headers={"h": 1}, priority=7, serializer="json")
    with Connection(url, transport=first, transport_options=options) as conn:
        taken = []
        with Consumer(conn, [Queue(queue, routing_key=queue)], callbacks=[lambda body, m: taken.append(m)],
                      accept=["json"]):
            conn.drain_events(timeout=10)
            raw.append(dict(taken[0]._raw))
            unacked = client.hlen("gk:unacked")
            taken[0].requeue()
    holding = sorted(key.decode() for key in client.keys(f"gk:{queue}*"))
    with Connection(url, transport=second, transport_options=options) as conn:
        taken = []
        with Consumer(conn, [Queue(queue, routing_key=queue)], callbacks=[lambda body, m: taken.append(m)],
                      accept=["json"]):
            conn.drain_events(timeout=10)
            raw.append(dict(taken[0]._raw))
            taken[0].ack()
    client.delete(*client.keys("gk:*"), *client.keys(f"{{fmt{queue}}}*"), "-")   # kombu's records, our in-flight
    client.close()
    return raw, holding, unacked


@pytest.mark.integration
def test_a_message_we_give_back_is_delivered_again_as_kombus_restore_delivers_it(redis_server, unique):
    base = redis_server.url.rsplit("/", 1)[0]
    kombu_raw, kombu_where, kombu_unacked = consume_twice(f"{base}/2", "redis", "redis", f"f{unique}")
    our_raw, our_where, our_unacked = consume_twice(f"{base}/3", Transport, Transport, f"f{unique}")
    assert our_where == kombu_where == [f"gk:f{unique}:p:5"]   # priority 7 with steps [0, 5]
    assert (kombu_unacked, our_unacked) == (1, 0)
    for kombus, ours in zip(kombu_raw, our_raw):
        kombus["properties"].pop("delivery_tag")
        ours["properties"].pop("delivery_tag")
        assert ours == kombus
    assert our_raw[1]["headers"]["redelivered"] is True
    assert our_raw[1]["properties"]["delivery_info"]["redelivered"] is True


@pytest.mark.integration
def test_kombus_own_fetch_reads_a_message_we_gave_back(redis_server, unique):
    raw, _, _ = consume_twice(redis_server.url.rsplit("/", 1)[0] + "/4", Transport, "redis", f"k{unique}")
    assert raw[1]["body"] == raw[0]["body"] and raw[1]["headers"]["h"] == 1
    assert raw[1]["properties"]["delivery_tag"] == raw[0]["properties"]["delivery_tag"]
