"""The dashboard's failure groups over HTTP (Starlette's test client, fakeredis): the overview's groups and
their charts, a group's letters, "replay this group" and "purge this group" with their confirmation, CSRF and
read-only rules, and bad input. Every effect is asserted in Redis."""
from __future__ import annotations

import json
import re

import fakeredis
import pytest
from celery import Celery

from celery_dlq import headers as H
from celery_dlq.fingerprint import group_id
from celery_dlq.ops import Operator
from celery_dlq.storage.sharding import Shards
from celery_dlq.storage.shards import ShardedStore
from celery_dlq.web import create_app
from celery_dlq.worker.deadletter.dead_letterer import DeadLetterer
from tests.integration.test_group_index import World, assert_exact
from tests.unit.test_web import CSRF, client, ids_on, run_job

CHARGE = group_id("shop.charge", "KeyError", "'x'")
DECLINED = group_id("shop.charge", "ValueError", "card 1 declined")
SHIP = group_id("shop.ship", "ValueError", "card 1 declined")


@pytest.fixture
def world():
    broker = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    app = Celery("g", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.task_default_queue = "orders"
    letterer = DeadLetterer(app, broker, ShardedStore(broker, Shards("g"), events_max_length=1000), audit_ttl=60,
                            redis_url="redis://store", broker=broker)
    w = World(app, broker, letterer, Operator(app, broker=broker, client=broker), "orders")
    for n in range(5):
        w.fail("shop.charge", "KeyError", f"'user_{n}'")
    for n in range(3):
        w.fail("shop.charge", "ValueError", f"card {n * 17} declined", reason="non_retryable")
    for n in range(2):
        w.fail("shop.ship", "ValueError", f"card {n} declined")
    return w


@pytest.fixture
def web(world):
    return create_app(world.app, basic_auth=["alice:wonder"], operator=world.op)


def groups_on(html: str) -> dict[str, int]:
    return {gid: int(n) for gid, n in re.findall(r'<tr class="group" data-group="(\w+)" data-count="(\d+)"', html)}


def test_overview_shows_each_group_with_its_count_chart_and_links(web, world):
    html = client(web).get("/").text
    assert groups_on(html) == {CHARGE: 5, DECLINED: 3, SHIP: 2}
    row = html[html.index(f'data-group="{CHARGE}"'):html.index(f'data-group="{DECLINED}"')]
    assert "shop.charge" in row and "<code>KeyError</code>: &lt;str&gt;" in row
    bars = [int(v) for v in re.findall(r'<rect class="\w+" data-value="(\d+)"', row)]
    assert len(bars) == 24 and sum(bars) == 5 and bars[-1] == 5   # all arrived this hour
    assert re.search(r"<title>\d{4}-\d\d-\d\d \d\d:00 UTC: 5 dead-lettered</title>", row)
    assert f'/dlq/DLQ.orders?group={CHARGE}' in row and "/dlq/DLQ.orders/letters/id-5" in row
    assert "max_delivery_attempts" in row and "non_retryable" not in row
    all_groups = client(web).get("/groups?dlq=DLQ.orders").text
    assert groups_on(all_groups) == {CHARGE: 5, DECLINED: 3, SHIP: 2}


def test_a_group_link_lists_exactly_its_letters(web, world):
    html = client(web).get(f"/dlq/DLQ.orders?group={DECLINED}&order=oldest").text
    assert ids_on(html) == ["id-6", "id-7", "id-8"]


def confirm_and_run(c, web, action: str, group: str) -> tuple[str, dict]:
    """The confirmation page of ``action`` on ``group``, then its POST (with that page's CSRF token) run to the end."""
    confirm = c.get(f"/dlq/DLQ.orders/confirm?action={action}&group={group}").text
    r = c.post(f"/dlq/DLQ.orders/{action}", data={"csrf_token": CSRF.findall(confirm)[-1], "group": group,
                                                       "why": "test"},
               follow_redirects=False)
    return confirm, run_job(c, web, r)


def test_replay_this_group_moves_exactly_its_members(web, world):
    c = client(web)
    confirm, outcome = confirm_and_run(c, web, "replay", CHARGE)
    assert "<strong>5</strong> dead letters to their original queue" in confirm
    assert outcome == {"done": 5, "missing": 0, "failed": 0}
    moved = {json.loads(raw)["headers"]["id"] for raw in world.broker.lrange("orders", 0, -1)}
    assert moved == {f"id-{n}" for n in range(1, 6)} and world.broker.llen("orders") == 5
    left = {letter["headers"]["id"]: letter["headers"][H.GROUP] for letter in world.letters()}
    assert set(left) == {f"id-{n}" for n in range(6, 11)} and CHARGE not in left.values()
    assert groups_on(c.get("/").text) == {DECLINED: 3, SHIP: 2}
    assert_exact(world)


def test_purge_this_group_deletes_exactly_its_members(web, world):
    c = client(web)
    confirm, outcome = confirm_and_run(c, web, "purge", SHIP)
    assert "delete for good <strong>2</strong> dead letters" in confirm
    assert outcome == {"done": 2, "missing": 0, "failed": 0}
    assert {l["headers"]["id"] for l in world.letters()} == {f"id-{n}" for n in range(1, 9)}
    assert world.broker.llen("orders") == 0
    assert_exact(world)


def test_group_actions_need_csrf_and_are_refused_read_only(world):
    web = create_app(world.app, basic_auth=["alice:wonder"], operator=world.op)
    r = client(web).post("/dlq/DLQ.orders/replay", data={"group": CHARGE})
    assert r.status_code == 403 and world.broker.llen("orders") == 0
    read_only = create_app(world.app, basic_auth=["alice:wonder"], operator=world.op, read_only=True)
    c = client(read_only)
    html = c.get("/").text
    assert groups_on(html) and "replay-group" not in html and "purge-group" not in html
    assert c.get(f"/dlq/DLQ.orders/confirm?action=replay&group={CHARGE}").status_code == 403
    token = CSRF.search(html).group(1)
    assert c.post("/dlq/DLQ.orders/replay", data={"csrf_token": token, "group": CHARGE}).status_code == 403
    assert world.broker.llen("orders") == 0 and len(world.letters()) == 10


def test_a_bad_group_id_is_a_clear_error_and_changes_nothing(web, world):
    c = client(web)
    r = c.get("/dlq/DLQ.orders?group=<script>")
    assert r.status_code == 400 and "16 hex digits" in r.text and "<script>" not in r.text
    token = CSRF.search(c.get("/").text).group(1)
    r = c.post("/dlq/DLQ.orders/purge", data={"csrf_token": token, "group": "nope"})
    assert r.status_code == 400 and len(world.letters()) == 10
    assert c.get("/groups?dlq=DLQ.nope").status_code == 404


def test_overview_json_gives_the_figures_the_page_refreshes_and_needs_the_login(web, world):
    from starlette.testclient import TestClient

    anonymous = TestClient(web, base_url="http://localhost").get("/api/overview", follow_redirects=False)
    assert anonymous.status_code in (302, 303, 401) and "stats" not in anonymous.text
    data = client(web).get("/api/overview").json()
    assert data["groups"] == {CHARGE: 5, DECLINED: 3, SHIP: 2}
    assert data["depths"] == {"DLQ.orders": 10} and data["stats"]["dead_letters_now"] == 10
    assert set(data["trends"]) == {"dead_lettered", "parked", "redelivered"}
    html = client(web).get("/").text
    assert '<th>in DLQs now <span class="hint">dead_letters_now</span>' in html
    assert 'title="Dead letters in every DLQ right now' in html and 'data-stat="dead_letters_now">10<' in html
