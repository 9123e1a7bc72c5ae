"""Export against a real redis-server: a capped archive stream, and the export command's DLQ snapshot."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import redis
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner

from celery_dlq import RedeliveryPolicy, install
from celery_dlq.analytics import export as X
from celery_dlq.cli import analytics as cli_analytics
from celery_dlq.message import Envelope
from celery_dlq.storage.archive import EventLog
from celery_dlq.storage.keys import Keys
from tests.unit.test_export import MIDNIGHT, ev, read  # noqa: F401  (fixtures and helpers)


def test_events_trimmed_before_export_are_reported(real_redis, unique, tmp_path, caplog):
    keys = Keys(f"exp{unique}")
    small = EventLog(real_redis, keys, max_length=10)
    try:
        small.append([ev(i, MIDNIGHT + i) for i in range(5)])
        assert X.export_events(real_redis, keys, str(tmp_path)).events_lost == 0
        for i in range(5, 400):  # the cap drops some of these before anyone exports them
            small.append([ev(i, MIDNIGHT + i)])
        result = X.export_events(real_redis, keys, str(tmp_path))
        assert X.export_events(real_redis, keys, str(tmp_path)).events_lost == 0  # nothing new, nothing lost
    finally:
        real_redis.delete(keys.events)
    assert 0 < result.rows < 395 and result.events_lost == 395 - result.rows
    assert f"{result.events_lost} events after" in caplog.text
    assert sorted(read(tmp_path).column("task_id").to_pylist(), key=lambda t: int(t[1:]))[-1] == "t399"


def test_events_trimmed_before_the_first_export_are_counted(real_redis, unique, tmp_path):
    keys = Keys(f"exp{unique}")
    try:
        for i in range(300):
            EventLog(real_redis, keys, max_length=10).append([ev(i, MIDNIGHT + i)])
        result = X.export_events(real_redis, keys, str(tmp_path))
    finally:
        real_redis.delete(keys.events)
    assert result.events_lost == 300 - result.rows > 0


def test_snapshot_of_the_dlqs_and_the_export_command(harness, unique, tmp_path):
    """On a database of its own (the harness's): the snapshot lists every DLQ it finds."""
    app = Celery("snap", broker=harness.broker, set_as_current=False)
    app.conf.dlq_key_prefix = f"snap{unique}"
    queue = f"q{unique}"
    dlq = install(app)
    env = Envelope(body=b'[[42], {}, {}]', content_type="application/json", content_encoding="utf-8",
                   headers={"task": "proj.charge", "id": f"id-{unique}"}, properties={}, exchange="",
                   routing_key=queue, queue=queue)
    client = redis.Redis.from_url(harness.broker)
    try:
        dlq.redis().dead_letter(env, delivery=3, policy=RedeliveryPolicy(), reason="max_delivery_attempts",
                        failure={"type": "ValueError", "message": "no", "traceback": ""}, worker="w")
        runner = CliRunner()
        out = runner.invoke(cli_analytics.export, ["--out", str(tmp_path), "--snapshot", "--json"],
                            obj=CLIContext(app=app, no_color=True, workdir=None))
        assert out.exit_code == 0, out.output
        result = json.loads(out.output)
        assert (result["rows"], result["snapshot_rows"]) == (1, 1)
        snap = pq.read_table(result["snapshot_file"])
        assert snap.column("event_type").to_pylist() == ["in_dlq"]
        assert snap.column("dlq").to_pylist() == [f"DLQ.{queue}"]
        assert snap.column("queue").to_pylist() == [queue]
        assert Envelope.loads(snap.column("record")[0].as_py()).body == env.body
        (event,) = read(tmp_path).to_pylist()
        assert event["event_type"] == "dead_lettered" and event["task_id"] == f"id-{unique}"
        assert event["ts"] == snap.column("ts")[0].as_py()
        again = runner.invoke(cli_analytics.export, ["--out", str(tmp_path)],
                              obj=CLIContext(app=app, no_color=True, workdir=None))
        assert again.exit_code == 0 and "exported 0 events" in again.output
    finally:
        client.delete(*client.keys(f"*snap{unique}*") or ["none"], f"DLQ.{queue}")
        client.close()


