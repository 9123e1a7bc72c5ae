"""``celery dlq jobs``, ``audit`` and the audited, editable ``replay``/``purge`` (in-process, fakeredis)."""
from __future__ import annotations

import base64
import json
from types import SimpleNamespace

from celery_dlq.cli import base as cli_base
from celery_dlq.ops import Operator
from celery_dlq.ops.audit import os_identity
from tests.unit.test_manage import dead_letter, run, stored


def test_a_job_started_paused_resumed_run_and_listed_from_the_cli(app, fake):
    letters = [dead_letter(fake, args=(i,)) for i in range(3)]
    ops = Operator(app, broker=fake, client=fake)
    out = run(app, fake, "jobs", "start", "orders", "--all", "--rate", "1000", "--why", "gateway back", ops=ops)
    assert out.exit_code == 0, out.output
    job_id = out.output.split()[1]
    assert "paused" in run(app, fake, "jobs", "pause", job_id, ops=ops).output
    assert run(app, fake, "jobs", "pause", job_id, ops=ops).exit_code == 1     # already paused: says why
    assert "running" in run(app, fake, "jobs", "resume", job_id, ops=ops).output
    out = run(app, fake, "jobs", "run", "--once", ops=ops)
    assert out.exit_code == 0 and f"job {job_id} done: 3 moved" in out.output, out.output
    (row,) = json.loads(run(app, fake, "jobs", "--json", ops=ops).output)
    assert row["id"] == job_id and row["state"] == "done" and row["done"] == 3 and row["who"] == os_identity()
    assert sorted(m["headers"]["id"] for m in stored(fake, "orders")) == sorted(d.task_id for d in letters)
    trail = json.loads(run(app, fake, "audit", "--json", ops=ops).output)
    assert [r["action"] for r in trail] == ["replay", "resume", "pause", "start"]
    assert trail[-1]["why"] == "gateway back" and trail[0]["counts"]["done"] == 3


def test_a_second_job_on_a_dlq_is_refused_unless_forced(app, fake):
    dead_letter(fake)
    ops = Operator(app, broker=fake, client=fake)
    assert run(app, fake, "jobs", "start", "orders", "--all", ops=ops).exit_code == 0
    busy = run(app, fake, "jobs", "start", "orders", "--all", ops=ops)
    assert busy.exit_code == 1 and "working DLQ.orders already" in busy.output
    assert run(app, fake, "jobs", "start", "orders", "--all", "--force", ops=ops).exit_code == 0


def test_replay_and_purge_record_who_why_and_counts(app, fake):
    keep, drop = dead_letter(fake, args=(1,)), dead_letter(fake, args=(2,))
    ops = Operator(app, broker=fake, client=fake)
    assert run(app, fake, "replay", "orders", keep.task_id, "--why", "INC-12", ops=ops).exit_code == 0
    assert run(app, fake, "purge", "orders", drop.task_id, "--force", "--why", "junk", ops=ops).exit_code == 0
    purge, replay = json.loads(run(app, fake, "audit", "--json", ops=ops).output)
    assert (replay["action"], replay["why"], replay["counts"]["done"]) == ("replay", "INC-12", 1)
    assert replay["selection"]["ids"] == [keep.task_id] and replay["who"] == os_identity()
    assert (purge["action"], purge["why"], purge["counts"]["done"]) == ("purge", "junk", 1)
    assert "INC-12" in run(app, fake, "audit", ops=ops).output


def test_an_edited_replay_from_the_cli_runs_the_new_args_and_keeps_the_original(app, fake):
    letter = dead_letter(fake, args=(1,), kwargs={"kind": "key"})
    ops = Operator(app, broker=fake, client=fake)
    bad = run(app, fake, "replay", letter.task_id, "--args", "[1,", ops=ops)
    assert bad.exit_code == 2 and "--args is not JSON" in bad.output
    out = run(app, fake, "replay", letter.task_id, "--args", "[7]", "--header", "x-note=fixed", "--why", "typo",
              ops=ops)
    assert out.exit_code == 0, out.output
    (message,) = stored(fake, "orders")
    assert json.loads(base64.b64decode(message["body"]))[:2] == [[7], {"kind": "key"}]
    assert message["headers"]["x-note"] == "fixed" and message["headers"]["id"] == letter.task_id
    (record,) = json.loads(run(app, fake, "audit", "--json", ops=ops).output)
    assert record["action"] == "edit" and record["original"]["args"] == [1] and record["why"] == "typo"


def test_a_replay_plan_starts_one_job_per_dlq_and_runs_them(app, fake, tmp_path):
    from tests.unit.test_cli_plan import write_plan

    a, b = dead_letter(fake, args=(1,)), dead_letter(fake, args=(2,))
    mail = dead_letter(fake, task="shop.send_receipt", queue="emails")
    plan = write_plan(tmp_path, [a, mail])
    ops = Operator(app, broker=fake, client=fake)
    refused = run(app, fake, "jobs", "start", "orders", "--plan", str(plan), ops=ops)
    assert refused.exit_code == 2 and "--plan selects the letters itself" in refused.output
    out = run(app, fake, "jobs", "start", "--plan", str(plan), "--run", "--why", "report 12", ops=ops)
    assert out.exit_code == 0, out.output
    assert out.output.count("started: replay 1 selected task id(s) of DLQ.") == 2 and out.output.count(" done: 1 moved") == 2
    assert [m["headers"]["id"] for m in stored(fake, "orders")] == [a.task_id]
    assert [m["headers"]["id"] for m in stored(fake, "emails")] == [mail.task_id]
    assert [m["headers"]["id"] for m in stored(fake, "DLQ.orders")] == [b.task_id]


def test_follow_prints_until_the_job_ends_and_takes_over_a_job_nobody_runs(app, fake):
    dead_letter(fake)
    ops = Operator(app, broker=fake, client=fake)
    job_id = run(app, fake, "jobs", "start", "orders", "--all", ops=ops).output.split()[1]
    out = run(app, fake, "jobs", "follow", job_id, "--every", "0.05", ops=ops)
    assert out.exit_code == 0 and out.output.splitlines()[-1].startswith(f"job {job_id} done: 1 moved"), out.output
    assert fake.llen("orders") == 1
    (row,) = json.loads(run(app, fake, "jobs", "follow", job_id, "--json", ops=ops).output)
    assert row["state"] == "done"


def test_a_purge_job_asks_first_and_refuses_without_force_when_nobody_can_answer(app, fake, monkeypatch):
    """Issue 45 M3: ``jobs start QUEUE --all --purge`` deleted without asking, where ``purge`` refuses."""
    for i in range(2):
        dead_letter(fake, args=(i,))
    ops = Operator(app, broker=fake, client=fake)
    refused = run(app, fake, "jobs", "start", "orders", "--all", "--purge", "--run", ops=ops)   # stdin: no tty
    assert refused.exit_code != 0 and "without --force" in refused.output, refused.output
    assert fake.llen("DLQ.orders") == 2 and json.loads(run(app, fake, "jobs", "--json", ops=ops).output) == []
    monkeypatch.setattr(cli_base, "sys", SimpleNamespace(stdin=SimpleNamespace(isatty=lambda: True)))
    monkeypatch.setattr("click.confirm", _answer(False))
    declined = run(app, fake, "jobs", "start", "orders", "--all", "--purge", "--run", ops=ops)
    assert declined.exit_code != 0 and fake.llen("DLQ.orders") == 2
    asked: list[str] = []
    monkeypatch.setattr("click.confirm", _answer(True, asked))
    yes = run(app, fake, "jobs", "start", "orders", "--all", "--purge", "--run", ops=ops)
    assert yes.exit_code == 0, yes.output
    assert asked == ["This will delete 2 dead letters from DLQ.orders. There is no undo. Continue?"]
    assert fake.llen("DLQ.orders") == 0
    dead_letter(fake)
    monkeypatch.setattr(cli_base, "sys", SimpleNamespace(stdin=SimpleNamespace(isatty=lambda: False)))
    forced = run(app, fake, "jobs", "start", "orders", "--all", "--purge", "--force", "--run", ops=ops)
    assert forced.exit_code == 0 and fake.llen("DLQ.orders") == 0, forced.output


def _answer(yes: bool, asked: list | None = None):
    import click

    def confirm(text: str, abort: bool = False, **_: object) -> bool:
        if asked is not None:
            asked.append(text)
        if not yes and abort:
            raise click.Abort()
        return yes
    return confirm
