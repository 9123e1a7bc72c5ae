"""The dashboard for real: the `celery dlq web` program, a real redis-server, a real worker, Chromium.

Debian's ``chromium`` and ``chromium-driver`` drive the pages with
selenium (scripts/test.sh installs them when absent). Screenshots of the
overview and of a dead letter's page go to ``$DLQ_WEB_SCREENSHOTS`` when
set (that is how docs/web-*.png are made), else to the test's tmp dir.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import httpx
import pytest
from celery import Celery

from celery_dlq.ops import Operator
from tests.integration.test_operator import fabricate
from tests.processes import ServerProcess, wait_for

pytestmark = pytest.mark.integration

USER, PASSWORD = "alice", "wonder-land"


class WebServer(ServerProcess):
    """`celery -A tests.integration.ops_app dlq web` on a free port, logging to a file."""

    def __init__(self, harness, *args: str) -> None:
        super().__init__(lambda port: [sys.executable, "-m", "celery", "-A", "tests.integration.ops_app", "dlq",
                                       "web", "--port", str(port), "--basic-auth", f"{USER}:{PASSWORD}",
                                       "--refresh", "0", *args],
                         harness.env(), harness.tmp_path / "web.log", ready="/login", what="celery dlq web")
        self.url = self.base
        self.start()


@pytest.fixture
def ops(harness):
    app = Celery("ops", broker=harness.broker, set_as_current=False)
    app.conf.update(task_default_queue=harness.queue, dlq_key_prefix=harness.prefix)
    op = Operator(app)
    yield op
    op.client.close()


@pytest.fixture
def browser():
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.fail("chromium and chromedriver are required (scripts/test.sh installs chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,860",
                "--disable-gpu"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})   # the console: CSP violations show there
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    driver.implicitly_wait(5)
    yield driver
    driver.quit()


def shot_dir(tmp_path: Path) -> Path:
    target = Path(os.environ.get("DLQ_WEB_SCREENSHOTS") or tmp_path)
    target.mkdir(parents=True, exist_ok=True)
    return target


def click(driver, element) -> None:
    """Click what loads a new page, and wait until the new page is there (not the old one still)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    old = driver.find_element(By.TAG_NAME, "html")
    element.click()
    WebDriverWait(driver, 15).until(expected_conditions.staleness_of(old))
    WebDriverWait(driver, 15).until(lambda d: d.execute_script("return document.readyState") == "complete")


def rows(driver) -> list[tuple[str, str]]:
    """(task id, task name) of each dead letter on the DLQ page."""
    from selenium.webdriver.common.by import By

    return [(tr.get_attribute("data-task-id"), tr.find_element(By.CSS_SELECTOR, "td.task").text)
            for tr in driver.find_elements(By.CSS_SELECTOR, "tr.letter")]


def test_operator_logs_in_filters_replays_purges_and_redelivers_in_a_browser(harness, ops, browser, tmp_path):
    from selenium.webdriver.common.by import By

    harness.extra_env["DLQ_TEST_CONF"] = json.dumps({"result_backend": harness.broker})
    harness.redis.set(f"{harness.prefix}:broken", 1)
    worker = harness.worker()
    fixed = [harness.send("proj.fixed_by_flag", args=(n,)).id for n in range(3)]
    failing = [harness.send("proj.always_fails", args=(n,)).id for n in range(2)]
    parked = harness.send("proj.park_long").id
    harness.wait_until(lambda: len(harness.dead_letters()) == 5, message="5 dead letters")
    harness.wait_until(lambda: ops.parked.sharded.count() == 1, message="a parked retry")
    server = WebServer(harness)
    try:
        dlq, driver = f"DLQ.{harness.queue}", browser
        driver.get(server.url + "/")
        assert "/login" in driver.current_url  # not logged in: the login form
        driver.find_element(By.ID, "user").send_keys(USER)
        driver.find_element(By.ID, "password").send_keys(PASSWORD)
        click(driver, driver.find_element(By.ID, "login"))
        wait_for(lambda: driver.find_elements(By.ID, "queues"), message="the overview")
        overview = driver.find_element(By.ID, "queues").text
        assert re.search(rf"{re.escape(dlq)} {harness.queue} 5 1 \d+s ago", overview), overview

        click(driver, driver.find_element(By.LINK_TEXT, dlq))
        assert sorted(rows(driver)) == sorted([(i, "proj.fixed_by_flag") for i in fixed]
                                              + [(i, "proj.always_fails") for i in failing])
        driver.find_element(By.NAME, "task").send_keys("proj.fixed_by_flag")
        click(driver, driver.find_element(By.ID, "apply"))
        assert "task=proj.fixed_by_flag" in driver.current_url  # a bookmarkable filtered view
        assert sorted(rows(driver)) == sorted((i, "proj.fixed_by_flag") for i in fixed)

        harness.redis.delete(f"{harness.prefix}:broken")  # the fix is deployed
        click(driver, driver.find_element(By.ID, "replay-matching"))
        assert "3 dead letters to their original queue" in driver.find_element(By.ID, "count").text
        click(driver, driver.find_element(By.ID, "confirm"))
        result = wait_for(lambda: driver.find_elements(By.ID, "result"), message="the replay's result")[0]
        assert (result.get_attribute("data-done"), result.get_attribute("data-missing")) == ("3", "0")

        def succeeded() -> bool:
            metas = [harness.redis.get(f"celery-task-meta-{task_id}") for task_id in fixed]
            return all(meta and json.loads(meta)["status"] == "SUCCESS" for meta in metas)

        wait_for(succeeded, message="the worker to run the replayed tasks", log=worker.log())
        for task_id in fixed:  # failed twice, then replayed: delivery 1 again, and it succeeded
            assert [r["delivery"] for r in harness.deliveries(task_id)] == [1, 2, 1]
        assert all(json.loads(harness.redis.get(f"celery-task-meta-{i}"))["result"] == 1 for i in fixed)
        click(driver, driver.find_element(By.ID, "back"))
        assert sorted(rows(driver)) == sorted((i, "proj.always_fails") for i in failing)  # the page shrank

        click(driver, driver.find_element(By.LINK_TEXT, failing[0]))
        assert driver.find_element(By.ID, "task-id").text == failing[0]
        assert "ValueError: always fails #0" in driver.find_element(By.ID, "traceback").text
        assert driver.find_element(By.ID, "args").text.replace("\n", "").replace(" ", "") == "[0]"
        driver.set_window_size(1280, 1500)  # headers and traceback in the picture too
        driver.save_screenshot(str(shot_dir(tmp_path) / "web-dead-letter.png"))
        driver.set_window_size(1280, 860)
        click(driver, driver.find_element(By.ID, "purge-one"))
        assert "delete for good 1 dead letter" in driver.find_element(By.ID, "count").text
        driver.find_element(By.ID, "why").send_keys("a bad order, refunded by hand")   # a purge needs one
        click(driver, driver.find_element(By.ID, "confirm"))
        result = wait_for(lambda: driver.find_elements(By.ID, "result"), message="the purge's result")[0]
        assert result.get_attribute("data-done") == "1"
        click(driver, driver.find_element(By.ID, "back"))
        assert rows(driver) == [(failing[1], "proj.always_fails")]
        assert [m["headers"]["id"] for m in harness.dead_letters()] == [failing[1]]

        click(driver, driver.find_element(By.LINK_TEXT, "Parked retries"))
        (retry,) = driver.find_elements(By.CSS_SELECTOR, "tr.retry")
        assert retry.get_attribute("data-task-id") == parked and "in 59m" in retry.text
        due = {cell.get_attribute("data-bucket"): cell.text for cell in driver.find_elements(By.CSS_SELECTOR, "#due td")}
        assert due["15-60 min"] == "1" and sum(map(int, due.values())) == 1   # the histogram of due times
        driver.save_screenshot(str(shot_dir(tmp_path) / "web-parked.png"))
        click(driver, retry.find_element(By.CSS_SELECTOR, "button.redeliver"))
        assert "Due now" in driver.find_element(By.ID, "result").text
        # proj.park_long fails again on its 2nd (last) delivery: redelivered now, it is dead-lettered now.
        harness.wait_until(lambda: [m["headers"]["id"] for m in harness.dead_letters()] == [failing[1], parked],
                           timeout=30, message="the redelivered retry to run and be dead-lettered")
        assert ops.parked.sharded.count() == 0
        driver.get(server.url + "/parked")
        assert driver.find_elements(By.CSS_SELECTOR, "tr.retry") == []
        assert PASSWORD not in server.log()
    finally:
        server.stop()


def test_overview_groups_failures_charts_them_and_replays_one_group_in_a_browser(harness, browser, tmp_path):
    """Three failures (two tasks, one with two exception types, numbers varying): three groups, the charts'
    totals, and "replay this group" moving exactly that group's letters (asserted in Redis)."""
    from selenium.webdriver.common.by import By

    q, dlq = harness.queue, f"DLQ.{harness.queue}"
    worker = harness.worker()
    keys = [harness.send("proj.charge", args=(n * 11, "key")).id for n in range(4)]       # KeyError('user_<n>')
    declined = [harness.send("proj.charge", args=(n * 13, "value")).id for n in range(3)]  # ValueError(card <n> ...)
    failing = [harness.send("proj.always_fails", args=(n * 17,)).id for n in range(2)]     # ValueError(#<n>)
    harness.wait_until(lambda: len(harness.dead_letters()) == 9, timeout=60, message="9 dead letters")
    worker.stop()   # nothing consumes the queue now: what a replay moves stays there to be counted
    server = WebServer(harness, "--refresh", "1")
    try:
        driver = browser
        driver.get(server.url + "/login")
        driver.find_element(By.ID, "user").send_keys(USER)
        driver.find_element(By.ID, "password").send_keys(PASSWORD)
        click(driver, driver.find_element(By.ID, "login"))
        groups = {tr.find_element(By.TAG_NAME, "strong").text + " " + tr.find_element(By.TAG_NAME, "code").text:
                  (tr.get_attribute("data-group"), int(tr.get_attribute("data-count")))
                  for tr in driver.find_elements(By.CSS_SELECTOR, "tr.group")}
        assert {name: n for name, (_, n) in groups.items()} == {
            "proj.charge KeyError": 4, "proj.charge ValueError": 3, "proj.always_fails ValueError": 2}
        assert driver.find_elements(By.CSS_SELECTOR, "p.ungrouped") == []

        # The charts: dead-lettered 9; parked and redelivered once per charge (2 attempts), twice per
        # always_fails (3 attempts). Totals from the section, the SVG bars and the table agree.
        expected = {"dead_lettered": 9, "parked": 4 + 3 + 2 * 2, "redelivered": 4 + 3 + 2 * 2}
        for kind, total in expected.items():
            section = driver.find_element(By.ID, f"trend-{kind}")
            assert int(section.get_attribute("data-hour-total")) == total == int(section.get_attribute("data-week-total"))
            for svg in section.find_elements(By.TAG_NAME, "svg"):
                bars = [int(rect.get_attribute("data-value")) for rect in svg.find_elements(By.TAG_NAME, "rect")]
                assert sum(bars) == total and len(bars) in (60, 168)
            row = section.find_element(By.CSS_SELECTOR, f'tr[data-queue="{q}"]').text.split()
            assert row[-2:] == [str(total), str(total)]
        reasons = driver.find_element(By.ID, "trend-dead_lettered").find_element(
            By.CSS_SELECTOR, 'tr[data-reason="max_delivery_attempts"]').text
        assert reasons.split()[-2:] == ["9", "9"]
        driver.set_window_size(1280, 2100)
        driver.save_screenshot(str(shot_dir(tmp_path) / "web-overview.png"))
        driver.set_window_size(1280, 860)

        gid, count = groups["proj.charge KeyError"]
        row = driver.find_element(By.CSS_SELECTOR, f'tr.group[data-group="{gid}"]')
        click(driver, row.find_element(By.CSS_SELECTOR, "a.group-link"))
        assert sorted(tr.get_attribute("data-task-id") for tr in driver.find_elements(By.CSS_SELECTOR, "tr.letter")) \
            == sorted(keys)
        driver.get(server.url + "/")
        row = driver.find_element(By.CSS_SELECTOR, f'tr.group[data-group="{gid}"]')
        click(driver, row.find_element(By.CSS_SELECTOR, "a.replay-group"))
        assert "4 dead letters to their original queue" in driver.find_element(By.ID, "count").text
        click(driver, driver.find_element(By.ID, "confirm"))
        result = wait_for(lambda: driver.find_elements(By.ID, "result"), message="the replay's result")[0]
        assert (result.get_attribute("data-done"), result.get_attribute("data-missing")) == ("4", "0")

        replayed = [json.loads(raw)["headers"]["id"] for raw in harness.redis.lrange(q, 0, -1)]
        assert sorted(replayed) == sorted(keys)   # exactly the group: each once, nothing else
        assert sorted(m["headers"]["id"] for m in harness.dead_letters()) == sorted(declined + failing)
        driver.get(server.url + "/")
        left = {tr.get_attribute("data-group"): int(tr.get_attribute("data-count"))
                for tr in driver.find_elements(By.CSS_SELECTOR, "tr.group")}
        assert left == {groups["proj.charge ValueError"][0]: 3, groups["proj.always_fails ValueError"][0]: 2}

        # The figures refresh in place (a same-origin fetch of /api/overview), not by reloading the page.
        page = driver.find_element(By.TAG_NAME, "html")
        stat = driver.find_element(By.CSS_SELECTOR, '[data-stat="dead_letters_now"]')
        assert stat.text == "5" and "in DLQs now" in driver.find_element(By.ID, "stats").text
        gone = harness.dlq("purge", q, "--task", "proj.always_fails", "--force")
        assert gone.returncode == 0, gone.stderr
        wait_for(lambda: stat.text == "3", timeout=15, message="the in-place refresh", log=server.log())
        failing_gid = groups["proj.always_fails ValueError"][0]
        assert driver.find_element(By.CSS_SELECTOR, f'[data-group-count="{failing_gid}"]').text == "0"
        assert page.is_displayed() and driver.find_element(By.TAG_NAME, "html") == page   # the same document
        blocked = [e["message"] for e in driver.get_log("browser") if "Content Security Policy" in e["message"]]
        assert blocked == []   # the script, the stylesheet and the charts run under the policy as sent
    finally:
        server.stop()


def test_replaying_ten_thousand_from_the_page_answers_at_once_and_finishes_in_the_background(harness):
    ids = fabricate(harness, 10_000)
    server = WebServer(harness)
    try:
        with httpx.Client(base_url=server.url, auth=(USER, PASSWORD), timeout=10) as http:
            page = http.get(f"/dlq/DLQ.{harness.queue}/confirm", params={"action": "replay", "all": "1"})
            assert "<strong>10000</strong>" in page.text
            token = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page.text).group(1)
            started = time.monotonic()
            posted = http.post(f"/dlq/DLQ.{harness.queue}/replay", data={"csrf_token": token, "all": "1"})
            answered = time.monotonic() - started
            assert posted.status_code == 303 and "/jobs/" in posted.headers["location"]

            def finished():
                html = http.get(posted.headers["location"]).text
                return re.search(r'data-done="(\d+)" data-missing="(\d+)" data-failed="(\d+)"', html)

            result = wait_for(finished, timeout=120, message="the replay job", log=server.log())
            took = time.monotonic() - started
        print(f"POST answered in {answered:.2f} s; 10,000 replayed in {took:.1f} s")
        assert tuple(map(int, result.groups())) == (10_000, 0, 0)
        assert harness.redis.llen(harness.queue) == 10_000 and harness.redis.llen(f"DLQ.{harness.queue}") == 0
        assert set(json.loads(raw)["headers"]["id"] for raw in harness.redis.lrange(harness.queue, 0, -1)) == set(ids)
    finally:
        server.stop()
