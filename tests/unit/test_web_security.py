"""The dashboard as a security reviewer reads it: allowed hosts, trusted proxies, roles, sessions, login limits,
headers, users and hashed passwords (Starlette's test client, fakeredis).

The real ``celery dlq web`` processes on a real redis-server (a password
never in argv, the login limit shared by two processes):
tests/integration/test_web_security.py.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from celery.bin.base import CLIContext
from click.testing import CliRunner
from starlette.testclient import TestClient

from celery_dlq import cli
from celery_dlq.message import Envelope
from celery_dlq.ops import Operator
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.throttle import ThrottleStore
from celery_dlq.web import auth, create_app
from celery_dlq.web.origin import Origin, bind_hosts, split_host
from celery_dlq.web.throttle import LoginThrottle
from celery_dlq.web.users import ADMIN, OPERATOR, VIEWER, check, hash_password, may, parse_users, read_users_file
from tests.unit.test_manage import run
from tests.unit.test_web import T0, client, csrf, letters, post, post_routes

USERS = ["vera:viewer:v-pass", "otto:operator:o-pass", "ada:admin:a-pass"]
AS = {VIEWER: ("vera", "v-pass"), OPERATOR: ("otto", "o-pass"), ADMIN: ("ada", "a-pass")}


@pytest.fixture
def op(app, fake):
    return Operator(app, broker=fake, client=fake)


@pytest.fixture
def web(app, op):
    return create_app(app, basic_auth=USERS, operator=op)


def park_one(op) -> None:
    op.sharded.home.store.park("t1:2", Envelope(b"[]", None, None, {}, {}, "", "orders", "orders").dumps(), "orders", T0)


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf_token" value="([0-9a-f]+)"', html).group(1)


def log_in(c: TestClient, user: str, password: str, **kw):
    return c.post("/login", data={"csrf_token": csrf(c, "/login"), "user": user, "password": password},
                  follow_redirects=False, **kw)


# -- allowed hosts ----------------------------------------------------------------------

@pytest.mark.parametrize("no_auth", [False, True], ids=["login", "no-auth"])
def test_a_foreign_host_header_is_refused_before_anything_else(app, op, no_auth):
    web = create_app(app, basic_auth=[] if no_auth else USERS, no_auth=no_auth, operator=op)
    kw = {"auth": None, "client": ("127.0.0.1", 4000)} if no_auth else {"auth": AS[ADMIN]}
    for host in ("evil.example", "evil.example:5580", "127.0.0.1.evil.example", "localhost.evil.example"):
        r = client(web, base_url=f"http://{host}", **kw).get("/")    # a DNS-rebinding page's request
        assert r.status_code == 400 and "host name" in r.text, host
        assert r.headers["x-frame-options"] == "DENY" and "csrf_token" not in r.text
        assert "Set-Cookie" not in r.headers
    for host in ("localhost", "localhost:5580", "127.0.0.1:80", "[::1]:5580", "LOCALHOST"):
        assert client(web, base_url=f"http://{host}", **kw).get("/").status_code == 200, host
    assert client(web, headers={"host": ""}, **kw).get("/").status_code == 400


def test_allowed_hosts_with_a_port_match_that_port_only_and_the_cli_default_is_the_bound_address():
    origin = Origin(["dlq.example.com", "ops.internal:8443"])
    assert origin.host_allowed("dlq.example.com:443") and origin.host_allowed("DLQ.example.com")
    assert origin.host_allowed("ops.internal:8443") and not origin.host_allowed("ops.internal:8444")
    assert not origin.host_allowed("ops.internal") and not origin.host_allowed("localhost")
    assert split_host("[::1]:80") == ("[::1]", "80") and split_host("[::1]") == ("[::1]", "")
    assert bind_hosts("127.0.0.1", 5580) == ["127.0.0.1:5580", "localhost:5580", "[::1]:5580"]
    assert bind_hosts("::1", 80) == ["[::1]:80", "localhost:80", "127.0.0.1:80"]
    assert bind_hosts("0.0.0.0", 80) == ["localhost:80", "127.0.0.1:80", "[::1]:80"]   # the name: --allowed-host
    assert bind_hosts("10.1.2.3", 80)[0] == "10.1.2.3:80"
    assert Origin(["*"]).host_allowed("anything.example")     # mounted in a site that checks Host itself


def test_any_host_cannot_go_with_no_auth(app, op):
    with pytest.raises(ValueError, match="DNS rebinding"):
        create_app(app, no_auth=True, allowed_hosts=["*"], operator=op)


# -- trusted proxies ----------------------------------------------------------------------

def test_secure_cookies_follow_x_forwarded_proto_only_from_a_trusted_proxy(app, op):
    web = create_app(app, basic_auth=USERS, operator=op, trusted_proxies=["10.0.0.1", "10.9.0.0/16"])
    https = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "198.51.100.7"}
    for proxy, secure in (("10.0.0.1", True), ("10.9.3.4", True), ("10.0.0.2", False), ("127.0.0.1", False)):
        c = client(web, auth=None, client=(proxy, 4000), headers=https)
        page = c.get("/login")                  # the cookie jar keeps a Secure cookie from http://: send it by hand
        nonce_cookie = page.headers["set-cookie"]
        assert ("secure" in nonce_cookie.lower()) is secure, proxy
        r = c.post("/login", data={"csrf_token": csrf_of(page.text), "user": "vera", "password": "v-pass"},
                   headers={"cookie": nonce_cookie.split(";")[0]}, follow_redirects=False)
        assert r.status_code == 303, r.text
        session = r.headers["set-cookie"]
        assert session.startswith("dlq_session=") and ("secure" in session.lower()) is secure, proxy
        assert "httponly" in session.lower() and "samesite=strict" in session.lower()
    sessions = web.state.sessions.list()
    assert [s.address for s in sessions] == ["198.51.100.7", "198.51.100.7", "10.0.0.2", "127.0.0.1"]


def test_the_client_is_the_rightmost_address_no_trusted_proxy_added():
    origin = Origin(trusted_proxies=["10.0.0.0/8"])
    assert origin.client(["203.0.113.9, 198.51.100.7, 10.0.0.3"], "10.0.0.1") == "198.51.100.7"   # spoofed first hop
    assert origin.client(["10.0.0.5", "10.0.0.3"], "10.0.0.1") == "10.0.0.5"
    assert origin.client([], "10.0.0.1") == "10.0.0.1"
    with pytest.raises(ValueError, match="--trusted-proxy takes an IP address or network"):
        Origin(trusted_proxies=["proxy.example"])


def test_no_auth_serves_the_real_loopback_client_behind_a_trusted_proxy_and_refuses_untrusted_forwarding(app, op):
    behind = create_app(app, no_auth=True, operator=op, trusted_proxies=["127.0.0.1"])
    local = client(behind, auth=None, client=("127.0.0.1", 4000))
    assert local.get("/", headers={"X-Forwarded-For": "127.0.0.1"}).status_code == 200
    assert local.get("/", headers={"X-Forwarded-For": "203.0.113.5"}).status_code == 403   # a remote client
    plain = create_app(app, no_auth=True, operator=op)
    local = client(plain, auth=None, client=("127.0.0.1", 4000))
    assert local.get("/").status_code == 200
    for header in ("X-Forwarded-For", "X-Real-IP", "Forwarded"):   # a proxy nobody named: everyone looks local
        r = local.get("/", headers={header: "127.0.0.1"})
        assert r.status_code == 403 and "--trusted-proxy" in r.text, header
    assert client(plain, auth=None, client=("10.0.0.9", 4000), headers={"X-Forwarded-For": "127.0.0.1"}).get(
        "/").status_code == 403


# -- roles -------------------------------------------------------------------------------

def test_each_role_is_refused_what_it_may_not_do_on_every_html_and_api_route(web, fake, op, caplog):
    ids = letters(fake, 2)
    park_one(op)
    for role, (user, password) in AS.items():
        c = client(web, auth=(user, password))
        token = csrf(c)
        for path, action in post_routes(web):
            if action is None or may(role, action):
                continue
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="celery_dlq.web"):
                r = post(c, path, token, {"all": "1", "id": ids[0], "entry_id": "t1:2"})
            assert r.status_code == 403 and f"your role ({role}) may not {action}" in r.text, (role, path)
            (record,) = [rec for rec in caplog.records if "refused" in rec.getMessage()]
            assert record.levelname == "WARNING" and repr(user) in record.getMessage()
            assert f"role {role}" in record.getMessage() and action in record.getMessage()
            assert password not in caplog.text
        if not may(role, "replay"):
            assert client(web, auth=(user, password)).get("/dlq/DLQ.orders/confirm?action=replay&all=1"
                                                          ).status_code == 403
    assert fake.llen("DLQ.orders") == 2 and op.parked.sharded.count() == 1


def test_a_viewer_cannot_replay_and_an_operator_cannot_purge_but_may_replay_html_and_api(web, fake):
    ids = letters(fake, 3)
    viewer, operator, admin = (client(web, auth=AS[role]) for role in (VIEWER, OPERATOR, ADMIN))
    assert viewer.post("/dlq/DLQ.orders/replay", data={"csrf_token": csrf(viewer), "all": "1"}).status_code == 403
    assert viewer.post("/api/dlq/DLQ.orders/replay", json={"all": True}).status_code == 403
    assert operator.post("/dlq/DLQ.orders/purge", data={"csrf_token": csrf(operator), "all": "1"}).status_code == 403
    assert operator.post("/api/dlq/DLQ.orders/purge", json={"all": True}).json() == {
        "error": "your role (operator) may not purge (nothing was changed)"}
    assert fake.llen("DLQ.orders") == 3
    started = operator.post("/api/dlq/DLQ.orders/replay", json={"ids": [ids[0]]})
    assert started.status_code == 202
    web.state.jobs.wait(started.json()["job_id"])
    status = operator.get(started.json()["url"]).json()
    assert status["done"] == 1 and status["user"] == "otto" and not status["running"]
    assert operator.post("/api/dlq/DLQ.nope/replay", json={"all": True}).json()["error"].startswith("unknown dead-letter queue")
    assert operator.post("/api/dlq/DLQ.orders/replay", json={"filter": {"since": "soon"}}).status_code == 400
    typo = operator.post("/api/dlq/DLQ.orders/replay", json={"filter": {"tsak": "shop.charge"}})
    assert typo.status_code == 400 and "unknown field 'tsak'" in typo.json()["error"]
    r = admin.post("/dlq/DLQ.orders/purge", data={"csrf_token": csrf(admin), "id": ids[1], "why": "junk"},
                   follow_redirects=False)
    assert web.state.jobs.wait(r.headers["location"].rsplit("/", 1)[1]).outcome.done == 1
    fake.rpush("elsewhere", b"{}")                                         # a list kombu holds: a known queue
    matching = operator.post("/api/dlq/DLQ.orders/replay", json={"filter": {"task": "shop.*"}, "to": "elsewhere"})
    assert web.state.jobs.wait(matching.json()["job_id"]).outcome.done == 1 and fake.llen("elsewhere") == 2
    assert fake.llen("DLQ.orders") == 0


def test_buttons_are_shown_only_to_roles_that_may_use_them(web, fake, op):
    ids = letters(fake, 1)
    park_one(op)
    pages = ("/dlq/DLQ.orders", f"/dlq/DLQ.orders/letters/{ids[0]}", "/parked")
    seen = {role: " ".join(client(web, auth=AS[role]).get(p).text for p in pages) for role in AS}
    assert not re.search(r"Replay|Purge|Redeliver|>Delete<", seen[VIEWER]) and "(viewer)" in seen[VIEWER]
    assert "Replay" in seen[OPERATOR] and "Redeliver now" in seen[OPERATOR]
    assert "Purge" not in seen[OPERATOR] and ">Delete<" not in seen[OPERATOR]
    assert all(word in seen[ADMIN] for word in ("Replay", "Purge", "Redeliver now", ">Delete<"))


def test_the_token_is_an_admin_unless_configured_and_read_only_makes_everyone_a_viewer(app, op, fake):
    letters(fake, 1)
    bearer = {"Authorization": "Bearer t0ken"}
    admin = client(create_app(app, token="t0ken", operator=op), auth=None, headers=bearer)
    assert "Purge all" in admin.get("/dlq/DLQ.orders").text
    viewer = client(create_app(app, token="t0ken", token_role=VIEWER, operator=op), auth=None, headers=bearer)
    assert viewer.post("/api/dlq/DLQ.orders/replay", json={"all": True}).status_code == 403
    read_only = create_app(app, basic_auth=USERS, read_only=True, operator=op)
    r = client(read_only, auth=AS[ADMIN]).post("/api/dlq/DLQ.orders/purge", json={"all": True})
    assert r.status_code == 403 and "read-only" in r.text and fake.llen("DLQ.orders") == 1
    with pytest.raises(ValueError, match="token_role"):
        create_app(app, token="t0ken", token_role="root", operator=op)
    access = create_app(app, basic_auth=USERS, token="t0ken", operator=op).state.access
    assert "t0ken" not in repr(access) and "a-pass" not in repr(access)


# -- sessions ----------------------------------------------------------------------------

def test_a_revoked_session_is_refused_in_every_process(app, op, fake, web):
    other_process = create_app(app, basic_auth=USERS, operator=op)   # the same Redis: the same sessions
    browsers = [client(web, auth=None), client(web, auth=None)]
    for b in browsers:
        assert log_in(b, *AS[OPERATOR]).status_code == 303 and b.get("/").status_code == 200
    admin = client(web, auth=None)
    log_in(admin, *AS[ADMIN])
    copied = client(other_process, auth=None, cookies={"dlq_session": browsers[0].cookies["dlq_session"]})
    assert copied.get("/").status_code == 200
    result = run(app, fake, "web-sessions", ops=op)
    assert result.exit_code == 0 and result.output.count("otto\t") == 2 and "ada\t" in result.output
    result = run(app, fake, "web-sessions", "--revoke", "otto", ops=op)
    assert result.exit_code == 0 and "revoked 2 session(s) of otto" in result.output
    for b in (*browsers, copied):
        r = b.get("/", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/login"), "a revoked session still works"
    assert admin.get("/").status_code == 200                      # another user's session is left alone


def test_an_admin_revokes_a_users_sessions_from_the_dashboard_and_nobody_else_may(web, caplog):
    otto = client(web, auth=None)
    log_in(otto, *AS[OPERATOR])
    assert "Sessions" not in otto.get("/").text and otto.get("/sessions").status_code == 403
    assert otto.post("/sessions/revoke", data={"csrf_token": csrf(otto), "user": "ada"}).status_code == 403
    admin = client(web, auth=None)
    log_in(admin, *AS[ADMIN])
    page = admin.get(admin.get("/").text.split('id="sessions-link"')[0].rsplit('href="', 1)[1].split('"')[0]).text
    assert re.findall(r'<tr class="session" data-user="([^"]+)"', page) == ["otto", "ada"]
    with caplog.at_level(logging.WARNING, logger="celery_dlq.web"):
        done = admin.post("/sessions/revoke", data={"csrf_token": csrf(admin), "user": "otto"})
    assert done.status_code == 200 and 'data-n="1"' in done.text
    assert "revoked 1 session(s) of user 'otto', by 'ada'" in caplog.text
    assert otto.get("/", follow_redirects=False).status_code == 303 and admin.get("/").status_code == 200


def test_a_changed_password_or_token_ends_the_sessions_opened_with_the_old_one(app, op):
    before = create_app(app, basic_auth=USERS, token="old-token", operator=op)
    ada, robot, vera = client(before, auth=None), client(before, auth=None), client(before, auth=None)
    log_in(ada, *AS[ADMIN])
    log_in(robot, "token", "old-token")
    log_in(vera, *AS[VIEWER])
    assert "a-pass" not in str(before.state.sessions.store.client.hgetall(
        Keys("celery_dlq").web_session(before.state.sessions.list()[0].digest)))
    after = create_app(app, basic_auth=["vera:viewer:v-pass", "otto:operator:o-pass", "ada:admin:new-pass"],
                       token="new-token", operator=op)        # restarted with ada's password and the token changed
    for browser in (ada, robot):
        moved = client(after, auth=None, cookies={"dlq_session": browser.cookies["dlq_session"]})
        assert moved.get("/", follow_redirects=False).status_code == 303
    unchanged = client(after, auth=None, cookies={"dlq_session": vera.cookies["dlq_session"]})
    assert unchanged.get("/").status_code == 200                # vera's password is the same: her session stays


def test_logout_ends_the_session_not_only_the_cookie(web):
    c = client(web, auth=None)
    log_in(c, *AS[VIEWER])
    stolen = client(web, auth=None, cookies={"dlq_session": c.cookies["dlq_session"]})
    assert stolen.get("/").status_code == 200
    assert c.post("/logout", data={"csrf_token": csrf(c)}, follow_redirects=False).status_code == 303
    assert stolen.get("/", follow_redirects=False).status_code == 303
    assert web.state.sessions.list() == []


# -- login attempts ----------------------------------------------------------------------

def test_the_sixth_failed_login_is_refused_for_the_window_across_two_dashboard_processes(app, op, fake):
    first, second = (create_app(app, basic_auth=USERS, operator=op) for _ in range(2))
    apps = [first, second, first, second, first]
    for n, web in enumerate(apps):                          # 5 failures, alternating between the two processes
        c = client(web, auth=None, client=("198.51.100.7", 4000))
        assert log_in(c, "ada", f"guess-{n}").status_code == 401
    c = client(second, auth=None, client=("198.51.100.7", 4000))
    r = log_in(c, *AS[ADMIN])                               # the right password, the 6th try: refused
    assert r.status_code == 429 and "too many failed logins" in r.text and "dlq_session" not in c.cookies
    key = Keys(op.settings.key_prefix).web_login_failures("addr", "198.51.100.7")
    assert int(fake.get(key)) == 6 and 0 < fake.ttl(key) <= 15 * 60      # 5 failures and the try refused
    elsewhere = client(first, auth=None, client=("203.0.113.1", 4000))   # the user is limited from anywhere
    assert log_in(elsewhere, *AS[ADMIN]).status_code == 429
    assert client(first, auth=AS[ADMIN], client=("203.0.113.1", 4000)).get("/").status_code == 429   # header too
    assert log_in(client(first, auth=None, client=("203.0.113.1", 4000)), *AS[VIEWER]).status_code == 303
    fake.delete(key, Keys(op.settings.key_prefix).web_login_failures("user", "ada"))   # the window ended
    assert log_in(client(second, auth=None, client=("198.51.100.7", 4000)), *AS[ADMIN]).status_code == 303


def test_tries_at_once_cannot_exceed_the_limit_and_a_right_password_gives_its_addresss_try_back(fake):
    throttle = LoginThrottle(ThrottleStore(fake, Keys("p")), limit=5, window=900)
    assert [throttle.take("10.0.0.1", "ada") for _ in range(8)] == [True] * 5 + [False] * 3   # checked: 5 at most
    throttle = LoginThrottle(ThrottleStore(fake, Keys("q")), limit=2, window=900)
    for _ in range(10):                         # a script's good Authorization on every request never runs out
        assert throttle.take("10.0.0.2", "otto")
        throttle.succeeded("10.0.0.2", "otto")
    assert fake.get(Keys("q").web_login_failures("addr", "10.0.0.2")) == b"0"
    assert fake.ttl(Keys("q").web_login_failures("addr", "10.0.0.2")) > 0     # the window's end is kept


def test_wrong_authorization_headers_count_as_failed_logins(app, op, fake):
    web = create_app(app, basic_auth=USERS, operator=op, login_limit=2)
    for _ in range(2):
        assert client(web, auth=("ada", "wrong")).get("/").status_code == 401
    assert client(web, auth=AS[ADMIN]).get("/").status_code == 429
    token = create_app(app, token="t0ken", operator=op, login_limit=2)
    for _ in range(2):
        client(token, auth=None, client=("10.0.0.7", 1), headers={"Authorization": "Bearer nope"}).get("/")
    assert client(token, auth=None, client=("10.0.0.7", 1),
                  headers={"Authorization": "Bearer t0ken"}).get("/").status_code == 429


# -- headers -----------------------------------------------------------------------------

def test_security_headers_on_every_response(web, fake):
    letters(fake, 1)
    c = client(web, auth=AS[VIEWER])
    responses = [c.get("/"), c.get("/api/overview"), c.get("/static/style.css"), c.get("/static/refresh.js"),
                 c.get("/nope"), client(web, auth=None).get("/login"), client(web, auth=("x", "y")).get("/"),
                 client(web, base_url="http://evil.example").get("/")]
    for r in responses:
        csp = r.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
        assert "script-src 'self'" in csp and "object-src 'none'" in csp
        assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["referrer-policy"] == "same-origin", r.url


def test_templates_have_no_inline_script_or_style_the_policy_would_block():
    folder = Path(__file__).resolve().parents[2] / "celery_dlq" / "web" / "templates"
    for template in folder.glob("*.html"):
        text = template.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), template.name      # every script is a file
        assert not re.search(r"\son[a-z]+=|\sstyle=|javascript:|<style", text), template.name


# -- users and passwords ------------------------------------------------------------------

def test_users_lines_roles_and_hashed_passwords(tmp_path, app, op, monkeypatch):
    hashed = hash_password("h-pass", iterations=1000)
    assert check(hashed, "h-pass") and not check(hashed, "h-pas") and "h-pass" not in hashed
    users = parse_users(["# a comment", "", "al:pw", "bo:operator:pw:with:colons", f"cy:viewer:{hashed}",
                         "di:pa:ss"])
    assert {u.name: u.role for u in users.values()} == {"al": ADMIN, "bo": OPERATOR, "cy": VIEWER, "di": ADMIN}
    assert users["bo"].password == "pw:with:colons" and users["di"].password == "pa:ss"
    assert "pw" not in repr(users["al"])
    for bad, message in (("nobody", "user:password"), ("token:x", "reserved"), ("al:pbkdf2_sha256$x", "malformed"),
                         ("al:pbkdf2_sha256$0$salt$aGFzaA==", "malformed")):
        with pytest.raises(ValueError, match=message):
            parse_users([bad])
    with pytest.raises(ValueError, match="given twice"):
        parse_users(["al:a", "al:b"])
    path = tmp_path / "users"
    path.write_text(f"cy:viewer:{hashed}\n")
    assert read_users_file(path)["cy"].role == VIEWER
    monkeypatch.setenv("CELERY_DLQ_WEB_USERS", "env:operator:e-pass\n")
    web = create_app(app, users_file=path, operator=op)
    assert client(web, auth=("cy", "h-pass")).get("/").status_code == 200
    assert client(web, auth=("env", "e-pass")).get("/").status_code == 200
    with pytest.raises(ValueError, match="given twice"):
        create_app(app, users_file=path, basic_auth=["cy:x"], operator=op)
    with pytest.raises(ValueError, match="cannot read the users file"):
        create_app(app, users_file=tmp_path / "missing", operator=op)


def test_the_cli_refuses_a_missing_users_file_and_a_proxy_that_is_no_address(app, fake, op):
    result = run(app, fake, "web", "--users-file", "/nonexistent/users", ops=op)
    assert result.exit_code == 2 and "cannot read the users file /nonexistent/users" in result.output
    result = run(app, fake, "web", "--basic-auth", "a:b", "--trusted-proxy", "proxy.example", ops=op)
    assert result.exit_code == 2 and "--trusted-proxy takes an IP address or network" in result.output
    result = run(app, fake, "web", "--no-auth", "--bind", "127.0.0.1", "--allowed-host", "*", ops=op)
    assert result.exit_code == 2 and "DNS rebinding" in result.output


def test_a_hashed_password_is_derived_once_per_process_not_once_per_request(app, op, monkeypatch):
    web = create_app(app, basic_auth=[f"ada:admin:{hash_password('h-pass', iterations=1000)}"], operator=op)
    calls = []
    monkeypatch.setattr(auth, "check", lambda stored, given: calls.append(given) or check(stored, given))
    for _ in range(3):
        assert client(web, auth=("ada", "h-pass")).get("/api/overview").status_code == 200
    assert client(web, auth=("ada", "wrong")).get("/api/overview").status_code == 401
    assert calls == ["h-pass", "wrong"]


def test_web_passwd_asks_twice_and_prints_a_line_the_dashboard_accepts(app, tmp_path, op):
    out = CliRunner().invoke(cli.dlq, ["web-passwd", "otto"], input="one\ntwo\n",
                             obj=CLIContext(app=app, no_color=True, workdir=None))
    assert out.exit_code != 0 and "pbkdf2" not in out.output       # the two entries differ
    out = CliRunner().invoke(cli.dlq, ["web-passwd", "otto", "--role", "operator"], input="s3cret\ns3cret\n",
                             obj=CLIContext(app=app, no_color=True, workdir=None))
    line = out.output.strip().splitlines()[-1]
    assert out.exit_code == 0 and line.startswith("otto:operator:pbkdf2_sha256$600000$") and "s3cret" not in line
    (tmp_path / "users").write_text(line + "\n")
    web = create_app(app, users_file=tmp_path / "users", operator=op)
    assert client(web, auth=("otto", "s3cret")).get("/").status_code == 200
