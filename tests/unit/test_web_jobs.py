"""The dashboard's jobs, audit page and edit form (Starlette's test client, fakeredis)."""
from __future__ import annotations

import base64
import json
import re
import time

import pytest

from celery_dlq.ops import Operator, Selection
from celery_dlq.ops.audit import Actor, Audit
from celery_dlq.ops.jobs import Jobs
from celery_dlq.ops.velocity import Velocity
from celery_dlq.web import create_app
from celery_dlq.web.users import ADMIN, OPERATOR, VIEWER
from tests.unit.test_web import client, csrf, letters, run_job
from tests.unit.test_web_security import AS, USERS


@pytest.fixture
def op(app, fake):
    return Operator(app, broker=fake, client=fake)


@pytest.fixture
def web(app, op):
    return create_app(app, basic_auth=USERS, operator=op)


def test_a_job_run_elsewhere_is_paused_resumed_and_cancelled_from_the_dashboard_and_audited(web, op, fake):
    letters(fake, 3)
    job = Jobs(op, owner="a-worker").start("DLQ.orders", Selection.of(everything=True), velocity=Velocity(1.0),
                                           actor=Actor("cron", "nightly redrive"))
    operator, viewer = client(web, auth=AS[OPERATOR]), client(web, auth=AS[VIEWER])
    page = operator.get(f"/jobs/{job.id}").text
    assert 'data-state="running"' in page and 'id="job-pause"' in page and 'id="job-cancel"' in page
    assert 'id="job-pause"' not in viewer.get(f"/jobs/{job.id}").text
    assert viewer.post(f"/jobs/{job.id}/pause", data={"csrf_token": csrf(viewer)}).status_code == 403
    assert operator.post(f"/jobs/{job.id}/pause", data={}).status_code == 403          # no CSRF token
    r = operator.post(f"/jobs/{job.id}/pause", data={"csrf_token": csrf(operator), "why": "spike"},
                      follow_redirects=False)
    assert r.status_code == 303 and op.client.hget(op.keys.job(job.id), "state") == b"paused"
    assert 'id="job-resume"' in operator.get(f"/jobs/{job.id}").text
    again = operator.post(f"/jobs/{job.id}/pause", data={"csrf_token": csrf(operator)})
    assert again.status_code == 409 and "cannot pause a job that is paused" in again.text
    assert operator.post(f"/api/jobs/{job.id}/resume", json={"why": "calm"}).json()["state"] == "running"
    operator.post(f"/jobs/{job.id}/cancel", data={"csrf_token": csrf(operator)})
    assert Jobs(op).get(job.id).state == "cancelled" and fake.llen("DLQ.orders") == 3
    rows = re.findall(r'<tr class="audit" data-action="(\w+)"><td>[^<]*</td><td>([^<]*)</td>', viewer.get("/audit").text)
    assert rows == [("cancel", "otto"), ("resume", "otto"), ("pause", "otto"), ("start", "cron")]
    assert f'data-job-id="{job.id}" data-state="cancelled"' in viewer.get("/jobs").text
    assert operator.post("/jobs/nope/pause", data={"csrf_token": csrf(operator)}).status_code == 404
    assert operator.post("/api/jobs/nope/cancel", json={}).status_code == 404


def test_a_purge_needs_a_reason_and_the_audit_page_shows_who_and_why(web, op, fake):
    ids = letters(fake, 2)
    admin = client(web, auth=AS[ADMIN])
    refused = admin.post("/dlq/DLQ.orders/purge", data={"csrf_token": csrf(admin), "id": ids[0]})
    assert refused.status_code == 400 and "say why" in refused.text and fake.llen("DLQ.orders") == 2
    assert admin.post("/api/dlq/DLQ.orders/purge", json={"ids": [ids[0]]}).status_code == 400
    r = admin.post("/dlq/DLQ.orders/purge", data={"csrf_token": csrf(admin), "id": ids[0], "why": "test junk"},
                   follow_redirects=False)
    assert run_job(admin, web, r) == {"done": 1, "missing": 0, "failed": 0}
    started = admin.post("/api/dlq/DLQ.orders/replay", json={"ids": [ids[1]], "why": "INC-7"})
    web.state.jobs.wait(started.json()["job_id"])
    deadline = time.monotonic() + 10   # the runner audits how a job ended just after it marks it ended
    while len(Audit(op).recent()) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    trail = Audit(op).recent()
    assert [(r["action"], r["who"], r["why"]) for r in trail] == [
        ("replay", "ada", "INC-7"), ("start", "ada", "INC-7"), ("purge", "ada", "test junk"),
        ("start", "ada", "test junk")]
    assert trail[0]["counts"]["done"] == 1 and trail[2]["selection"]["ids"] == [ids[0]]
    page = admin.get("/audit").text
    assert "test junk" in page and "INC-7" in page


def test_the_edit_form_checks_its_json_and_replays_the_letter_edited(web, op, fake):
    (task_id,) = letters(fake, 1)
    viewer, operator = client(web, auth=AS[VIEWER]), client(web, auth=AS[OPERATOR])
    path = f"/dlq/DLQ.orders/letters/{task_id}/edit"
    assert viewer.get(path).status_code == 403
    form = operator.get(path).text
    assert 'id="edit-args">[0]</textarea>' in form and "Edit and replay" in operator.get(
        f"/dlq/DLQ.orders/letters/{task_id}").text
    token = csrf(operator, path)
    bad = operator.post(path, data={"csrf_token": token, "args": "[1,", "kwargs": "", "headers": "", "why": "x"})
    assert bad.status_code == 400 and "args is not JSON" in bad.text and fake.llen("DLQ.orders") == 1
    no_why = operator.post(path, data={"csrf_token": token, "args": "[5]", "why": " "})
    assert no_why.status_code == 400 and "say why" in no_why.text and fake.llen("DLQ.orders") == 1
    protected = operator.post(path, data={"csrf_token": token, "headers": '{"id": "x"}', "why": "y"})
    assert protected.status_code == 400 and "cannot be edited" in protected.text
    done = operator.post(path, data={"csrf_token": token, "args": "[5]", "kwargs": "", "headers": "{}",
                                     "why": "wrong amount"})
    assert done.status_code == 200 and 'data-done="1"' in done.text and fake.llen("DLQ.orders") == 0
    (message,) = [json.loads(raw) for raw in fake.lrange("orders", 0, -1)]
    assert json.loads(base64.b64decode(message["body"]))[0] == [5] and message["headers"]["id"] == task_id
    (record,) = Audit(op).recent()
    assert (record["action"], record["who"], record["why"]) == ("edit", "otto", "wrong amount")
    assert record["original"]["args"] == [0] and record["edited"]["args"] == [5]
    assert "original and edit" in operator.get("/audit").text


def test_a_dashboard_with_take_over_jobs_runs_a_job_whose_process_died(app, op, fake):
    ids = letters(fake, 2)
    job = Jobs(op).start("DLQ.orders", Selection.of(ids))   # started, never run: as if its process died
    web = create_app(app, basic_auth=USERS, operator=op, take_over_jobs=0.05)
    try:
        ended = web.state.jobs.wait(job.id, timeout=30)
        assert ended.state == "done" and ended.done == 2 and fake.llen("orders") == 2
        assert ended.owner == web.state.jobs.jobs.owner
    finally:
        web.state.jobs.stop()


def test_a_replay_from_the_dashboard_may_be_paced(web, op, fake):
    ids = letters(fake, 2)
    operator = client(web, auth=AS[OPERATOR])
    assert 'id="rate"' in operator.get("/dlq/DLQ.orders/confirm?action=replay&all=1").text
    bad = operator.post("/dlq/DLQ.orders/replay", data={"csrf_token": csrf(operator), "all": "1", "rate": "fast"})
    assert bad.status_code == 400 and "rate is letters a second" in bad.text and fake.llen("DLQ.orders") == 2
    assert operator.post("/api/dlq/DLQ.orders/replay", json={"all": True, "rate": -1}).status_code == 400
    started = operator.post("/api/dlq/DLQ.orders/replay", json={"ids": ids, "rate": 1000})
    job = web.state.jobs.wait(started.json()["job_id"])
    assert job.rate == 1000.0 and job.done == 2 and fake.llen("orders") == 2
