"""storage/ owns every Redis command: none is sent, and no script run, from celery_dlq outside storage/.

(a) statically, from the syntax tree of every module (tests/redis_owner.py: redis-py's command names on
receivers named as clients, pipelines, connections and script sets); (b) dynamically, while representative
unit tests run with every command sent noted (the opt-in hook of tests/unit/conftest.py).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import fakeredis
import pytest

from celery_dlq.storage.lists import oldest_pages
from tests import redis_owner
from tests.redis_owner import IN_FLIGHT_ELSEWHERE, NOT_REDIS, PACKAGE, calls_in, guard, sender, static_calls

ROOT = Path(__file__).resolve().parents[2]

#: Unit test files whose tests between them fetch, listen, park, dead-letter, count, export and read.
REPRESENTATIVE = ("test_fetch.py", "test_fetch_listener.py", "test_fetch_sections.py", "test_store.py",
                  "test_counting.py", "test_export.py", "test_metrics.py", "test_chords.py", "test_inflight.py",
                  "test_trends.py")


def test_no_module_outside_storage_calls_a_redis_command_or_runs_a_script():
    assert static_calls() == []


def test_the_scan_finds_commands_on_clients_pipelines_and_scripts_and_not_dict_gets():
    source = """
def f(self, pipe, row, client, scripts):
    self.client.set("k", 1)
    pipe.hincrby("h", "f", 1)
    self._dlq_plain.pipeline(transaction=False).hdel("h", "t")
    client.xinfo_stream("s")
    scripts.run("park", [], [])
    connection.send_command("EVALSHA")
    row.get("x")
    settings.get("y")
    self.thread.run()
"""
    assert sorted(call for _, call in calls_in(source)) == sorted(
        ["client.set", "pipe.hincrby", "pipeline.hdel", "client.xinfo_stream", "scripts.run",
         "connection.send_command"])


def test_every_exception_and_allowed_module_is_there():
    for module, call in NOT_REDIS:
        path = PACKAGE / module
        assert call in {c for _, c in calls_in(path.read_text("utf-8"))}, f"{module}: {call} is gone: drop it"
    for module in IN_FLIGHT_ELSEWHERE:
        assert (PACKAGE / module).exists(), f"{module} is gone: drop it from IN_FLIGHT_ELSEWHERE"


def test_the_sender_is_the_nearest_frame_outside_redis_py():
    redis_py = str(Path(redis_owner.redis.__file__).parent / "client.py")
    worker = str(PACKAGE / "worker" / "deadletter" / "recorder.py")
    storage = str(PACKAGE / "storage" / "store.py")
    kombu = str(Path(sys.modules["kombu"].__file__).parent / "messaging.py")
    assert sender(iter([redis_py, worker])) == "worker/deadletter/recorder.py"
    assert sender(iter([redis_py, storage, worker])) is None
    assert sender(iter([redis_py, kombu, worker])) is None     # kombu's own I/O (a publish our code asked for)
    assert sender(iter([__file__, worker])) is None            # a test's own command


def test_the_guard_notes_a_command_sent_from_outside_storage_and_not_one_from_storage():
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    outside = compile("def send(client):\n    return client.lpush('q', 'x')\n", str(PACKAGE / "worker" / "x.py"),
                      "exec")
    scope: dict = {}
    exec(outside, scope)
    with guard() as found:
        scope["send"](client)
        oldest_pages(client, ["q"], 10)             # storage/lists.py: its own
        client.llen("q")                            # this test's
    assert found == ["worker/x.py: 'LPUSH'"]


@pytest.mark.slow
@pytest.mark.skipif(bool(os.environ.get("DLQ_STORAGE_OWNS_REDIS")), reason="already inside the guarded run")
def test_representative_unit_tests_send_every_command_from_storage():
    env = {**os.environ, "DLQ_STORAGE_OWNS_REDIS": "1", "PYTHONPATH": str(ROOT)}
    files = [str(Path(__file__).parent / name) for name in REPRESENTATIVE]
    done = subprocess.run([sys.executable, "-m", "pytest", *files, "-p", "no:cacheprovider", "-n", "0", "-q",
                           "-x", "-W", "ignore::pytest.PytestAssertRewriteWarning"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
