"""Trends: the minute and hour rings (bounded whatever the traffic), what writes them, what the overview and the
parked page draw from them. fakeredis and the real redis-server; a fake clock, no sleeps."""
from __future__ import annotations

import re
from html import unescape

import fakeredis
import pytest
from celery import Celery

from celery_dlq.ops import Operator
from celery_dlq.storage import trends
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.scripts import Scripts
from celery_dlq.storage.sharding import Shards
from celery_dlq.storage.shards import ShardedStore
from celery_dlq.web import create_app
from celery_dlq.worker.deadletter.dead_letterer import DeadLetterer
from tests.integration.test_group_index import World
from tests.unit.test_web import client

T0 = 1_800_000_000.0   # a whole hour: 500,000 hours


@pytest.fixture
def any_redis(emptied_any_redis):
    return emptied_any_redis


def count(client, keys, at, n=1, names=("dead_lettered|queue|orders",)):
    trends.count(client, Scripts(client), keys, list(names), n, at)


def test_rings_keep_the_last_hour_per_minute_and_the_last_week_per_hour(any_redis, unique):
    keys = Keys(f"t{unique}")
    count(any_redis, keys, T0, 2)
    count(any_redis, keys, T0 + 30, 1)          # the same minute
    count(any_redis, keys, T0 + 61, 5)          # the next minute
    count(any_redis, keys, T0 + 3600, 7)        # an hour later: reuses minute slot 0, a new hour slot
    seen = trends.read(any_redis, [keys], T0 + 3600 + 61)
    key = ("dead_lettered", "queue", "orders")
    assert seen.minutes[key][-2:] == [7, 0] and sum(seen.minutes[key]) == 7   # the old minute 0 is gone
    assert seen.hours[key][-2:] == [8, 7] and sum(seen.hours[key]) == 15
    later = trends.read(any_redis, [keys], T0 + 8 * 24 * 3600)             # a week on: nothing left to show
    assert sum(later.hours.get(key, [0])) == 0 and sum(later.minutes.get(key, [0])) == 0


def test_a_series_takes_at_most_228_fields_whatever_the_traffic(any_redis, unique):
    keys = Keys(f"t{unique}")
    pipe = any_redis.pipeline(transaction=False)
    for minute in range(0, 9 * 24 * 60, 7):   # nine days, an event every 7 minutes
        count(pipe, keys, T0 + minute * 60)
    pipe.execute()
    assert any_redis.hlen(keys.trends) == 60 + 168
    seen = trends.read(any_redis, [keys], T0 + 9 * 24 * 3600)
    week = [m for m in range(0, 9 * 24 * 60, 7) if (T0 + m * 60) // 3600 > (T0 + 9 * 24 * 3600) // 3600 - 168]
    assert sum(seen.hours[("dead_lettered", "queue", "orders")]) == len(week)


@pytest.fixture
def world():
    broker = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    app = Celery("t", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.task_default_queue = "orders"
    store = ShardedStore(broker, Shards("tr"), events_max_length=1000)
    letterer = DeadLetterer(app, broker, store, audit_ttl=60, redis_url="redis://store", broker=broker)
    app.conf.dlq_key_prefix = "tr"
    return World(app, broker, letterer, Operator(app, broker=broker, client=broker), "orders")


def test_dead_letters_parks_and_redeliveries_are_counted_and_drawn(world):
    for n in range(4):
        world.fail("shop.charge", "KeyError", f"'user_{n}'")
    world.fail("shop.charge", "ValueError", "x", reason="non_retryable")
    store = world.op.sharded.home.store
    for n in range(3):
        assert store.park(f"p{n}:2", b"payload", "orders", store.clock() + 30 + n * 600)
    store.park("p9:2", b"payload", "payments", store.clock() + 7200)
    from collections import Counter
    store.count_redelivered(Counter({("orders", "shop.charge"): 6}))
    seen = world.op.trends()
    assert seen.total("dead_lettered")[-1] == 5 and sum(seen.total("dead_lettered", "hour")) == 5
    assert sum(seen.total("parked")) == 4 and sum(seen.total("redelivered")) == 6
    assert seen.names("dead_lettered", "reason") == ["max_delivery_attempts", "non_retryable"]

    web = create_app(world.app, basic_auth=["alice:wonder"], operator=world.op)
    html = client(web).get("/").text
    totals = dict(re.findall(r'<section class="trend" id="trend-(\w+)" data-hour-total="(\d+)"', html))
    assert totals == {"dead_lettered": "5", "parked": "4", "redelivered": "6"}
    section = html[html.index('id="trend-dead_lettered"'):html.index('id="trend-parked"')]
    svgs = re.findall(r"<svg.*?</svg>", section, re.S)
    assert len(svgs) == 2 and [sum(map(int, re.findall(r'data-value="(\d+)"', svg))) for svg in svgs] == [5, 5]
    assert len(re.findall(r"<rect", svgs[0])) == 60 and len(re.findall(r"<rect", svgs[1])) == 168
    assert re.search(r"<title>\d\d:\d\d UTC: 5 dead-lettered</title>", svgs[0])
    assert '<tr data-reason="non_retryable"><td>reason</td><td>non_retryable</td><td class="num">1</td>' in section
    assert '<tr data-queue="orders"><td>queue</td><td>orders</td><td class="num">5</td>' in section

    parked = client(web).get("/parked").text
    due = {unescape(k): v for k, v in re.findall(r'<td class="num" data-bucket="([^"]+)">(\d+)</td>', parked)}
    assert due == {"overdue": "0", "< 1 min": "1", "1-5 min": "0", "5-15 min": "1", "15-60 min": "1",
                   "1-6 h": "1", "6-24 h": "0", "> 24 h": "0"}
    assert '<svg class="trend"' in parked and "4 parked retries due, by when" in parked
