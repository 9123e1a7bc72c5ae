"""The three roles against a running ``celery dlq web``: real HTTP, a real redis-server, a real worker.

tests/unit/test_web_security.py checks every route for every role in
process; this drives the dashboard a user runs (its own process, its
sessions, throttle and jobs in Redis) as a viewer, an operator and an
admin, through the overview, a DLQ, the breakers page and the jobs page,
and checks what each action changed in Redis and in the worker.
"""
from __future__ import annotations

import re

import httpx
import pytest

from tests.integration.test_web_security import CSRF, Dashboard, log_in

pytestmark = pytest.mark.integration

USERS = {"viewer": ("vera", "vera-pass-1"), "operator": ("otto", "otto-pass-2"), "admin": ("alice", "alice-pass-3")}


@pytest.fixture
def users_file(tmp_path):
    path = tmp_path / "users"
    path.write_text("".join(f"{user}:{role}:{password}\n" for role, (user, password) in USERS.items()))
    path.chmod(0o600)
    return path


class Browser:
    """One role's logged-in browser: pages, and the POSTs of their forms (the CSRF token from a page)."""

    def __init__(self, server: Dashboard, role: str) -> None:
        user, password = USERS[role]
        response = log_in(server, user, password)
        assert response.status_code == 303, (role, response.text[:500])
        self.http: httpx.Client = response.browser
        self.role = role

    def get(self, path: str) -> httpx.Response:
        return self.http.get(path)

    def page(self, path: str) -> str:
        response = self.get(path)
        assert response.status_code == 200, (self.role, path, response.status_code)
        return response.text

    def post(self, path: str, **fields: str) -> httpx.Response:
        token = CSRF.search(self.page("/")).group(1)
        return self.http.post(path, data={"csrf_token": token, **fields})

    def job_of(self, response: httpx.Response) -> str:
        """The job a replay or purge started (the POST redirects to its page)."""
        assert response.status_code == 303, (self.role, response.status_code, response.text[:500])
        return response.headers["location"].rsplit("/", 1)[1]


def rows(html: str, css: str) -> list[list[str]]:
    """The cells of each ``<tr class="css ...">`` of a page, tags stripped."""
    found = re.findall(rf'<tr class="{css}[^"]*"[^>]*>(.*?)</tr>', html, re.S)
    return [[re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td>(.*?)</td>", row, re.S)]
            for row in found]


def test_viewer_operator_and_admin_on_a_running_dashboard(harness, users_file):
    q, dlq = harness.queue, f"DLQ.{harness.queue}"
    harness.worker()
    letters = [harness.send("proj.not_retryable").id for _ in range(3)]    # dead-lettered at once
    harness.wait_until(lambda: len(harness.dead_letters()) == 3, message="three dead letters")
    server = Dashboard(harness, users_file)
    try:
        viewer, operator, admin = (Browser(server, role) for role in USERS)

        # Every role reads every page; the overview and the DLQ show the three letters.
        for browser in (viewer, operator, admin):
            assert dlq in browser.page("/") and f"({browser.role})" in browser.page("/")
            shown = browser.page(f"/dlq/{dlq}")
            assert all(task_id in shown for task_id in letters)
            browser.page("/breakers")
            browser.page("/jobs")

        # The viewer changes nothing: no replay, purge or pause, over the forms or the API.
        assert viewer.post(f"/dlq/{dlq}/replay", id=letters[0]).status_code == 403
        assert viewer.post(f"/dlq/{dlq}/purge", id=letters[0], why="x").status_code == 403
        assert viewer.post("/breakers/pause", task="proj.noop", queue=q).status_code == 403
        assert viewer.http.post(f"/api/dlq/{dlq}/replay", json={"ids": [letters[0]]}).status_code == 403
        assert "Replay" not in viewer.page(f"/dlq/{dlq}") and "Pause task" not in viewer.page("/breakers")
        assert len(harness.dead_letters()) == 3

        # The operator pauses a breaker: the worker holds the task's next delivery, the breakers page shows it.
        paused = operator.post("/breakers/pause", task="proj.noop", queue=q, why="gateway down")
        assert paused.status_code == 200 and "Paused proj.noop" in paused.text
        held = harness.send("proj.noop", args=(1,))
        harness.wait_until(lambda: any(row[:2] == [q, "proj.noop"] and row[3] == "open" and row[4] == "1"
                                       for row in rows(viewer.page("/breakers"), "breaker")),
                           timeout=60, message="the breakers page showing the held delivery")
        (row,) = rows(viewer.page("/breakers"), "breaker")
        assert row[6] == "otto (dashboard)" and harness.deliveries(held.id) == []
        assert "Resume" in operator.page("/breakers") and "Resume" not in viewer.page("/breakers")

        # The operator replays one letter (to a queue nobody consumes) but may not purge. A replay goes only to a
        # queue the app knows or a list the broker holds: the hold list exists (one element) before it.
        assert operator.post(f"/dlq/{dlq}/purge", id=letters[1], why="junk").status_code == 403
        harness.redis.lpush(f"{q}.hold", b"already there")
        replay = operator.job_of(operator.http.post(f"/dlq/{dlq}/replay", data={
            "csrf_token": CSRF.search(operator.page("/")).group(1), "id": letters[0], "to": f"{q}.hold"}))
        harness.wait_until(lambda: any(r[0] == replay and r[2] == "done" for r in rows(viewer.page("/jobs"), "job")),
                           timeout=60, message="the replay job done")
        assert harness.redis.llen(f"{q}.hold") == 2 and len(harness.dead_letters()) == 2

        # The admin purges one letter (with a reason) and resumes the breaker: the held delivery runs.
        purge = admin.job_of(admin.post(f"/dlq/{dlq}/purge", id=letters[1], why="a duplicate charge"))
        harness.wait_until(lambda: any(r[0] == purge and r[2] == "done" for r in rows(viewer.page("/jobs"), "job")),
                           timeout=60, message="the purge job done")
        assert [letter["headers"]["id"] for letter in harness.dead_letters()] == [letters[2]]
        resumed = admin.post("/breakers/resume", task="proj.noop", queue=q)
        assert resumed.status_code == 200 and "Closed 1 breaker(s)" in resumed.text
        harness.wait_until(lambda: harness.deliveries(held.id), timeout=60, message="the held delivery released")

        # The jobs page, as the viewer reads it: both jobs, who ran them, what they moved; no buttons.
        jobs = {r[0]: r for r in rows(viewer.page("/jobs"), "job")}
        assert (jobs[replay][2], jobs[replay][3].split()[0], jobs[replay][6]) == ("done", "1", "otto")
        assert (jobs[purge][2], jobs[purge][3].split()[0], jobs[purge][6]) == ("done", "1", "alice")
        for job in (replay, purge):
            assert viewer.post(f"/jobs/{job}/cancel").status_code == 403
    finally:
        server.stop()
