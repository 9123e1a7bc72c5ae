"""The dashboard's circuit breakers page: listed, paused and resumed by an operator, asked first, CSRF, roles."""
from __future__ import annotations

import pytest

from celery_dlq.ops import Operator
from celery_dlq.web import create_app
from celery_dlq.web.users import OPERATOR, VIEWER
from tests.unit.test_web import client, csrf
from tests.unit.test_web_security import AS, USERS


@pytest.fixture
def op(app, fake):
    return Operator(app, broker=fake, client=fake)


def test_an_operator_pauses_after_a_confirmation_and_resumes_a_viewer_cannot(app, op):
    web = create_app(app, basic_auth=USERS, operator=op)
    operator, viewer = client(web, auth=AS[OPERATOR]), client(web, auth=AS[VIEWER])
    assert "No breaker yet" in operator.get("/breakers").text
    asked = operator.get("/breakers/confirm?verb=pause&task=shop.charge&queue=orders")
    assert asked.status_code == 200 and "Pause <strong>shop.charge</strong>" in asked.text
    assert op.breakers.rows() == []                                    # asking changes nothing
    assert viewer.get("/breakers/confirm?verb=pause&task=shop.charge").status_code == 403
    assert viewer.post("/breakers/pause", data={"csrf_token": csrf(viewer), "task": "shop.charge"}).status_code == 403
    assert operator.post("/breakers/pause", data={"task": "shop.charge", "queue": "orders"}).status_code == 403
    done = operator.post("/breakers/pause", data={"csrf_token": csrf(operator, "/breakers"), "task": "shop.charge",
                                                  "queue": "orders"})
    assert done.status_code == 200 and "Paused shop.charge" in done.text
    (row,) = op.breakers.rows()
    assert (row.task, row.queue, row.state, row.paused_by) == ("shop.charge", "orders", "open", "otto (dashboard)")
    assert "Resume" in operator.get("/breakers").text and "Resume" not in viewer.get("/breakers").text
    resumed = operator.post("/breakers/resume", data={"csrf_token": csrf(operator, "/breakers"),
                                                      "task": "shop.charge", "queue": "orders"})
    assert "Closed 1 breaker(s)" in resumed.text and op.breakers.rows()[0].state == "closed"
    assert operator.get("/breakers/confirm?verb=resume&task=shop.charge").status_code == 404


def test_a_read_only_dashboard_refuses_a_pause(app, op):
    web = create_app(app, basic_auth=USERS, operator=op, read_only=True)
    c = client(web, auth=AS[OPERATOR])
    r = c.post("/breakers/pause", data={"csrf_token": csrf(c, "/breakers"), "task": "shop.charge"})
    assert r.status_code == 403 and "read-only" in r.text and op.breakers.rows() == []
