"""The worker's guarantees on the installed versions: one redis-server and two prefork workers for the module.

Each test sends its own tasks and looks only at their task ids: the quick
start's fail, park, move, dead-letter and success; ``self.retry`` with new
arguments; malformed list elements quarantined as dead letters; the stored
traceback equal to the live one; every delivery exactly once across two
workers; the outcomes Celery reports each its own way (unknown task, hard
time limit, a task's own requeue, expiry). The operator side (CLI list, show
and replay, the exporter, the dashboard) reads what they left.
"""
from __future__ import annotations

import base64
import json
import sys
import urllib.request
from collections import Counter, defaultdict

import pytest

from celery_dlq import headers as H
from tests.integration.test_exporter import ExporterProcess, ops_env
from tests.processes import ServerProcess

#: tests/contract/proj.py's traced task. Not imported from there: importing the worker app in the test
#: process would register its shared tasks (and celery-dlq's bootsteps) on every app made afterwards.
TRACED = "contract.traced"

pytestmark = [pytest.mark.contract, pytest.mark.integration, pytest.mark.xdist_group("contract-worker")]


def letters_of(stack, task_id: str) -> list[dict]:
    return [letter for letter in stack.dead_letters() if letter["headers"].get("id") == task_id]


def counts(stack, task_id: str) -> list[int]:
    return [row["delivery"] for row in stack.deliveries(task_id)]


def dead_lettered(stack, task_id: str) -> dict:
    stack.wait_until(lambda: letters_of(stack, task_id), timeout=60, message=f"{task_id} dead-lettered")
    [letter] = letters_of(stack, task_id)
    return letter


def workers_alive(stack) -> None:
    for worker in stack.workers:
        assert worker.proc.poll() is None, f"worker {worker.name} exited:\n{worker.log()[-4000:]}"


def test_a_failing_task_is_parked_moved_and_dead_lettered_with_deliveries_1_to_n(stack):
    failing = stack.send("proj.always_fails", args=(7,))        # 3 deliveries, 0.1 s apart
    recovering = stack.send("proj.flaky", args=(2, "quick"))    # fails twice, succeeds on the third
    succeeding = stack.send("proj.noop", args=(1,))
    headers = dead_lettered(stack, failing.id)["headers"]
    assert headers[H.REASON] == "max_delivery_attempts"
    assert headers[H.DELIVERY_COUNT] == 3 and headers[H.ORIGINAL_QUEUE] == stack.queue
    assert headers[H.EXCEPTION_TYPE] == "ValueError" and headers[H.EXCEPTION_MESSAGE] == "always fails #7"
    assert counts(stack, failing.id) == [1, 2, 3]
    stack.wait_until(lambda: len(counts(stack, recovering.id)) == 3 and counts(stack, succeeding.id),
                     message="the recovering and the succeeding task ran")
    assert counts(stack, recovering.id) == [1, 2, 3] and counts(stack, succeeding.id) == [1]
    assert not letters_of(stack, recovering.id) and not letters_of(stack, succeeding.id)
    workers_alive(stack)


def test_retry_with_new_arguments_delivers_them(stack):
    result = stack.send("proj.retry_new_args", kwargs={"until": 2})
    stack.wait_until(lambda: len(counts(stack, result.id)) == 3, message="three deliveries")
    rows = stack.deliveries(result.id)
    assert [(r["delivery"], r["args"], r["kwargs"].get("note")) for r in rows] == \
        [(1, [], None), (2, [1], "retry 1"), (3, [2], "retry 2")]
    assert not letters_of(stack, result.id)


def test_malformed_list_elements_are_dead_lettered_as_invalid_messages(stack):
    elements = [b"\x00not json at all", json.dumps(["a", "list"]).encode(),
                json.dumps({"body": "x", "headers": {"task": "proj.noop"}}).encode()]   # an object, no properties
    pids = [worker.proc.pid for worker in stack.workers]
    dlq = f"DLQ.{stack.queue}"
    before = stack.redis.llen(dlq)
    for raw in elements:
        stack.redis.lpush(stack.queue, raw)
    after = stack.send("proj.noop", args=(2,))
    stack.wait_until(lambda: stack.redis.llen(dlq) >= before + len(elements) and counts(stack, after.id),
                     message="3 invalid messages dead-lettered and a valid task run")
    raw = [letter for letter in stack.dead_letters() if letter["headers"].get(H.RAW)]
    assert sorted(base64.b64decode(letter["body"]) for letter in raw) == sorted(elements), "byte for byte"
    assert {letter["headers"][H.REASON] for letter in raw} == {"invalid_message"}
    assert [worker.proc.pid for worker in stack.workers] == pids
    workers_alive(stack)


def test_a_dead_letters_traceback_is_the_live_one(stack):
    result = stack.send(TRACED)
    headers = dead_lettered(stack, result.id)["headers"]
    assert headers[H.REASON] == "non_retryable"
    [live] = [json.loads(r) for r in stack.redis.lrange(f"{stack.prefix}:live-tracebacks", 0, -1)
              if json.loads(r)["id"] == result.id]
    assert "in lookup" in live["text"] and "KeyError: 'missing'" in live["text"]
    assert headers[H.TRACEBACK] == live["text"]


def test_two_workers_run_every_delivery_exactly_once(stack):
    ids = [stack.send("proj.flaky", args=(2, "pair")).id for _ in range(150)]
    stack.wait_until(lambda: {row["id"] for row in stack.deliveries() if row["delivery"] == 3} >= set(ids),
                     timeout=120, message="every task's third delivery")
    stack.after_a_mover_pass()             # a duplicate would have run by now
    wanted = set(ids)
    seen: dict[str, list[int]] = defaultdict(list)
    for row in stack.deliveries():
        if row["id"] in wanted:
            seen[row["id"]].append(row["delivery"])
    runs = Counter(tuple(sorted(seen[i])) for i in ids)
    assert runs == {(1, 2, 3): 150}, f"deliveries per task (a repeated number is a duplicate): {runs}"
    workers_alive(stack)


def test_an_unknown_task_is_dead_lettered_unknown_task(stack):
    result = stack.send("proj.does_not_exist", args=(1, 2))
    headers = dead_lettered(stack, result.id)["headers"]
    assert (headers[H.REASON], headers["task"]) == ("unknown_task", "proj.does_not_exist")


def test_a_hard_time_limit_is_a_failed_delivery_then_dead_lettered_time_limit(stack):
    result = stack.send("proj.hangs")       # time_limit=1, 2 deliveries
    headers = dead_lettered(stack, result.id)["headers"]
    assert headers[H.REASON] == "time_limit" and "TimeLimitExceeded" in headers[H.EXCEPTION_TYPE]
    assert counts(stack, result.id) == [1, 2]
    workers_alive(stack)


def test_a_task_that_requeues_itself_uses_up_no_attempt(stack):
    """``Reject(requeue=True)`` with one attempt allowed: kombu gives it back marked ``redelivered``."""
    result = stack.send("proj.requeues_once")
    stack.wait_until(lambda: len(counts(stack, result.id)) == 2, message="the requeued message ran again")
    assert [(r["run"], r["delivery"]) for r in stack.deliveries(result.id)] == [(1, 1), (2, 1)]
    assert not letters_of(stack, result.id)


def test_a_failure_whose_redelivery_would_come_after_expires_is_dead_lettered_expired(stack):
    late = stack.send("proj.fails_slow_retry", expires=2)      # its next delivery (5 s) would come after expiry
    headers = dead_lettered(stack, late.id)["headers"]
    assert (headers[H.REASON], headers[H.DELIVERY_COUNT]) == ("expired", 1)
    assert counts(stack, late.id) == [1]


# -- the operator side ---------------------------------------------------------


@pytest.fixture(scope="module")
def letter(stack):
    """A dead letter of this module's queue, for the operator tools."""
    result = stack.send("proj.not_retryable")
    dead_lettered(stack, result.id)
    return result.id


def test_the_cli_lists_shows_and_replays_dead_letters(stack, letter):
    listed = stack.dlq_json("list", f"DLQ.{stack.queue}", "--limit", "0")
    assert letter in [row["task_id"] for row in listed]
    [shown] = stack.dlq_json("show", letter)
    assert (shown["task_id"], shown["reason"], shown["original_queue"]) == (letter, "non_retryable", stack.queue)
    assert shown["headers"][H.TRACEBACK].rstrip().endswith("KeyError: 'missing'")
    replay = stack.dlq("replay", stack.queue, letter)            # published by the operator's kombu producer
    assert replay.returncode == 0, replay.stderr
    stack.wait_until(lambda: len(counts(stack, letter)) == 2 and letters_of(stack, letter), message="replayed, "
                     "run again on delivery 1 and dead-lettered again")
    assert counts(stack, letter) == [1, 1]


def test_the_exporter_answers_one_scrape(stack, letter, tmp_path):
    dlq = f"DLQ.{stack.queue}"
    exporter = ExporterProcess(ops_env(stack.broker, stack.queue, stack.prefix), tmp_path / "exporter.log").start()
    try:
        before = stack.redis.llen(dlq)
        got = exporter.scrape()
        after = stack.redis.llen(dlq)
    finally:
        assert exporter.stop() == 0
    assert got[("celery_dlq_redis_up", ())] == 1
    assert before <= got[("celery_dlq_dead_letters", (("dlq", dlq), ("queue", stack.queue)))] <= after > 0


def test_the_dashboard_serves_its_overview(stack, letter, tmp_path):
    env = ops_env(stack.broker, stack.queue, stack.prefix)
    web = ServerProcess(lambda port: [sys.executable, "-m", "celery", "-A", "tests.integration.ops_app", "dlq", "web",
                                      "--no-auth", "--port", str(port)], env, tmp_path / "web.log",
                        what="the dashboard").start()
    try:
        with urllib.request.urlopen(web.base + "/", timeout=10) as response:
            status, page = response.status, response.read().decode()
    finally:
        web.stop()
    assert status == 200 and f"DLQ.{stack.queue}" in page


def test_idle_workers_wait_for_the_fetch_listener_which_hears_the_queue(stack):
    """On every supported version: the lease holder's listener tracks the queue (client tracking, RESP2 on
    every redis-py), the idle workers wait on its marker, and a message sent then runs at once."""
    for worker in stack.workers:
        worker.wait_for_log("an idle fetch waits for the fetch listener", timeout=60)
    assert stack.queue.encode() in stack.redis.smembers(f"{{{stack.prefix}}}:fetch:listening")
    stack.wait_until(lambda: sum(1 for c in stack.redis.client_list() if c.get("cmd") == "bzpopmin") >= 2,
                     timeout=30, message="both workers blocked on the marker")
    task_id = stack.send("proj.noop").id
    stack.wait_until(lambda: stack.deliveries(task_id), timeout=10, message="the message, woken by the listener")
    workers_alive(stack)
