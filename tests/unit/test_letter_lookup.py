"""A dead letter's page under a live DLQ: its link's anchor survives new arrivals, and a stale or missing one
is searched inside Redis (fakeredis and the real redis-server), never by reading every letter into Python."""
from __future__ import annotations

import json
import re

import pytest
from celery import Celery

from celery_dlq.ops import Operator, window
from celery_dlq.ops.window import find_letter, parse_anchor, read_window
from celery_dlq.storage.keys import QueueLists
from celery_dlq.web import create_app
from tests.unit.test_web import client


@pytest.fixture
def broker(emptied_any_redis):
    return emptied_any_redis


def element(task_id: str, n: int) -> str:
    return json.dumps({"body": "W1sxXSwge30sIHt9XQ==", "content-type": "application/json", "content-encoding": "utf-8",
                       "headers": {"id": task_id, "task": "shop.charge", "x-dlq-reason": "max_delivery_attempts",
                                   "x-dlq-dead-lettered-at": 1_700_000_000 + n,
                                   "argsrepr": f"('mentions id-{n + 1}',)"},   # another id in its text
                       "properties": {"delivery_tag": f"t{n}", "priority": 0, "body_encoding": "base64",
                                      "delivery_info": {"exchange": "", "routing_key": "DLQ.orders"}}})


def push(broker, start: int, n: int, key: str = "DLQ.orders", prefix: str = "id-") -> None:
    broker.lpush(key, *[element(f"{prefix}{i}", i) for i in range(start, start + n)])


@pytest.fixture
def op(broker):
    app = Celery("lookup", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.task_default_queue = "orders"
    return Operator(app, broker=broker, client=broker)


def searched(monkeypatch) -> list[tuple[int, int]]:
    """Record every range find_letter.lua is asked to search."""
    calls: list[tuple[int, int]] = []
    original = window._search

    def spy(dead, key, task_id, at, *, around):
        scripts = dead.op.scripts
        run = scripts.run

        def recording(name, keys, args):
            calls.append((int(args[1]), int(args[2])))
            return run(name, keys, args)
        scripts.run = recording
        try:
            return original(dead, key, task_id, at, around=around)
        finally:
            scripts.run = run
    monkeypatch.setattr(window, "_search", spy)
    return calls


def test_an_anchor_survives_new_arrivals_and_is_read_at_once(op, broker, monkeypatch):
    push(broker, 0, 3000)
    dead = op.queue("DLQ.orders")
    shown = read_window(dead, 1500, 1, newest_first=True)
    (_, letter), anchor = shown.letters[0], shown.anchors[0]
    push(broker, 3000, 2000)   # arrivals: the page position is stale now, the anchor is not
    calls = searched(monkeypatch)
    found = find_letter(dead, letter.task_id, parse_anchor(anchor))
    assert found is not None and found.raw == letter.raw
    assert len(calls) <= 2 and all(last - first < window.SEARCH_FIRST for first, last in calls)


def test_letters_removed_from_the_old_end_shift_it_and_the_search_widens(op, broker, monkeypatch):
    push(broker, 0, 3000)
    dead = op.queue("DLQ.orders")
    anchor = read_window(dead, 2000, 1, newest_first=False).anchors[0]
    for _ in range(700):   # replayed or trimmed meanwhile
        broker.rpop("DLQ.orders")
    calls = searched(monkeypatch)
    found = find_letter(dead, "id-2000", parse_anchor(anchor))
    assert found is not None and found.task_id == "id-2000"
    assert sum(last - first + 1 for first, last in calls) < 3000   # not the whole list


def test_without_an_anchor_the_oldest_of_the_id_is_found_across_sub_lists(op, broker):
    push(broker, 0, 100)
    broker.lpush(QueueLists().key("DLQ.orders", 9), element("id-5", 999))   # a second copy, priority 9
    dead = op.queue("DLQ.orders")
    assert json.loads(find_letter(dead, "id-5").raw)["headers"]["x-dlq-dead-lettered-at"] == 1_700_000_005
    assert find_letter(dead, "id-6") is not None and find_letter(dead, "id-6").task_id == "id-6"
    assert find_letter(dead, "id-100") is None   # only mentioned in another letter's arguments
    assert find_letter(dead, "nope", (0, 5)) is None and find_letter(dead, "id-7", (7, 99)).task_id == "id-7"
    assert parse_anchor("0:12") == (0, 12) and parse_anchor("12") is None and parse_anchor("a:b") is None


def test_the_dlq_page_links_carry_anchors_that_work_after_arrivals(op, broker):
    long = "lookup-task-id-"    # the dashboard looks a letter up by a full task id (12 characters at least)
    push(broker, 0, 400, prefix=long)
    web = create_app(op.app, basic_auth=["alice:wonder"], operator=op)
    c = client(web)
    html = c.get("/dlq/DLQ.orders?start=100").text
    links = re.findall(r'href="(/dlq/DLQ.orders/letters/(lookup-task-id-\d+)\?at=\d+:\d+)"', html)
    assert len(links) == 50
    push(broker, 400, 500, prefix=long)
    for link, task_id in links[:5] + links[-5:]:
        page = c.get(link.replace("&amp;", "&"))
        assert page.status_code == 200 and f'id="task-id">{task_id}<' in page.text
    assert c.get(f"/dlq/DLQ.orders/letters/{long}3?at=junk").status_code == 200
    assert c.get(f"/dlq/DLQ.orders/letters/{long}3?at=0:999999").status_code == 200
    assert c.get(f"/dlq/DLQ.orders/letters/{long}9999?at=0:5").status_code == 404


def test_a_stale_page_position_is_searched_around_where_it_lies_now(op, broker, monkeypatch):
    push(broker, 0, 3000)
    dead = op.queue("DLQ.orders")
    (_, newest), = read_window(dead, 0, 1, newest_first=True).letters
    push(broker, 3000, 300)   # the link said "position 0, newest first": that is another letter now
    calls = searched(monkeypatch)
    found = window.letter_at(dead, 0, newest.task_id, newest_first=True)
    assert found is not None and found.raw == newest.raw
    assert sum(last - first + 1 for first, last in calls) < 2000   # around the head, not from the old end


def test_a_filter_with_a_needle_is_searched_inside_redis_and_selects_what_matches_selects(op, broker):
    from celery_dlq.ops import Filter

    push(broker, 0, 1200)   # every letter mentions "id-<n+1>" in its arguments: candidates that must not match
    dead = op.queue("DLQ.orders")
    for where in (Filter(task_id="id-700"), Filter(task_name="shop.charge", until=1_700_000_010),
                  Filter(reason="max_delivery_attempts", since=1_700_001_190)):
        assert where.needle() is not None
        for newest_first in (True, False):
            shown = [letter.task_id for _, letter in read_window(dead, 0, 50, newest_first=newest_first,
                                                                 where=where).letters]
            expected = [letter.task_id for letter in dead.entries(where)]
            assert shown == (expected[::-1] if newest_first else expected)[:50] and shown
    assert Filter(task_name="shop.*").needle() is None and Filter(text="declined").needle() is None
