"""``celery dlq replay --plan`` and the analytics commands in the ``dlq`` group, on fakeredis.

Plans are written here with pyarrow exactly as the report lays them out
(``replay_plan/manifest.json`` + ``replay_plan/entries/*.parquet``, the
columns of ``figures.plan_rows``), so no JVM is needed; dead letters are made
by the real DeadLetterer (``test_manage.dead_letter``).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner

from tests.services import SPARK_EXTRA

pa = pytest.importorskip("pyarrow", reason=SPARK_EXTRA)
import pyarrow.parquet as pq  # noqa: E402

from celery_dlq import cli  # noqa: E402
from celery_dlq.cli import base as cli_base  # noqa: E402
from celery_dlq.ops import Operator  # noqa: E402
from celery_dlq.storage.keys import QueueLists  # noqa: E402
from tests.unit.test_manage import T0, CountingRedis, FakeClock, dead_letter, read_once, stored  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PLAN_SCHEMA = pa.schema([
    ("task_id", pa.string()), ("task_name", pa.string()), ("queue", pa.string()), ("dlq", pa.string()),
    ("exception_type", pa.string()), ("reason", pa.string()), ("delivery", pa.int32()),
    ("dead_lettered_at", pa.timestamp("us", tz="UTC")), ("payload_hash", pa.string()), ("event_id", pa.string()),
])


def write_plan(out: Path, letters, selected: int | None = None) -> Path:
    """A report's ``OUT/replay_plan/`` selecting ``letters`` (DeadLetters, or (task_id, dlq) pairs)."""
    rows = []
    for n, letter in enumerate(letters):
        task_id, dlq = letter if isinstance(letter, tuple) else (letter.task_id, letter.queue)
        rows.append({"task_id": task_id, "task_name": "shop.charge", "queue": "orders", "dlq": dlq,
                     "exception_type": "ValueError", "reason": "max_delivery_attempts", "delivery": 3,
                     "dead_lettered_at": int((T0 + n) * 1e6), "payload_hash": f"h{n}", "event_id": f"{n}-0"})
    root = out / "replay_plan"
    (root / "entries").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=PLAN_SCHEMA), root / "entries" / "part-00000.parquet")
    by_dlq: dict[str, int] = {}
    for row in rows:
        by_dlq[row["dlq"]] = by_dlq.get(row["dlq"], 0) + 1
    manifest = {"version": 1, "created_at": "2023-11-14T22:13:20Z", "as_of": "2023-11-14T22:13:20Z",
                "source": "archive", "predicates": {}, "entries": "entries", "by_dlq": by_dlq,
                "counts": {"in_dlq": len(rows), "matched": len(rows), "excluded_poison": 0,
                           "selected": len(rows) if selected is None else selected}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return out


@pytest.fixture
def run(app, fake, monkeypatch):
    """``celery dlq ARGS`` in-process, with the operator on fakeredis."""
    ops = Operator(app, broker=fake, client=fake, clock=FakeClock())
    monkeypatch.setattr(cli_base, "make_operator", lambda _app: ops)

    def invoke(*args):
        return CliRunner().invoke(cli.dlq, list(args), obj=CLIContext(app=app, no_color=True, workdir=None))
    return invoke


def ids_in(fake, queue: str) -> list[str]:
    return [message["headers"]["id"] for message in stored(fake, queue)]


# -- the dlq group ---------------------------------------------------------------

#: Runs the real `celery` program, then prints which heavy modules it had imported (atexit: celery exits).
CELERY = """
import atexit, json, runpy, sys
atexit.register(lambda: print("IMPORTED " + json.dumps(sorted(
    name for name in sys.modules if name.split(".")[0] in ("pyspark", "py4j", "pyarrow", "celery_dlq"))),
    file=sys.stderr))
sys.argv = ["celery", *sys.argv[1:]]
runpy.run_module("celery", run_name="__main__")
"""


def test_export_and_report_are_dlq_commands_and_their_help_starts_no_jvm():
    """Through the real `celery` program (the celery.commands entry point of pyproject.toml)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "DLQ_TEST_BROKER": "redis://127.0.0.1:1/0",
           "DLQ_TEST_QUEUE": "orders", "DLQ_TEST_PREFIX": "ops"}

    def celery(*args):
        proc = subprocess.run([sys.executable, "-c", CELERY, "-A", "tests.integration.ops_app", "dlq", *args],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (line,) = [line for line in proc.stderr.splitlines() if line.startswith("IMPORTED ")]
        return proc.stdout, set(json.loads(line[len("IMPORTED "):]))

    listing, imported = celery("--help")
    commands = {line.split()[0] for line in listing.split("Commands:")[1].splitlines() if line.strip()}
    assert {"export", "report", "replay", "list", "purge"} <= commands
    assert {"celery_dlq.cli", "celery_dlq.cli.analytics"} <= imported
    for command, option in (("report", "--replay-exception"), ("export", "--snapshot"), ("replay", "--plan")):
        text, imported = celery(command, "--help")
        assert option in text
        assert not {name for name in imported if not name.startswith("celery_dlq")}, (command, imported)
        assert not {name for name in imported if name.startswith("celery_dlq.analytics")}, (command, imported)


# -- replay --plan -----------------------------------------------------------------

def test_plan_dry_run_moves_nothing_then_replays_exactly_the_plan(run, fake, tmp_path):
    a, b, c = (dead_letter(fake, args=(n,)) for n in range(3))
    mail = dead_letter(fake, task="shop.send_receipt", queue="emails")
    plan = write_plan(tmp_path / "report", [a, c, mail])
    before = {key: fake.lrange(key, 0, -1) for key in ("DLQ.orders", "DLQ.emails")}

    dry = run("replay", "--plan", str(plan), "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert dry.output.splitlines() == [
        f"Replay plan {plan}/replay_plan: 3 dead letters from DLQ.orders (2), DLQ.emails (1); "
        "report of 2023-11-14T22:13:20Z.",
        "Would replay 2 of 2 matching dead letters from DLQ.orders: 2 to orders (dry run: nothing moved).",
        "Would replay 1 of 1 matching dead letter from DLQ.emails: 1 to emails (dry run: nothing moved).",
    ]
    assert {key: fake.lrange(key, 0, -1) for key in before} == before
    assert fake.llen("orders") == fake.llen("emails") == 0

    done = run("replay", "--plan", str(plan / "replay_plan"))       # the replay_plan/ directory itself
    assert done.exit_code == 0, done.output
    assert done.output.splitlines()[1:] == [
        "Replayed 2 of 2 matching dead letters from DLQ.orders: 2 to orders.",
        "Replayed 1 of 1 matching dead letter from DLQ.emails: 1 to emails.",
    ]
    assert ids_in(fake, "orders") == [a.task_id, c.task_id] and ids_in(fake, "emails") == [mail.task_id]
    assert ids_in(fake, "DLQ.orders") == [b.task_id] and fake.llen("DLQ.emails") == 0
    assert all(m["headers"]["x-dlq-replay-count"] == 1 for m in stored(fake, "orders"))


def test_planned_ids_no_longer_in_the_dlq_are_counted_and_exit_1(run, fake, tmp_path):
    a, b = dead_letter(fake, args=(1,)), dead_letter(fake, args=(2,))
    plan = write_plan(tmp_path, [a, ("gone-1", "DLQ.orders"), b, ("gone-2", "DLQ.orders")])

    result = run("replay", "--plan", str(tmp_path))
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines[1] == "Replayed 2 of 2 matching dead letters from DLQ.orders: 2 to orders."
    assert lines[2] == ("2 of 4 planned dead letters no longer in DLQ.orders "
                        "(replayed, purged or trimmed since the report): gone-1, gone-2")
    assert lines[-1] == "Error: 2 of 4 planned dead letters were not replayed"
    assert ids_in(fake, "orders") == [a.task_id, b.task_id]

    again = run("replay", "--plan", str(plan), "--dry-run")         # everything replayed already
    assert again.exit_code == 1
    assert "4 of 4 planned dead letters no longer in DLQ.orders" in again.output
    assert again.output.splitlines()[-1] == "Error: 4 of 4 planned dead letters would not be replayed"


def test_each_planned_id_moves_once_the_oldest_and_one_that_cannot_go_home_is_a_failure(run, fake, tmp_path):
    first = dead_letter(fake, args=(1,), at=T0)
    twin = dict(first.message, headers=dict(first.headers, **{"x-dlq-dead-lettered-at": T0 + 5}))
    fake.lpush("DLQ.orders", json.dumps(twin))                      # same task id again, newer
    homeless = dead_letter(fake, args=(2,))
    message = dict(homeless.message, headers={k: v for k, v in homeless.headers.items()
                                              if k != "x-dlq-original-queue"})
    fake.lset("DLQ.orders", 0, json.dumps(message))
    write_plan(tmp_path, [first, homeless])

    result = run("replay", "--plan", str(tmp_path))
    assert result.exit_code == 1
    assert "Replayed 1 of 2 matching dead letters from DLQ.orders: 1 to orders." in result.output
    assert f"failed: {homeless.task_id}: no x-dlq-original-queue header; use to=" in result.output
    assert result.output.splitlines()[-1] == "Error: 1 of 2 planned dead letters were not replayed"
    (moved,) = stored(fake, "orders")
    assert moved["headers"]["x-dlq-dead-lettered-at"] == first.headers["x-dlq-dead-lettered-at"]
    assert ids_in(fake, "DLQ.orders") == [first.task_id, homeless.task_id]  # the twin and the homeless one

    write_plan(tmp_path / "homeless", [homeless])
    routed = run("replay", "--plan", str(tmp_path / "homeless"), "--to", "repair")   # --to gives it a home
    assert routed.exit_code == 0, routed.output
    assert "Replayed 1 of 1 matching dead letter from DLQ.orders: 1 to repair." in routed.output
    assert ids_in(fake, "repair") == [homeless.task_id] and ids_in(fake, "DLQ.orders") == [first.task_id]


def test_rate_paces_across_every_dlq_of_the_plan(run, fake, tmp_path, monkeypatch):
    import threading
    import time

    # Only this test's thread sees the fake clock: a thread an earlier test left running in this process
    # keeps the real one (its sleeps would otherwise land in ``slept``).
    clock, slept, me = [0.0], [], threading.current_thread()
    real_sleep, real_monotonic = time.sleep, time.monotonic

    def sleep(seconds):
        if threading.current_thread() is not me:
            return real_sleep(seconds)
        slept.append(round(seconds, 6))
        clock[0] += seconds
    monkeypatch.setattr(time, "sleep", sleep)
    monkeypatch.setattr(time, "monotonic", lambda: clock[0] if threading.current_thread() is me else real_monotonic())
    letters = [dead_letter(fake, args=(n,)) for n in range(2)] + [dead_letter(fake, queue="emails")]
    write_plan(tmp_path, letters)

    result = run("replay", "--plan", str(tmp_path), "--rate", "2")
    assert result.exit_code == 0, result.output
    assert sum(slept) == 1.0 and clock[0] == 1.0                    # 3 messages at 2/s: 0, 0.5, 1.0 s
    assert fake.llen("orders") == 2 and fake.llen("emails") == 1


def test_each_dlq_of_the_plan_is_read_in_one_pass(app, fake, tmp_path, monkeypatch):
    broker = CountingRedis(fake)
    ops = Operator(app, broker=broker, client=fake, clock=FakeClock())
    monkeypatch.setattr(cli_base, "make_operator", lambda _app: ops)
    letters = [dead_letter(fake, args=(n,), priority=3 * (n % 2)) for n in range(4)]
    skipped = dead_letter(fake, args=(9,))
    write_plan(tmp_path, letters[::-1] + [("gone", "DLQ.orders")])
    result = CliRunner().invoke(cli.dlq, ["replay", "--plan", str(tmp_path)],
                                obj=CLIContext(app=app, no_color=True, workdir=None))
    assert result.exit_code == 1 and "1 of 5 planned dead letters no longer in DLQ.orders" in result.output
    assert "Replayed 4 of 4 matching dead letters from DLQ.orders: 4 to orders." in result.output
    assert read_once(broker.lranges, "DLQ.orders")     # one pass for every planned id (and the missing one)
    assert ids_in(fake, "DLQ.orders") == [skipped.task_id]


def test_queue_limits_the_plan_to_one_dlq(run, fake, tmp_path):
    order, mail = dead_letter(fake), dead_letter(fake, queue="emails")
    write_plan(tmp_path, [order, mail])
    result = run("replay", "emails", "--plan", str(tmp_path))       # the queue names its DLQ
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"Replay plan {tmp_path}/replay_plan: 1 dead letter from DLQ.emails (1); report of 2023-11-14T22:13:20Z.",
        "Replayed 1 of 1 matching dead letter from DLQ.emails: 1 to emails.",
    ]
    assert fake.llen("DLQ.orders") == 1 and fake.llen("emails") == 1
    dead_letter(fake, queue="refunds")
    other = run("replay", "DLQ.refunds", "--plan", str(tmp_path))
    assert other.exit_code == 1 and "the plan selects nothing from DLQ.refunds" in other.output


def test_an_empty_dlq_of_the_plan_is_missing_but_a_live_queue_is_refused(run, fake, tmp_path):
    write_plan(tmp_path / "gone", [("t1", "DLQ.gone")])
    gone = run("replay", "--plan", str(tmp_path / "gone"))
    assert gone.exit_code == 1 and "1 of 1 planned dead letter no longer in DLQ.gone" in gone.output

    live = dead_letter(fake)
    fake.lpush("orders", fake.lindex("DLQ.orders", 0))              # a task waiting in the live queue
    write_plan(tmp_path / "live", [(live.task_id, "orders")])
    refused = run("replay", "--plan", str(tmp_path / "live"))
    assert refused.exit_code == 2
    assert refused.output == "Error: the plan names 'orders', which is not a dead-letter queue here\n"
    into_itself = run("replay", "--plan", str(write_plan(tmp_path / "self", [live])), "--to", "DLQ.orders")
    assert into_itself.exit_code == 2 and "cannot replay DLQ.orders into itself" in into_itself.output
    assert fake.llen("orders") == 1 and fake.llen("DLQ.orders") == 1


def test_a_missing_or_broken_plan_is_one_line_and_exit_2(run, fake, tmp_path):
    letter = dead_letter(fake)
    cases = {}
    cases["missing"] = tmp_path / "nope"
    cases["empty dir"] = tmp_path / "empty"
    cases["empty dir"].mkdir()
    cases["count"] = write_plan(tmp_path / "count", [letter], selected=2)
    cases["not json"] = write_plan(tmp_path / "json", [letter])
    (cases["not json"] / "replay_plan" / "manifest.json").write_text("{not json")
    cases["not an object"] = write_plan(tmp_path / "list", [letter])
    (cases["not an object"] / "replay_plan" / "manifest.json").write_text("[1]")
    cases["no entries"] = write_plan(tmp_path / "entries", [letter])
    (cases["no entries"] / "replay_plan" / "entries" / "part-00000.parquet").unlink()
    (cases["no entries"] / "replay_plan" / "entries").rmdir()
    cases["corrupt"] = write_plan(tmp_path / "corrupt", [letter])
    (cases["corrupt"] / "replay_plan" / "entries" / "part-00000.parquet").write_bytes(b"not parquet")
    cases["columns"] = write_plan(tmp_path / "columns", [letter])
    pq.write_table(pa.table({"task_id": [letter.task_id]}),
                   cases["columns"] / "replay_plan" / "entries" / "part-00000.parquet")
    expected = {"missing": "no replay plan at", "empty dir": "no replay plan at",
                "count": "1 entries but the manifest says 2",
                "not json": "unreadable", "not an object": "is not a replay plan manifest",
                "no entries": "unreadable replay plan entries", "corrupt": "unreadable replay plan entries",
                "columns": "no column dlq, dead_lettered_at"}
    for case, path in cases.items():
        result = run("replay", "--plan", str(path))
        assert result.exit_code == 2, (case, result.output)
        assert len(result.output.splitlines()) == 1 and result.output.startswith("Error: "), (case, result.output)
        assert expected[case] in result.output, (case, result.output)
    assert fake.llen("DLQ.orders") == 1 and fake.llen("orders") == 0


def test_plan_with_another_selection_or_no_selection_is_a_usage_error(run, fake, tmp_path):
    letter = dead_letter(fake)
    write_plan(tmp_path, [letter])
    for extra, named in (([letter.task_id], "TASK_ID..."), (["--all"], "--all"), (["--task", "shop.*"], "--task"),
                         (["--limit", "1"], "--limit"), (["--since", "2h", "--grep", "x"], "--since, --grep")):
        result = run("replay", "DLQ.orders", *extra, "--plan", str(tmp_path))
        assert result.exit_code == 2, result.output
        assert f"--plan selects the dead letters itself: drop {named}" in result.output
    assert run("replay").exit_code == 2                              # neither QUEUE nor --plan
    assert "say which DLQ: QUEUE, or --plan DIR" in run("replay").output
    assert fake.llen("DLQ.orders") == 1 and fake.llen("orders") == 0


def test_an_empty_plan_replays_nothing_and_succeeds(run, fake, tmp_path):
    dead_letter(fake)
    write_plan(tmp_path, [])
    result = run("replay", "--plan", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == "The plan selects no dead letters: nothing to replay."
    assert fake.llen("DLQ.orders") == 1


def test_plan_dlqs_follow_the_global_keyprefix(app, fake, tmp_path, monkeypatch):
    app.conf.broker_transport_options = {"global_keyprefix": "tenant:"}
    ops = Operator(app, broker=fake, client=fake, clock=FakeClock())
    monkeypatch.setattr(cli_base, "make_operator", lambda _app: ops)
    letter = dead_letter(fake, prefix="tenant:")
    write_plan(tmp_path, [letter])
    result = CliRunner().invoke(cli.dlq, ["replay", "--plan", str(tmp_path)],
                                obj=CLIContext(app=app, no_color=True, workdir=None))
    assert result.exit_code == 0, result.output
    assert fake.llen("tenant:DLQ.orders") == 0 and ids_in(fake, QueueLists("tenant:").key("orders")) == \
        [letter.task_id]


def test_export_is_wired_into_the_group_and_an_unreachable_redis_is_one_sanitized_line(tmp_path):
    app = Celery("ops", broker="redis://ops:s3cret@127.0.0.1:1/0", set_as_current=False)  # nothing listens on 1
    result = CliRunner().invoke(cli.dlq, ["export", "--out", str(tmp_path / "archive")],
                                obj=CLIContext(app=app, no_color=True, workdir=None))
    assert result.exit_code == 1
    assert result.output.startswith("Error: cannot reach Redis at redis://ops:**@127.0.0.1:1/0: ")
    assert len(result.output.splitlines()) == 1 and "s3cret" not in result.output


def test_report_options_are_checked_by_the_group_before_any_spark(run, tmp_path):
    result = run("report", "--in", str(tmp_path), "--out", str(tmp_path / "out"), "--conf", "no-equals-sign")
    assert result.exit_code == 2 and "--conf takes key=value, got 'no-equals-sign'" in result.output
    assert not (tmp_path / "out").exists()
