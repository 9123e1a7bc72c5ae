"""The dashboard's security for real: `celery dlq web` processes on a real redis-server, driven over HTTP.

A password given in a users file never appears in the process's argv; the
login limit is shared by two dashboard processes on one Redis; a session
revoked by ``celery dlq web-sessions --revoke`` is refused by every process.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import httpx
import pytest

from tests.integration.test_exporter import dlq_cli
from tests.processes import ServerProcess

pytestmark = pytest.mark.integration

PASSWORD = "file-only-s3cret-7f3a"
CSRF = re.compile(r'name="csrf_token" value="([0-9a-f]+)"')


class Dashboard(ServerProcess):
    """`celery -A tests.integration.ops_app dlq web` with its users in a file (nothing secret in argv)."""

    def __init__(self, harness, users_file: Path, *args: str, name: str = "web") -> None:
        super().__init__(lambda port: [sys.executable, "-m", "celery", "-A", "tests.integration.ops_app", "dlq",
                                       "web", "--port", str(port), "--users-file", str(users_file),
                                       "--refresh", "0", *args],
                         harness.env(), harness.tmp_path / f"{name}.log", ready="/login",
                         what=f"celery dlq web ({name})")
        self.start()

    def argv(self) -> list[str]:
        return Path(f"/proc/{self.proc.pid}/cmdline").read_bytes().decode().split("\0")


@pytest.fixture
def users_file(tmp_path):
    path = tmp_path / "users"
    path.write_text(f"alice:admin:{PASSWORD}\nvera:viewer:vera-pass\n")
    path.chmod(0o600)
    return path


def log_in(server: Dashboard, user: str, password: str, **kw) -> httpx.Response:
    """A fresh browser: the login form's page (its CSRF cookie and token), then the POST."""
    browser = httpx.Client(base_url=server.base, **kw)
    token = CSRF.search(browser.get("/login").text).group(1)
    response = browser.post("/login", data={"csrf_token": token, "user": user, "password": password})
    response.browser = browser
    return response


def test_a_password_given_in_a_users_file_is_never_in_the_process_argv(harness, users_file):
    server = Dashboard(harness, users_file)
    try:
        argv = server.argv()
        assert "--users-file" in argv and "dlq" in argv and "web" in argv    # the process is the dashboard itself
        assert not any(PASSWORD in arg for arg in argv), argv
        assert log_in(server, "alice", PASSWORD).status_code == 303     # and it is the password in use
        assert PASSWORD not in server.log()
    finally:
        server.stop()


def test_basic_auth_shows_in_argv_and_says_so(harness, users_file):
    server = Dashboard(harness, users_file, "--basic-auth", "bob:argv-pass", name="basic")
    try:
        assert "bob:argv-pass" in server.argv()            # what --users-file avoids
        assert "--basic-auth shows its passwords to anyone who can list processes" in server.log()
        assert "argv-pass" not in server.log()
    finally:
        server.stop()


def test_the_sixth_failed_login_is_refused_for_the_window_across_two_dashboard_processes(harness, users_file):
    first = Dashboard(harness, users_file, name="first")
    second = Dashboard(harness, users_file, name="second")
    try:
        for n in range(5):   # first, second, first, second, first
            assert log_in((first, second)[n % 2], "alice", f"guess-{n}").status_code == 401
        refused = log_in(second, "alice", PASSWORD)          # the right password, the 6th try, the other process
        assert refused.status_code == 429 and "too many failed logins" in refused.text
        assert "dlq_session" not in refused.browser.cookies
        assert log_in(first, "vera", "vera-pass").status_code == 429     # this address is refused too
        assert "failed login for user 'alice' from 127.0.0.1" in first.log() + second.log()
        assert PASSWORD not in first.log() + second.log()
    finally:
        first.stop()
        second.stop()


def test_a_session_revoked_with_the_cli_is_refused_by_every_dashboard_process(harness, users_file):
    first = Dashboard(harness, users_file, name="first")
    second = Dashboard(harness, users_file, name="second")
    try:
        session = log_in(first, "vera", "vera-pass").browser.cookies["dlq_session"]
        for server in (first, second):    # one login, good in every process on this Redis
            assert httpx.get(server.base + "/", cookies={"dlq_session": session}).status_code == 200
        listed = dlq_cli(harness.env(), "web-sessions")
        assert listed.returncode == 0 and listed.stdout.startswith("vera\t") and "127.0.0.1" in listed.stdout
        assert session not in listed.stdout
        revoked = dlq_cli(harness.env(), "web-sessions", "--revoke", "vera")
        assert revoked.returncode == 0 and "revoked 1 session(s) of vera" in revoked.stdout, revoked.stderr
        for server in (first, second):
            r = httpx.get(server.base + "/", cookies={"dlq_session": session})
            assert r.status_code == 303 and r.headers["location"].startswith("/login")
    finally:
        first.stop()
        second.stop()


@pytest.mark.parametrize("no_auth", [False, True], ids=["login", "no-auth"])
def test_a_foreign_host_is_refused_by_the_real_server(harness, users_file, no_auth):
    server = Dashboard(harness, users_file, "--allowed-host", "dlq.example.com", *(["--no-auth"] if no_auth else []))
    try:
        page = "/" if no_auth else "/login"
        for host in ("rebound.example", f"rebound.example:{server.port}"):    # DNS rebinding: 127.0.0.1 by name
            refused = httpx.get(server.base + page, headers={"Host": host})
            assert refused.status_code == 400 and "csrf_token" not in refused.text
        assert httpx.get(server.base + page, headers={"Host": f"localhost:{server.port}"}).status_code == 200
        assert httpx.get(server.base + page, headers={"Host": "dlq.example.com"}).status_code == 200
        assert httpx.get(server.base + "/login").headers["content-security-policy"].startswith("default-src 'self'")
    finally:
        server.stop()


def test_secure_cookies_behind_the_trusted_proxy_only_on_the_real_server(harness, users_file):
    https = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "198.51.100.7"}
    untrusted = Dashboard(harness, users_file, name="untrusted")
    trusted = Dashboard(harness, users_file, "--trusted-proxy", "127.0.0.1", name="trusted")
    try:
        for server, secure in ((untrusted, False), (trusted, True)):
            cookie = httpx.get(server.base + "/login", headers=https).headers["set-cookie"]
            assert cookie.startswith("dlq_csrf=") and ("secure" in cookie.lower()) is secure, server.what
        page = httpx.get(trusted.base + "/login", headers=https)    # a Secure cookie: sent back by hand over http
        nonce = page.headers["set-cookie"].split(";")[0]
        failed = httpx.post(trusted.base + "/login", headers={**https, "Cookie": nonce},
                            data={"csrf_token": CSRF.search(page.text).group(1), "user": "vera", "password": "wrong"})
        assert failed.status_code == 401
        assert "failed login for user 'vera' from 198.51.100.7" in trusted.log()   # the forwarded client's address
    finally:
        untrusted.stop()
        trusted.stop()
