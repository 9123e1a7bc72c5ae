"""The web dashboard over HTTP (Starlette's test client), on fakeredis with real kombu dead letters.

Every page and action; auth refused without credentials; CSRF refused
without the token; read-only refusing actions; filters selecting exactly
what ``celery dlq list`` selects on the same data. The real ``celery dlq
web`` process with a browser is tests/integration/test_web_browser.py.
"""
from __future__ import annotations

import base64
import hashlib
import json
import re

import pytest
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from celery_dlq import cli
from celery_dlq.message import Envelope
from celery_dlq.ops import Operator
from celery_dlq.ops.window import read_window
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.sessions import SessionStore
from celery_dlq.web import create_app
from celery_dlq.web.sessions import SESSION_TTL, Sessions
from tests.unit.test_manage import UNPICKLED, Evil, dead_letter, run

CSRF = re.compile(r'name="csrf_token" value="([0-9a-f]+)"')
T0 = 1_700_000_000.0


@pytest.fixture
def op(app, fake):
    return Operator(app, broker=fake, client=fake)


@pytest.fixture
def web(app, op):
    return create_app(app, basic_auth=["alice:wonder", "bob:builder"], operator=op)


def client(asgi, *, auth=("alice", "wonder"), **kw) -> TestClient:
    """A test client of the dashboard as a browser on the same machine sees it (``Host: localhost``)."""
    kw.setdefault("base_url", "http://localhost")
    c = TestClient(asgi, **kw)
    c.auth = auth
    return c


def csrf(c: TestClient, page: str = "/") -> str:
    """The CSRF token a page of the dashboard carries for this client (its cookie is kept by the client)."""
    return CSRF.search(c.get(page).text).group(1)


def letters(fake, n: int, **kw) -> list[str]:
    return [dead_letter(fake, at=T0 + i, args=(i,), **kw).task_id for i in range(n)]


def ids_on(html: str) -> list[str]:
    return re.findall(r'<tr class="letter" data-task-id="([^"]*)"', html)


def run_job(c: TestClient, web, response) -> dict:
    """Follow an action's redirect to its job, wait for the job, return its result numbers."""
    assert response.status_code == 303, response.text
    job_id = response.headers["location"].rsplit("/", 1)[1]
    web.state.jobs.wait(job_id)
    page = c.get(response.headers["location"]).text
    result = re.search(r'id="result" data-done="(\d+)" data-missing="(\d+)" data-failed="(\d+)"', page)
    return dict(zip(("done", "missing", "failed"), map(int, result.groups())))


# -- auth ---------------------------------------------------------------------------

def test_without_credentials_pages_send_to_the_login_and_posts_are_refused(web, fake):
    letters(fake, 1)
    c = client(web, auth=None)
    for page in ("/", "/dlq/DLQ.orders", "/parked", "/dlq/DLQ.orders/confirm?action=purge&all=1"):
        r = c.get(page, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/login?next=%2F"), page
    token = csrf(c, "/login")
    r = c.post("/dlq/DLQ.orders/purge", data={"csrf_token": token, "all": "1"}, follow_redirects=False)
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic")
    assert fake.llen("DLQ.orders") == 1
    assert client(web, auth=("alice", "wrong")).get("/").status_code == 401
    assert client(web, auth=("mallory", "wonder")).get("/").status_code == 401
    assert client(web, auth=("bob", "builder")).get("/").status_code == 200


def test_login_form_sets_a_session_for_any_user_and_logout_ends_it(web):
    c = client(web, auth=None)
    token = csrf(c, "/login")
    bad = c.post("/login", data={"csrf_token": token, "user": "alice", "password": "nope", "next": "/parked"})
    assert bad.status_code == 401 and "wrong user or password" in bad.text
    r = c.post("/login", data={"csrf_token": token, "user": "bob", "password": "builder", "next": "/parked"},
               follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/parked"
    assert "Parked retries" in c.get("/parked").text and "bob" in c.get("/").text
    for away in ("//evil.example/", "/\\evil.example/", "https://evil.example/"):  # no open redirect
        token = csrf(c, "/login")   # bound to the session: each login's new session needs its own token
        evil = c.post("/login", data={"csrf_token": token, "user": "bob", "password": "builder", "next": away},
                      follow_redirects=False)
        assert evil.headers["location"] == "/", away
    assert c.post("/logout", data={"csrf_token": csrf(c)}, follow_redirects=False).status_code == 303
    assert c.get("/", follow_redirects=False).status_code == 303


def test_forged_expired_or_ended_sessions_are_refused_and_redis_holds_no_cookie(fake):
    now = [T0]
    sessions = Sessions(SessionStore(fake, Keys("p")), clock=lambda: now[0])
    cookie = sessions.create("alice", "10.0.0.1")
    assert sessions.user(cookie) == "alice"
    assert not [k for k in fake.keys("*") if cookie.encode() in k] and cookie.encode() not in fake.dump(
        Keys("p").web_sessions)                                                      # only its SHA-256 is stored
    assert sessions.user(cookie[:-1] + ("A" if cookie[-1] != "A" else "B")) is None   # a guessed neighbour
    assert sessions.user("") is None and sessions.user("x" * 500) is None
    assert fake.ttl(Keys("p").web_session(hashlib.sha256(cookie.encode()).hexdigest())) == SESSION_TTL
    now[0] = T0 + SESSION_TTL + 1                                     # expired, even before Redis drops it
    assert sessions.user(cookie) is None and sessions.list() == []
    now[0] = T0
    sessions.end(cookie)
    assert sessions.user(cookie) is None


def test_token_from_setting_or_env_as_bearer_or_login(app, op, monkeypatch):
    app.conf.dlq_web_token = "s3cret-token"
    web = create_app(app, operator=op)
    assert client(web, auth=None, headers={"Authorization": "Bearer s3cret-token"}).get("/").status_code == 200
    assert client(web, auth=None, headers={"Authorization": "Bearer nope"}).get("/").status_code == 401
    c = client(web, auth=None)
    r = c.post("/login", data={"csrf_token": csrf(c, "/login"), "user": "token", "password": "s3cret-token"},
               follow_redirects=False)
    assert r.status_code == 303 and c.get("/").status_code == 200
    monkeypatch.setenv("CELERY_DLQ_WEB_TOKEN", "from-env")
    web = create_app(app, operator=op)
    assert client(web, auth=None, headers={"Authorization": "Bearer from-env"}).get("/").status_code == 200
    assert client(web, auth=("token", "s3cret-token")).get("/").status_code == 401


def test_no_credentials_is_an_error_and_no_auth_serves_loopback_only(op):
    bare = Celery("bare", broker="redis://127.0.0.1:1/0", set_as_current=False)
    with pytest.raises(ValueError, match="needs credentials"):
        create_app(bare, operator=op)
    web = create_app(bare, no_auth=True, operator=op)
    assert client(web, auth=None, client=("127.0.0.1", 4000)).get("/").status_code == 200
    assert client(web, auth=None, client=("10.1.2.3", 4000)).get("/").status_code == 403


def test_cli_refuses_no_auth_off_loopback_and_bad_basic_auth(app, fake):
    result = run(app, fake, "web", "--no-auth", "--bind", "0.0.0.0")
    assert result.exit_code == 2 and "--no-auth is only allowed with --bind 127.0.0.1" in result.output
    result = run(app, fake, "web", "--basic-auth", "alice")
    assert result.exit_code == 2 and "user:password" in result.output
    result = run(app, fake, "web")
    assert result.exit_code == 2 and "needs credentials" in result.output
    assert "--read-only" in CliRunner().invoke(cli.dlq, ["web", "--help"],
                                               obj=CLIContext(app=app, no_color=True, workdir=None)).output


# -- CSRF and read-only -----------------------------------------------------------------

#: Every POST route, each verb it takes, and the action (role check) it needs; None: the login and logout.
POST_ROUTES = {
    "/dlq/{name}/{verb}": [("/dlq/DLQ.orders/replay", "replay"), ("/dlq/DLQ.orders/purge", "purge")],
    "/parked/{verb}": [("/parked/redeliver", "redeliver"), ("/parked/delete", "delete")],
    "/api/dlq/{name}/{verb}": [("/api/dlq/DLQ.orders/replay", "replay"), ("/api/dlq/DLQ.orders/purge", "purge")],
    "/api/parked/{verb}": [("/api/parked/redeliver", "redeliver"), ("/api/parked/delete", "delete")],
    "/login": [("/login", None)],
    "/logout": [("/logout", None)],
    "/sessions/revoke": [("/sessions/revoke", "revoke")],
    "/jobs/{job_id}/{action}": [("/jobs/j1/pause", "job"), ("/jobs/j1/resume", "job"), ("/jobs/j1/cancel", "job")],
    "/api/jobs/{job_id}/{action}": [("/api/jobs/j1/pause", "job"), ("/api/jobs/j1/cancel", "job")],
    "/dlq/{name}/letters/{task_id}/edit": [("/dlq/DLQ.orders/letters/t1/edit", "edit")],
    "/breakers/{verb}": [("/breakers/pause", "pause"), ("/breakers/resume", "resume")],
}


def post_routes(web) -> list[tuple[str, str | None]]:
    """(path, action) of every POST the app has; a new POST route fails here until it is listed above."""
    routes = {r.path for r in web.routes if "POST" in (getattr(r, "methods", None) or ())}
    assert routes == set(POST_ROUTES)
    return [example for route in sorted(routes) for example in POST_ROUTES[route]]


def post(c: TestClient, path: str, token: str | None, form: dict, **kw):
    """POST ``form`` as the page would (with its CSRF token), or as JSON to an /api/ route (its CSRF defence)."""
    if path.startswith("/api/"):
        return c.post(path, json={"ids": [form["id"]], "entry_id": form["entry_id"]}, **kw)
    return c.post(path, data=dict(form, **({"csrf_token": token} if token else {})), **kw)


def test_every_post_without_or_with_a_wrong_csrf_token_is_refused_and_changes_nothing(web, fake, op):
    ids = letters(fake, 2)
    op.sharded.home.store.park("t1:2", Envelope(b"[]", None, None, {}, {}, "", "orders", "orders").dumps(), "orders", T0)
    c = client(web)
    good = csrf(c)
    form = {"all": "1", "id": ids[0], "entry_id": "t1:2", "user": "alice", "password": "wonder"}
    for path, _ in post_routes(web):
        if path.startswith("/api/"):   # a form (what another site can send) instead of JSON
            attempts = [c.post(path, data=dict(form, csrf_token=good)),
                        c.post(path, content=json.dumps({"all": True}), headers={"content-type": "text/plain"})]
        else:
            attempts = [c.post(path, data=dict(form, **({"csrf_token": token} if token else {})),
                               follow_redirects=False)
                        for token in (None, "0" * 64, good[:-1] + ("0" if good[-1] != "0" else "1"))]
        for r in attempts:
            assert r.status_code == 403 and "CSRF" in r.text, (path, r.text)
    other = client(web)  # a token is bound to its browser's cookie: another's is refused
    assert other.post("/dlq/DLQ.orders/purge", data=dict(form, csrf_token=good)).status_code == 403
    assert fake.llen("DLQ.orders") == 2 and op.parked.sharded.count() == 1


def test_read_only_hides_and_refuses_every_action(app, op, fake):
    ids = letters(fake, 2)
    op.sharded.home.store.park("t1:2", Envelope(b"[]", None, None, {}, {}, "", "orders", "orders").dumps(), "orders", T0)
    web = create_app(app, basic_auth=["alice:wonder"], read_only=True, operator=op)
    c = client(web)
    for page in ("/dlq/DLQ.orders", f"/dlq/DLQ.orders/letters/{ids[0]}", "/parked"):
        html = c.get(page).text
        assert "read-only" in html and "Replay" not in html and "Purge" not in html and "Redeliver" not in html
    assert c.get("/dlq/DLQ.orders/confirm?action=replay&all=1").status_code == 403
    token = csrf(c)
    for path, action in post_routes(web):
        if action:
            r = post(c, path, token, {"all": "1", "id": ids[0], "entry_id": "t1:2"})
            assert r.status_code == 403 and "read-only" in r.text, path
    assert fake.llen("DLQ.orders") == 2 and op.parked.sharded.count() == 1


# -- pages ---------------------------------------------------------------------------

def test_overview_shows_each_dlq_depth_queue_parked_oldest_age_and_counters(app, fake, op):
    letters(fake, 3)
    dead_letter(fake, queue="mail")
    op.sharded.home.store.park("t1:2", Envelope(b"[]", None, None, {}, {}, "", "orders", "orders").dumps(), "orders", T0)
    app.conf.broker_url = "redis://:hunter2@127.0.0.1:1/0"
    web = create_app(app, basic_auth=["alice:wonder"], refresh=7, operator=op)
    html = client(web).get("/").text
    rows = re.findall(r'<a href="/dlq/([^"]+)">[^<]+</a></td>\s*<td>([^<]+)</td>\s*<td class="num"[^>]*>(\d+)</td>'
                      r'\s*<td class="num">(?:<a [^>]+>)?(\d+)', html)
    assert sorted(rows) == [("DLQ.mail", "mail", "1", "0"), ("DLQ.orders", "orders", "3", "1")]
    assert re.search(r"DLQ.orders.*?<td>\d{3,}d( \d+[hms])? ago</td>", html, re.S)  # the oldest: T0, in 2023
    assert '<span class="hint">dead_letters_now</span></th><td class="num" data-stat="dead_letters_now">4</td>' in html
    assert '<span class="hint">parked_now</span></th><td class="num" data-stat="parked_now">1</td>' in html
    assert '<noscript><meta http-equiv="refresh" content="7"></noscript>' in html   # without JavaScript
    assert 'id="refresh" data-url="/api/overview" data-every="7"' in html and "/static/refresh.js" in html
    assert "hunter2" not in html and "redis://:**@127.0.0.1:1/0" in html


def test_dlq_page_pages_from_either_end_with_next_links(web, fake):
    ids = letters(fake, 7)  # oldest first
    c = client(web)
    newest = c.get("/dlq/DLQ.orders?size=20").text
    assert ids_on(newest) == ids[::-1] and 'id="next"' not in newest
    oldest = c.get("/dlq/DLQ.orders?order=oldest&size=20").text
    assert ids_on(oldest) == ids
    assert c.get("/dlq/DLQ.orders?size=7").status_code == 400  # sizes are a fixed menu
    shown, url = [], "/dlq/DLQ.orders?order=oldest&size=20&start=0"
    fake_many = letters(fake, 40)
    everything = ids + fake_many
    while url:
        html = c.get(url).text
        shown += ids_on(html)
        nxt = re.search(r'id="next" href="([^"]+)"', html)
        url = nxt.group(1).replace("&amp;", "&") if nxt else None
    assert shown == everything


def test_window_reads_only_the_page_and_bounds_a_filtered_scan(op, fake):
    letters(fake, 30)
    dead_letter(fake, task="shop.mail", at=T0 + 99)
    dead = op.queue("orders")
    calls = []
    real = fake.lrange
    fake.lrange = lambda key, a, b: calls.append((a, b)) or real(key, a, b)
    window = read_window(dead, 5, 10, newest_first=True)
    assert calls == [(5, 14)] and [n for n, _ in window.letters] == list(range(5, 15))
    assert window.next_start == 15 and window.total == 31
    calls.clear()
    from celery_dlq.ops.letters import Filter
    window = read_window(dead, 0, 10, newest_first=False, where=Filter(task_name="shop.mail"), scan=12)
    assert window.letters == [] and window.scanned == 12 and window.next_start == 12  # stopped at the budget
    window = read_window(dead, 12, 10, newest_first=False, where=Filter(task_name="shop.mail"))
    assert [letter.task_name for _, letter in window.letters] == ["shop.mail"] and window.next_start is None


@pytest.mark.parametrize("params, options", [
    ({"task": "shop.charge"}, ["--task", "shop.charge"]),
    ({"task": "shop.*"}, ["--task", "shop.*"]),
    ({"reason": "non_retryable"}, ["--reason", "non_retryable"]),
    ({"exception": "KeyError"}, ["--exception", "KeyError"]),
    ({"original_queue": "orders"}, ["--original-queue", "orders"]),
    ({"since": str(T0 + 2), "until": str(T0 + 5)}, ["--since", str(T0 + 2), "--until", str(T0 + 5)]),
    ({"grep": "DECLINED 3"}, ["--grep", "DECLINED 3"]),
    ({"task": "shop.#", "reason": "max_delivery_attempts", "grep": "declined"},
     ["--task", "shop.#", "--reason", "max_delivery_attempts", "--grep", "declined"]),
])
def test_filters_select_what_celery_dlq_list_selects(app, fake, web, params, options):
    for i in range(6):
        dead_letter(fake, task=("shop.charge", "shop.mail", "billing.refund")[i % 3], at=T0 + i, args=(i,),
                    exc=ValueError(f"card declined {i}") if i % 2 else KeyError(f"no key {i}"),
                    reason="non_retryable" if i == 4 else "max_delivery_attempts")
    listed = run(app, fake, "list", "orders", "--limit", "0", "--json", *options)
    expected = [entry["task_id"] for entry in json.loads(listed.output.split("\nError")[0] or "[]")]
    html = client(web).get("/dlq/DLQ.orders", params=dict(params, order="oldest", size="200")).text
    assert ids_on(html) == expected and expected  # every case matches something
    for name, value in params.items():  # the filter is in the form, for the next click
        assert f'value="{value}"' in html or f"<option selected>{value}</option>" in html


def test_bad_filters_and_unknown_queues_are_clear_errors(web, fake):
    letters(fake, 1)
    c = client(web)
    r = c.get("/dlq/DLQ.orders?since=yesterday")
    assert r.status_code == 400 and "use unix seconds, ISO 8601, or an age" in r.text
    assert c.get("/dlq/DLQ.orders?reason=bored").status_code == 400
    assert c.get("/dlq/DLQ.orders?order=sideways").status_code == 400
    r = c.get("/dlq/nope")
    assert r.status_code == 404 and "unknown dead-letter queue" in r.text


def test_letter_page_shows_headers_arguments_and_traceback(web, fake):
    letter = dead_letter(fake, args=(7, "x"), kwargs={"card": "4242"}, exc=ValueError("card declined"))
    c = client(web)
    html = c.get(f"/dlq/DLQ.orders/letters/{letter.task_id}?at=0").text
    for header in letter.headers:
        if header.startswith("x-dlq-") and header != "x-dlq-traceback":
            assert f"<th>{header}</th>" in html
    assert re.search(r'<pre id="args">\[\s*7,\s*&#34;x&#34;\s*\]</pre>', html)
    assert "&#34;card&#34;: &#34;4242&#34;" in html
    assert 'id="traceback">' in html and "ValueError" in html
    assert c.get(f"/dlq/DLQ.orders/letters/{letter.task_id}?at=99").status_code == 200  # found without the hint
    gone = c.get("/dlq/DLQ.orders/letters/not-there")
    assert gone.status_code == 404 and "replayed or purged" in gone.text


def test_letter_outside_accept_content_is_shown_as_bytes_never_deserialized(web, fake):
    UNPICKLED.clear()
    letter = dead_letter(fake, args=(Evil(),), serializer="pickle")
    html = client(web).get(f"/dlq/DLQ.orders/letters/{letter.task_id}").text
    assert "application/x-python-serialize is not in the app's accept_content" in html
    assert f'id="body">{base64.b64encode(letter.body).decode()}<' in html and 'id="args"' not in html
    client(web).get("/dlq/DLQ.orders")
    assert UNPICKLED == []


# -- actions ---------------------------------------------------------------------------

def test_replay_matching_confirms_the_count_then_moves_them(web, fake):
    charge = [dead_letter(fake, task="shop.charge", at=T0 + i).task_id for i in range(3)]
    mail = [dead_letter(fake, task="shop.mail", at=T0 + 10 + i).task_id for i in range(2)]
    c = client(web)
    html = c.get("/dlq/DLQ.orders?task=shop.charge").text
    link = re.search(r'id="replay-matching" href="([^"]+)"', html).group(1).replace("&amp;", "&")
    confirm = c.get(link).text
    assert "<strong>3</strong> dead letters to their original queue" in confirm
    token = CSRF.findall(confirm)[-1]
    r = c.post("/dlq/DLQ.orders/replay", data={"csrf_token": token, "task": "shop.charge"}, follow_redirects=False)
    assert run_job(c, web, r) == {"done": 3, "missing": 0, "failed": 0}
    moved = [json.loads(raw)["headers"]["id"] for raw in reversed(fake.lrange("orders", 0, -1))]
    assert moved == charge
    assert ids_on(c.get("/dlq/DLQ.orders?order=oldest").text) == mail


def test_replay_to_another_queue_and_purge_selected(web, fake, app):
    ids = letters(fake, 4)
    app.conf.task_routes = {"shop.slow_*": {"queue": "orders.slow"}}   # a queue the app routes to
    c = client(web)
    confirm = c.get("/dlq/DLQ.orders/confirm", params=[("action", "replay"), ("id", ids[0]), ("id", ids[1])]).text
    assert "<strong>2</strong> dead letters" in confirm
    r = c.post("/dlq/DLQ.orders/replay", data={"csrf_token": CSRF.findall(confirm)[-1], "id": [ids[0], ids[1]],
                                               "to": "orders.slow"}, follow_redirects=False)
    assert run_job(c, web, r)["done"] == 2 and fake.llen("orders.slow") == 2
    confirm = c.get("/dlq/DLQ.orders/confirm", params={"action": "purge", "id": ids[2]}).text
    assert "delete for good <strong>1</strong> dead letter." in confirm
    r = c.post("/dlq/DLQ.orders/purge", data={"csrf_token": csrf(c), "id": ids[2], "why": "junk"},
               follow_redirects=False)
    assert run_job(c, web, r) == {"done": 1, "missing": 0, "failed": 0}
    assert ids_on(c.get("/dlq/DLQ.orders").text) == [ids[3]]
    r = c.post("/dlq/DLQ.orders/replay", data={"csrf_token": csrf(c), "id": ids[3], "to": "DLQ.orders"})
    assert r.status_code == 400 and "into itself" in r.text


def test_action_on_letters_someone_else_moved_reports_them_gone(web, fake, op):
    ids = letters(fake, 2)
    c = client(web)
    confirm = c.get("/dlq/DLQ.orders/confirm", params=[("action", "replay"), ("id", ids[0]), ("id", ids[1])]).text
    op.queue("orders").purge(force=True)  # another operator, between the confirmation and the click
    r = c.post("/dlq/DLQ.orders/replay", data={"csrf_token": CSRF.findall(confirm)[-1], "id": ids},
               follow_redirects=False)
    assert run_job(c, web, r) == {"done": 0, "missing": 2, "failed": 0}
    assert "Nothing to do" in c.get("/dlq/DLQ.orders/confirm", params={"action": "purge", "id": ids[0]}).text


def test_replay_of_thousands_runs_in_the_background_with_progress(web, fake):
    pipe = fake.pipeline()
    letter = dead_letter(fake)
    for i in range(2999):
        pipe.lpush("DLQ.orders", json.dumps(dict(letter.message, headers=dict(letter.headers, id=f"id-{i}"))))
    pipe.execute()
    c = client(web)
    confirm = c.get("/dlq/DLQ.orders/confirm?action=replay&all=1").text
    assert "<strong>3000</strong>" in confirm
    r = c.post("/dlq/DLQ.orders/replay", data={"csrf_token": csrf(c), "all": "1", "expected": "3000"},
               follow_redirects=False)
    job = web.state.jobs.get(r.headers["location"].rsplit("/", 1)[1])
    assert job.total == 3000
    assert run_job(c, web, r)["done"] == 3000 and job.done == 3000 and fake.llen("orders") == 3000
    assert "Replay every dead letter of DLQ.orders" in c.get("/").text  # listed under recent actions


def test_parked_retries_list_redeliver_now_and_delete(web, op, fake):
    store = op.sharded.home.store
    letter = dead_letter(fake, task="shop.charge")
    for n in (1, 2):
        env = Envelope(b"[]", None, None, dict(letter.headers, id=f"t{n}", task="shop.charge"), {}, "", "orders",
                       "orders")
        store.park(f"t{n}:2", env.dumps(), "orders", 4_000_000_000.0)
    c = client(web)
    html = c.get("/parked").text
    assert len(re.findall(r'<tr class="retry"', html)) == 2 and "shop.charge" in html
    assert c.get("/parked?queue=mail").text.count('<tr class="retry"') == 0
    r = c.post("/parked/redeliver", data={"csrf_token": csrf(c), "entry_id": "t1:2"})
    assert r.status_code == 200 and 'data-n="1"' in r.text
    assert store.get("t1:2").due <= store.clock()
    r = c.post("/parked/delete", data={"csrf_token": csrf(c), "entry_id": "t2:2"})
    assert 'data-n="1"' in r.text and store.get("t2:2") is None
    again = c.post("/parked/delete", data={"csrf_token": csrf(c), "entry_id": "t2:2"})
    assert again.status_code == 200 and "Gone already" in again.text


def test_mounted_inside_another_app_links_and_cookies_carry_the_prefix(app, op, fake):
    ids = letters(fake, 1)
    site = Starlette(routes=[Mount("/ops/dlq", app=create_app(app, basic_auth=["alice:wonder"], operator=op))])
    c = client(site, auth=None)
    r = c.get("/ops/dlq/", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ops/dlq/login?next=%2F"
    login = c.get("/ops/dlq/login")
    assert 'action="/ops/dlq/login"' in login.text and 'href="/ops/dlq/static/style.css"' in login.text
    r = c.post("/ops/dlq/login", data={"csrf_token": CSRF.search(login.text).group(1), "user": "alice",
                                       "password": "wonder"}, follow_redirects=False)
    assert r.headers["location"] == "/ops/dlq/"
    html = c.get("/ops/dlq/dlq/DLQ.orders").text
    assert f'href="/ops/dlq/dlq/DLQ.orders/letters/{ids[0]}' in html
    assert c.get("/ops/dlq/static/style.css").status_code == 200


def test_templates_and_stylesheet_are_package_data():
    try:
        import tomllib
    except ModuleNotFoundError:   # Python 3.10
        import tomli as tomllib
    from importlib.resources import files
    from pathlib import Path

    data = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    patterns = data["tool"]["setuptools"]["package-data"]["celery_dlq"]
    shipped = files("celery_dlq.web")
    for pattern, folder in (("web/templates/*.html", "templates"), ("web/static/*", "static")):
        assert pattern in patterns
        assert any(p.name.endswith((".html", ".css")) for p in shipped.joinpath(folder).iterdir())


def test_redis_down_is_a_clear_503_with_sanitized_urls():
    app = Celery("down", broker="redis://:hunter2@127.0.0.1:1/0", set_as_current=False)
    web = create_app(app, basic_auth=["alice:wonder"])
    c = client(web)
    for page in ("/", "/dlq/DLQ.orders", "/parked"):
        r = c.get(page)
        assert r.status_code == 503 and "cannot read Redis (ConnectionError)" in r.text, page
        assert "hunter2" not in r.text and "127.0.0.1:1" not in r.text   # nobody logged in: no host named (L7)
    assert c.get("/jobs/nope").status_code == 503    # no login without Redis: sessions and login counts live there


def test_unknown_jobs_are_a_404(web):
    assert client(web).get("/jobs/nope").status_code == 404
    assert client(web).get("/api/jobs/nope").json() == {"error": "no such job (ended jobs are kept for a week)"}


def test_ages_and_times_read_as_people_say_them():
    from celery_dlq.web.format import age, at, due_in

    assert at(T0) == "2023-11-14 22:13:20" and at(None) == "-"
    assert age(T0 - 3 * 86400 - 60, now=T0) == "3d" and age(T0 - 3 * 86400 - 7200, now=T0) == "3d 2h"
    assert age(T0 - 125, now=T0) == "2m 5s" and age(T0, now=T0) == "0s" and age(T0 + 5, now=T0) == "0s"
    assert due_in(T0 + 3599, now=T0) == "in 59m 59s" and due_in(T0 - 1, now=T0) == "now"


def test_letters_that_cannot_be_replayed_are_listed_as_failed_with_the_reason(web, fake):
    good = letters(fake, 1)
    fake.lpush("DLQ.orders", b"not a kombu message at all")
    c = client(web)
    r = c.post("/dlq/DLQ.orders/replay", data={"csrf_token": csrf(c), "all": "1"}, follow_redirects=False)
    assert run_job(c, web, r) == {"done": 1, "missing": 0, "failed": 1}
    page = c.get(r.headers["location"]).text
    assert "&lt;unknown id&gt;: not a kombu message" in page
    assert [json.loads(raw)["headers"]["id"] for raw in fake.lrange("orders", 0, -1)] == good
    assert fake.lrange("DLQ.orders", 0, -1) == [b"not a kombu message at all"]  # kept, not lost
