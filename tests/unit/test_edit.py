"""Edit before replay (fakeredis): new args run, the original kept in the audit, the rest of the message untouched."""
from __future__ import annotations

import base64
import json

import pytest

from celery_dlq.ops import Operator
from celery_dlq.ops.audit import Actor, Audit
from celery_dlq.ops.edit import BadEdit, Edit, parse_headers, parse_json, replay_edited
from tests.unit.test_manage import T0, FakeClock, dead_letter, stored


@pytest.fixture
def op(app, fake):
    return Operator(app, broker=fake, client=fake, clock=FakeClock())


def test_an_edited_replay_delivers_the_new_arguments_and_keeps_everything_else(op, fake):
    letter = dead_letter(fake, args=(1, "old"), kwargs={"k": 1}, at=T0)
    dead = op.queue("DLQ.orders")
    edit = Edit(letter.task_id, args=[2, "new"], headers={"x-tenant": "acme"})
    out = replay_edited(dead, edit, Actor("alice", "fixed the card"))
    assert out.done == 1 and op.depth("DLQ.orders") == 0
    (message,) = stored(fake, "orders")
    body = json.loads(base64.b64decode(message["body"]))
    assert body[0] == [2, "new"] and body[1] == {"k": 1} and body[2] == json.loads(letter.body)[2]
    headers = message["headers"]
    assert headers["id"] == letter.task_id and headers["task"] == "shop.charge" and headers["x-tenant"] == "acme"
    assert headers["root_id"] == letter.header("root_id") and headers["argsrepr"] == "[2, 'new']"
    assert message["content-type"] == letter.content_type == "application/json"
    (record,) = Audit(op).recent()
    assert record["action"] == "edit" and record["who"] == "alice" and record["why"] == "fixed the card"
    assert record["original"] == {"args": [1, "old"], "kwargs": {"k": 1}, "headers": {"x-tenant": None}}
    assert record["edited"]["args"] == [2, "new"] and record["task_id"] == letter.task_id


def test_a_letter_outside_accept_content_cannot_be_edited_and_stays(op, fake):
    letter = dead_letter(fake, serializer="pickle", at=T0)
    with pytest.raises(BadEdit, match="not in accept_content"):
        replay_edited(op.queue("DLQ.orders"), Edit(letter.task_id, kwargs={"a": 1}), Actor("bob"))
    assert op.depth("DLQ.orders") == 1 and not fake.llen("orders") and Audit(op).recent() == []


def test_an_edit_is_refused_for_protected_headers_bad_json_and_nothing():
    with pytest.raises(BadEdit, match="'group' cannot be edited"):
        Edit("t", headers={"group": "g"})
    with pytest.raises(BadEdit, match="x-dlq-reason"):
        Edit("t", headers={"x-dlq-reason": "no"})
    with pytest.raises(BadEdit, match="nothing given"):
        Edit("t")
    with pytest.raises(BadEdit, match="must be a JSON array"):
        parse_json('{"a": 1}', "--args", list)
    with pytest.raises(BadEdit, match="is not JSON"):
        parse_json("[1,", "--args", list)
    assert parse_headers(["a=1", "b=text", "c={\"x\": 2}"]) == {"a": 1, "b": "text", "c": {"x": 2}}


def test_an_id_not_in_the_dlq_is_not_found(op, fake):
    dead_letter(fake, at=T0)
    out = replay_edited(op.queue("DLQ.orders"), Edit("nope", args=[]), Actor("x"))
    assert out.not_found == ["nope"] and op.depth("DLQ.orders") == 1
