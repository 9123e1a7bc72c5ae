"""The dashboard's and CLI's findings of issue 45 (M1-M3, L1-L9) and the overview's incident, each a test that
failed before its fix (Starlette's test client, fakeredis); and issue 44's rule that the web layer sends no Redis
command itself.
"""
from __future__ import annotations

import ast
import base64
import json
import secrets
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis

from celery_dlq.message import Envelope
from celery_dlq.ops import Operator, Selection
from celery_dlq.ops.audit import Actor, Audit
from celery_dlq.ops.jobs import Jobs
from celery_dlq.ops.velocity import Velocity
from celery_dlq.storage.audit import AuditTrail
from celery_dlq.web import create_app
from tests.unit.test_web import T0, client, csrf, letters
from tests.unit.test_web_security import AS, USERS

WEB = Path(__file__).resolve().parents[2] / "celery_dlq" / "web"


@pytest.fixture
def op(app, fake):
    return Operator(app, broker=fake, client=fake)


@pytest.fixture
def web(app, op):
    return create_app(app, basic_auth=USERS, operator=op)


def log_in(c, user: str, password: str):
    return c.post("/login", data={"csrf_token": csrf(c, "/login"), "user": user, "password": password},
                  follow_redirects=False)


# -- issue 44: the web layer sends no Redis command --------------------------------------------------------------

#: Redis command methods of redis-py's client and pipeline (and running a script).
REDIS_CALLS = {"get", "set", "delete", "incr", "decr", "expire", "hset", "hget", "hmget", "hgetall", "zadd", "zrem",
               "zrangebyscore", "zremrangebyscore", "pipeline", "execute", "watch", "multi", "xadd", "xrevrange",
               "scan_iter", "llen", "lrange", "register_script", "eval", "evalsha", "keys", "ttl", "exists"}


def test_no_module_of_the_web_layer_calls_a_redis_command_or_runs_a_script():
    found = []
    for path in sorted(WEB.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in REDIS_CALLS:
                owner = ast.unparse(node.func.value)
                if any(word in owner for word in ("client", "pipe", "redis", "broker")):
                    found.append(f"{path.name}:{node.lineno} {ast.unparse(node.func)}")
    assert found == []


# -- M1: the per-address budget first ----------------------------------------------------------------------------

def test_m1_invented_user_names_from_one_address_make_a_bounded_number_of_keys(app, op, fake):
    web = create_app(app, basic_auth=USERS, operator=op)
    c = client(web, auth=None, client=("198.51.100.7", 4000))
    before = set(fake.keys("*"))
    answers = [log_in(c, secrets.token_hex(8), "guess").status_code for _ in range(200)]
    assert answers.count(401) == 5 and answers.count(429) == 195
    made = set(fake.keys("*")) - before
    assert len(made) <= 6, sorted(made)[:10]        # the address's counter and one per user name it was allowed


# -- M2: acting on a job needs the role its action needed ----------------------------------------------------------

def test_m2_an_operator_cannot_resume_pause_or_cancel_an_admins_purge_job(web, op, fake):
    letters(fake, 3)
    jobs = Jobs(op, owner="a-worker")
    purge = jobs.start("DLQ.orders", Selection.of(everything=True), kind="purge", actor=Actor("ada", "cleanup"))
    jobs.pause(purge.id, Actor("ada", "hold on"))
    operator, admin = client(web, auth=AS["operator"]), client(web, auth=AS["admin"])
    assert 'id="job-resume"' not in operator.get(f"/jobs/{purge.id}").text
    assert 'id="job-resume"' in admin.get(f"/jobs/{purge.id}").text
    for action in ("resume", "cancel"):
        r = operator.post(f"/jobs/{purge.id}/{action}", data={"csrf_token": csrf(operator)})
        assert r.status_code == 403 and "may not purge" in r.text, action
        api = operator.post(f"/api/jobs/{purge.id}/{action}", json={})
        assert api.status_code == 403, action
    assert jobs.get(purge.id).state == "paused" and fake.llen("DLQ.orders") == 3
    assert admin.post(f"/api/jobs/{purge.id}/cancel", json={}).json()["state"] == "cancelled"


def test_m2_an_operator_still_acts_on_a_replay_job(web, op, fake):
    letters(fake, 2)
    job = Jobs(op, owner="a-worker").start("DLQ.orders", Selection.of(everything=True), velocity=Velocity(0.001))
    operator = client(web, auth=AS["operator"])
    r = operator.post(f"/jobs/{job.id}/pause", data={"csrf_token": csrf(operator)}, follow_redirects=False)
    assert r.status_code == 303 and Jobs(op).get(job.id).state == "paused"
    assert operator.post("/api/jobs/nope/resume", json={}).status_code == 404


# -- L3: the CSRF token is bound to the session --------------------------------------------------------------------

def test_l3_a_csrf_token_of_one_session_is_refused_in_another(web, fake):
    letters(fake, 1)
    first, second = client(web, auth=None), client(web, auth=None)
    log_in(first, *AS["admin"])
    log_in(second, *AS["admin"])                                    # the same user, another session
    token = csrf(first)
    nonce = first.cookies["dlq_csrf"]                              # even with the first browser's nonce
    r = second.post("/logout", data={"csrf_token": token}, follow_redirects=False,
                    headers={"cookie": f"dlq_csrf={nonce}; dlq_session={second.cookies['dlq_session']}"})
    assert r.status_code == 403 and "CSRF" in r.text
    assert second.get("/", follow_redirects=False).status_code == 200      # still logged in: nothing changed
    assert first.post("/logout", data={"csrf_token": token}, follow_redirects=False).status_code == 303


# -- L4: an unknown user name costs the same key derivation as a known one --------------------------------------------

def test_l4_an_unknown_user_is_checked_with_the_same_kdf_and_parameters(app, op, monkeypatch):
    from celery_dlq.web import users as users_module
    ada = "ada:admin:" + users_module.hash_password("a-pass", iterations=1_000)
    web = create_app(app, basic_auth=[ada, "otto:operator:o-pass"], operator=op)
    calls: list[tuple] = []
    real = users_module.hashlib.pbkdf2_hmac

    def counted(name, password, salt, iterations, *rest):
        calls.append((name, iterations))
        return real(name, password, salt, iterations, *rest)

    monkeypatch.setattr(users_module.hashlib, "pbkdf2_hmac", counted)
    costs = {}
    for user in ("ada", "otto", "nobody"):
        calls.clear()
        assert not web.state.access.check_password(user, "wrong")
        costs[user] = list(calls)
    assert costs["ada"] == costs["otto"] == costs["nobody"] == [("sha256", 1_000)]


# -- L7: public pages do not name the Redis hosts ----------------------------------------------------------------------

def test_l7_the_login_page_names_no_redis_host_a_logged_in_page_does(app, op):
    app.conf.broker_url = "redis://:hunter2@broker.internal:6379/0"
    web = create_app(app, basic_auth=USERS, operator=op)
    login = client(web, auth=None).get("/login")
    assert login.status_code == 200 and "broker.internal" not in login.text and "store" not in login.text
    assert "broker.internal" in client(web, auth=AS["viewer"]).get("/").text


# -- L8: --no-auth behind a trusted proxy that forwards no client ------------------------------------------------------

def test_l8_no_auth_refuses_a_trusted_proxys_request_without_x_forwarded_for(app, op):
    web = create_app(app, no_auth=True, operator=op, trusted_proxies=["127.0.0.1"])
    bare = client(web, auth=None, client=("127.0.0.1", 4000))
    r = bare.get("/")
    assert r.status_code == 403 and "X-Forwarded-For" in r.text
    local = client(web, auth=None, client=("127.0.0.1", 4000), headers={"X-Forwarded-For": "127.0.0.1"})
    assert local.get("/").status_code == 200
    remote = client(web, auth=None, client=("127.0.0.1", 4000), headers={"X-Forwarded-For": "198.51.100.7"})
    assert remote.get("/").status_code == 403
    assert client(create_app(app, no_auth=True, operator=op), auth=None,
                  client=("127.0.0.1", 4000)).get("/").status_code == 200     # no proxy: the loopback client


# -- L5: no whole-DLQ search for a short id, no SCAN for an unknown name -----------------------------------------------

class Counting:
    """A client that counts the commands the dashboard sends (by name)."""

    def __init__(self, fake, seen: list[str]):
        self._fake, self._seen = fake, seen

    def __getattr__(self, name):
        attr = getattr(self._fake, name)
        if callable(attr):
            def counted(*args, **kw):
                self._seen.append(name)
                return attr(*args, **kw)
            return counted
        return attr


def test_l5_a_short_task_id_or_an_unknown_dlq_is_404_without_reading_a_dlq_or_scanning(app, fake):
    ids = letters(fake, 3)
    seen: list[str] = []
    op = Operator(app, broker=Counting(fake, seen), client=fake)
    web = create_app(app, basic_auth=USERS, operator=op)
    viewer = client(web, auth=AS["viewer"])
    for short in ("a", "1", ids[0][:8], '"content-type": "application', "{'exchange': ''"):
        seen.clear()
        r = viewer.get(f"/dlq/DLQ.orders/letters/{short}")
        assert r.status_code == 404 and "full task id" in r.text
        assert not {"register_script", "evalsha", "lrange", "llen"} & set(seen), seen
    assert viewer.get(f"/dlq/DLQ.orders/letters/{ids[0]}").status_code == 200
    for name in ("nope", "DLQ.nope", "x" * 300):
        seen.clear()
        for page in (f"/dlq/{name}", f"/groups?dlq={name}", f"/dlq/{name}/letters/{ids[0]}"):
            r = viewer.get(page)
            assert r.status_code == 404 and "unknown dead-letter queue" in r.text, page
        assert "scan_iter" not in seen and "scan" not in seen, seen


# -- L6: the dashboard never unpickles a letter to show it -------------------------------------------------------------

def test_l6_a_pickled_letter_is_shown_undecoded_even_when_the_app_accepts_pickle(app, op, fake):
    from tests.unit.test_manage import UNPICKLED, Evil, dead_letter
    app.conf.accept_content = ["json", "pickle"]
    web = create_app(app, basic_auth=USERS, operator=Operator(app, broker=fake, client=fake))
    UNPICKLED.clear()
    letter = dead_letter(fake, args=(Evil(),), serializer="pickle")
    operator = client(web, auth=AS["operator"])
    html = operator.get(f"/dlq/DLQ.orders/letters/{letter.task_id}").text
    assert 'id="not-decoded"' in html and "never unpickles" in html and 'id="args"' not in html
    assert f'id="body">{base64.b64encode(letter.body).decode()}<' in html
    edit = f"/dlq/DLQ.orders/letters/{letter.task_id}/edit"
    assert operator.get(edit).status_code == 200
    r = operator.post(edit, data={"csrf_token": csrf(operator, edit), "args": "[1]", "why": "fix"})
    assert r.status_code == 400 and "never decodes" in r.text and fake.llen("DLQ.orders") == 1
    assert UNPICKLED == []


# -- L9: ?at= of thousands of digits, a replay's target, the edit's header guard -------------------------------------

def test_l9_a_huge_at_is_400(web, fake):
    (task_id,) = letters(fake, 1)
    viewer = client(web, auth=AS["viewer"])
    for at in ("9" * 5000, "1:" + "9" * 5000, "9" * 19, "-" + "9" * 4000):
        r = viewer.get(f"/dlq/DLQ.orders/letters/{task_id}", params={"at": at})
        assert r.status_code == 400, at[:20]
    for at in ("0:0", "9" * 18, "junk"):                                        # junk is ignored, as before
        assert viewer.get(f"/dlq/DLQ.orders/letters/{task_id}", params={"at": at}).status_code == 200, at


def test_l9_a_replay_goes_only_to_a_known_queue(app, web, fake):
    ids = letters(fake, 2)
    operator = client(web, auth=AS["operator"])
    for to in ("nowhere", "celery_dlq:anything"):
        r = operator.post("/api/dlq/DLQ.orders/replay", json={"ids": ids, "to": to})
        assert r.status_code == 400 and "not a queue" in r.json()["error"], to
        form = operator.post("/dlq/DLQ.orders/replay", data={"csrf_token": csrf(operator), "id": ids, "to": to})
        assert form.status_code == 400, to
    assert fake.llen("DLQ.orders") == 2 and not fake.exists("nowhere")
    app.conf.task_routes = {"shop.*": {"queue": "orders.slow"}}
    r = operator.post("/api/dlq/DLQ.orders/replay", json={"ids": [ids[0]], "to": "orders.slow"})
    assert r.status_code == 202 and web.state.jobs.wait(r.json()["job_id"]).outcome.done == 1
    assert fake.llen("orders.slow") == 1


def test_l9_the_edit_refuses_a_protected_header_in_any_case(web, fake):
    (task_id,) = letters(fake, 1)
    operator = client(web, auth=AS["operator"])
    path = f"/dlq/DLQ.orders/letters/{task_id}/edit"
    for header in ("ID", "Root_Id", "X-DLQ-Delivery-Count", "x-DLQ-reason"):
        r = operator.post(path, data={"csrf_token": csrf(operator, path), "headers": json.dumps({header: "x"}),
                                      "why": "try"})
        assert r.status_code == 400 and "cannot be edited" in r.text, header
    assert fake.llen("DLQ.orders") == 1


# -- L1: parked deletes and redeliveries and session revokes are audited; the audit fails closed ---------------------

def park_one(op, entry: str = "t1:2") -> None:
    op.sharded.home.store.park(entry, Envelope(b"[]", None, None, {}, {}, "", "orders", "orders").dumps(), "orders",
                               T0)


def test_l1_parked_delete_redeliver_and_a_session_revoke_are_audited(web, op):
    park_one(op, "t1:2")
    park_one(op, "t2:2")
    operator, admin = client(web, auth=AS["operator"]), client(web, auth=AS["admin"])
    otto = client(web, auth=None)
    log_in(otto, *AS["operator"])
    assert operator.post("/parked/redeliver", data={"csrf_token": csrf(operator), "entry_id": "t1:2"}).status_code \
        == 200
    assert admin.post("/api/parked/delete", json={"entry_id": "t2:2"}).json()["n"] == 1
    assert admin.post("/sessions/revoke", data={"csrf_token": csrf(admin), "user": "otto"}).status_code == 200
    trail = Audit(op).recent()
    assert [(r["action"], r["who"]) for r in trail] == [("revoke", "ada"), ("delete", "ada"), ("redeliver", "otto")]
    assert trail[0]["revoked_user"] == "otto" and trail[0]["counts"] == {"matched": 1}
    assert trail[1]["entries"] == ["t2:2"] and trail[2]["entries"] == ["t1:2"]
    page = admin.get("/audit").text
    assert 'data-action="revoke"' in page and "sessions of otto" in page and "parked retry t2:2" in page


def test_l1_an_audit_that_cannot_be_written_refuses_the_action(web, op, fake, monkeypatch, caplog):
    park_one(op, "t1:2")
    otto = client(web, auth=None)
    log_in(otto, *AS["operator"])
    admin = client(web, auth=AS["admin"])
    token = csrf(admin)

    def down(*_a, **_kw):
        raise redis.ConnectionError("audit stream unavailable")

    monkeypatch.setattr(fake, "xadd", down)
    r = admin.post("/parked/delete", data={"csrf_token": token, "entry_id": "t1:2"})
    assert r.status_code == 503 and "could not be written" in r.text and "nothing changed" in r.text
    assert op.parked.count() == 1                                                 # refused: still parked
    r = admin.post("/sessions/revoke", data={"csrf_token": token, "user": "otto"})
    assert r.status_code == 503 and otto.get("/", follow_redirects=False).status_code == 200   # still logged in
    letters(fake, 1)
    r = admin.post("/api/dlq/DLQ.orders/purge", json={"all": True, "why": "junk"})
    assert r.status_code == 503 and "could not be written" in r.json()["error"]   # reported, not silent
    assert '"action": "delete"' in caplog.text                                    # the record is in the log


# -- L2: privileged records are kept apart from cheap ones -------------------------------------------------------------

def test_l2_a_flood_of_cheap_actions_does_not_evict_a_privileged_record(op, fake, monkeypatch):
    from fakeredis.model import _stream
    ms = iter(range(1_700_000_000_000, 1_800_000_000_000))        # one millisecond per entry: ids order by time
    monkeypatch.setattr(_stream, "time", SimpleNamespace(time=lambda: next(ms) / 1000))
    trail = AuditTrail(fake, op.keys, max_length=10)
    trail.append({"action": "purge", "who": "ada", "at": 1})
    trail.append({"action": "start", "kind": "purge", "who": "ada", "at": 2})
    for n in range(100):
        trail.append({"action": "replay", "who": "otto", "at": 3 + n})
    trail.append({"action": "revoke", "who": "ada", "at": 200})
    rows = trail.read(1000)
    assert [r["action"] for r in rows if r["who"] == "ada"] == ["revoke", "start", "purge"]
    assert len([r for r in rows if r["action"] == "replay"]) < 100                     # the cheap stream trimmed
    assert [r["at"] for r in rows] == sorted((r["at"] for r in rows), reverse=True)      # merged by time
    page = trail.read(3)
    assert [r["at"] for r in page] == [200, 102, 101]
    assert [r["at"] for r in trail.read(3, before=page[-1]["id"])] == [100, 99, 98]


def test_l2_the_cli_audit_reads_both_streams(app, op, fake):
    from tests.unit.test_manage import run
    Audit(op).record("purge", Actor("ada", "junk"), dlq="DLQ.orders")
    Audit(op).record("replay", Actor("otto"), dlq="DLQ.orders")
    rows = json.loads(run(app, fake, "audit", "--json", ops=op).output)
    assert [r["action"] for r in rows] == ["replay", "purge"]
    assert fake.xlen(op.keys.operator_log) == 2 and fake.xlen(op.keys.operator_log_privileged) == 1   # the purge in both


# -- the overview leads with an incident ------------------------------------------------------------------------------

def test_the_overview_shows_open_breakers_with_what_they_hold_and_running_jobs_first(web, op, fake):
    viewer = client(web, auth=AS["viewer"])
    assert 'id="incident"' not in viewer.get("/").text                       # nothing in progress: nothing shown
    letters(fake, 2)
    op.breakers.pause("shop.charge", queue="orders", actor=Actor("otto"))
    (row,) = op.breakers.rows()
    fake.zadd(op.keys.breaker_held(row.queue, row.group), {f"t{n}:2": n for n in range(201)})
    job = Jobs(op, owner="a-worker").start("DLQ.orders", Selection.of(everything=True), velocity=Velocity(0.01),
                                           actor=Actor("otto"), title="redrive the charges")
    html = viewer.get("/").text
    incident = html[html.index('id="incident"'):html.index("</section>")]
    assert html.index('id="incident"') < html.index('id="queues"')          # at the top
    assert 'data-held="shop.charge">201<' in incident and "open, paused by otto" in incident
    assert 'href="/breakers"' in incident
    assert f'href="/jobs/{job.id}"' in incident and "redrive the charges" in incident
    Jobs(op).cancel(job.id)
    op.breakers.resume("shop.charge", queue="orders")
    assert 'id="incident"' not in viewer.get("/").text


def test_l1_the_cli_audits_parked_deletes_and_redeliveries(app, op, fake):
    from tests.unit.test_manage import run
    park_one(op, "t1:2")
    park_one(op, "t2:2")
    assert run(app, fake, "redeliver", "t1:2", ops=op).exit_code == 0
    assert run(app, fake, "parked", "--delete", "t2:2", "--force", ops=op).exit_code == 0
    trail = Audit(op).recent()
    assert [(r["action"], r["entries"]) for r in trail] == [("delete", ["t2:2"]), ("redeliver", ["t1:2"])]


def test_l5_open_overviews_scan_the_keyspace_once_per_interval_not_per_refresh(app, fake):
    letters(fake, 1)
    seen: list[str] = []
    now = [T0]
    op = Operator(app, broker=Counting(fake, seen), client=fake, clock=lambda: now[0])
    web = create_app(app, basic_auth=USERS, operator=op)
    pages = [client(web, auth=AS["viewer"]) for _ in range(3)]
    assert pages[0].get("/").status_code == 200
    once = seen.count("scan_iter")                     # the DLQs' shapes and the quarantines: one SCAN each
    assert 0 < once <= 2
    for _ in range(4):
        for page in pages:
            assert page.get("/api/overview").status_code == 200
        assert pages[0].get("/").status_code == 200
    assert seen.count("scan_iter") == once
    now[0] += 31
    assert pages[0].get("/api/overview").json()["depths"]["DLQ.orders"] == 1
    assert seen.count("scan_iter") == 2 * once


def test_l1_the_cli_audit_table_names_a_revoke_and_a_parked_delete(app, op, fake):
    from tests.unit.test_manage import run
    Audit(op).record("revoke", Actor("ada"), revoked_user="otto", counts={"matched": 2})
    park_one(op, "t1:2")
    op.parked.delete("t1:2", force=True, audit=Audit(op), actor=Actor("ada"))
    out = run(app, fake, "audit", ops=op).output
    assert "sessions of otto" in out and "parked retry t1:2" in out
