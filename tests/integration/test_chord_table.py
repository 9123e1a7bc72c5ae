"""The issue's table (#32, docs/workflows.md): every row under each chord rule, on each result backend.

One worker per backend runs every row three times at once, once per rule
(the rule set per call, on every task of the row: ``x-dlq-chord-rule``),
as the issue tried it: every task a ``RedeliveryTask`` with a delay of
0.2 s and 3 attempts. ``proj.flaky_echo`` fails twice, then returns its
argument; ``proj.broken_echo`` fails while ``<prefix>:broken`` exists (three
deliveries, then dead-lettered) and returns its argument once fixed. Then
every letter is replayed. The chord bodies (``proj.tsum``) log each run and
its argument in ``<prefix>:body``; the errbacks (``proj.chord_failed``) log
the id they are called with in ``<prefix>:errbacks``.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import pytest
from celery import chain, chord, group

from celery_dlq.storage.keys import Keys
from celery_dlq.workflow import chord_rule, is_placeholder

pytestmark = pytest.mark.integration

RULES = ("fail", "wait", "continue")
#: The ledger state a dead-lettered chord member's rule leaves it in.
HELD = {"fail": "failed", "wait": "waiting", "continue": "continued"}
HEADER = [0, 2, 4]          # add(i, i) for i in range(3)


@dataclass
class Rows:
    """One rule's six rows, as applied: the results to wait on and the ids to count by."""

    rule: str
    chain_flaky: object
    chain_dead: object
    chord_flaky: object
    chord_dead: object
    chord_dead_member: str
    linked: object
    group_flaky: object


def apply_rows(h, rule: str) -> Rows:
    headers = {"headers": chord_rule(rule)}

    def sig(name, *args):
        return h.app.signature(name, args=args, **headers)

    def body():
        return sig("proj.tsum").on_error(sig("proj.chord_failed"))

    chord_dead = chord([sig("proj.add", i, i) for i in range(3)] + [sig("proj.broken_echo", 100)])(body())
    return Rows(
        rule=rule,
        chain_flaky=chain(sig("proj.add", 1, 1), sig("proj.flaky_echo"), sig("proj.add", 10)).apply_async(),
        chain_dead=chain(sig("proj.add", 1, 1), sig("proj.broken_echo"), sig("proj.add", 10)).apply_async(),
        chord_flaky=h.app.AsyncResult(chord([sig("proj.add", i, i) for i in range(3)]
                                            + [sig("proj.flaky_echo", 100)])(body()).id),
        chord_dead=h.app.AsyncResult(chord_dead.id),       # a fresh handle: the chord's own re-raises
        chord_dead_member=chord_dead.parent.results[-1].id,
        linked=sig("proj.broken_echo", 7).on_error(sig("proj.chord_failed")).apply_async(),
        group_flaky=group([sig("proj.add", 1, 2), sig("proj.flaky_echo", 5)]).apply_async(),
    )


def body_runs(h, body_id: str) -> list:
    """The argument of each run of the chord body ``body_id``."""
    runs = [json.loads(r) for r in h.redis.lrange(f"{h.prefix}:body", 0, -1)]
    return [run["values"] for run in runs if run["id"] == body_id]


def errbacks(h) -> Counter:
    """How many times an errback was called, by the id it was called with."""
    return Counter(json.loads(r)["task_id"] for r in h.redis.lrange(f"{h.prefix}:errbacks", 0, -1))


def stored(h, task_id: str) -> dict:
    """The backend's record of ``task_id`` now: Celery caches a FAILURE that a replay later turns SUCCESS."""
    return h.app.backend.get_task_meta(task_id, cache=False)


def member_state(h, task_id: str) -> str | None:
    value = h.redis.hget(Keys(h.prefix).chord_member(task_id), "state")
    return value.decode() if value else None


def expected_errbacks(every: list[Rows]) -> Counter:
    """The linked task's errback once (when dead-lettered); the chord body's once under ``fail``."""
    return Counter({rows.linked.id: 1 for rows in every}) + Counter(
        {rows.chord_dead.id: 1 for rows in every if rows.rule == "fail"})


@pytest.mark.parametrize("backend", ["redis", "sqlite"])
def test_every_row_of_the_issue_table_under_each_rule(harness, backend):
    h = harness
    h.backend = h.broker if backend == "redis" else f"db+sqlite:///{h.tmp_path}/results.sqlite"
    h.app.conf.result_backend = h.backend
    h.extra_env["DLQ_TEST_CONF"] = json.dumps({"result_backend": h.backend})
    h.redis.set(f"{h.prefix}:broken", 1)
    h.worker(concurrency=3)
    every = [apply_rows(h, rule) for rule in RULES]

    # Redelivered, never dead-lettered: the chain, the chord and the group complete as they would unharmed.
    for rows in every:
        assert rows.chain_flaky.get(timeout=60) == 12
        assert rows.chord_flaky.get(timeout=60) == 106
        assert rows.group_flaky.get(timeout=60) == [3, 5]
        assert body_runs(h, rows.chord_flaky.id) == [HEADER + [100]]

    # Dead-lettered: the chain's middle, the chord's member, the linked task; each chord held by its rule.
    h.wait_until(lambda: len(h.dead_letters()) == 3 * len(RULES), timeout=60, message="nine letters")
    for rows in every:
        h.wait_until(lambda r=rows: member_state(h, r.chord_dead_member) == HELD[r.rule],
                     message=f"the member held by rule {rows.rule}")
        assert len(h.deliveries(rows.linked.id)) == 3 and len(h.deliveries(rows.chord_dead_member)) == 3
    h.wait_until(lambda: errbacks(h) == expected_errbacks(every), message="the errbacks")
    by_rule = {rows.rule: rows for rows in every}
    h.wait_until(lambda: by_rule["continue"].chord_dead.ready(), message="the continue body")
    h.wait_until(lambda: by_rule["fail"].chord_dead.state == "FAILURE", message="the fail body failed")
    assert f"DLQ.{h.queue}" in str(by_rule["fail"].chord_dead.result)
    h.after_a_mover_pass()
    assert by_rule["wait"].chord_dead.state == "PENDING" and body_runs(h, by_rule["wait"].chord_dead.id) == []
    [values] = body_runs(h, by_rule["continue"].chord_dead.id)
    assert values[:3] == HEADER and is_placeholder(values[3])
    assert values[3]["task_id"] == by_rule["continue"].chord_dead_member

    # The fix deployed, every letter replayed.
    h.redis.delete(f"{h.prefix}:broken")
    done = h.dlq("replay", f"DLQ.{h.queue}", "--all", conf={"result_backend": h.backend})
    assert done.returncode == 0, done.stderr
    for rows in every:
        # Celery stored FAILURE for the chain's tail when its middle died; the replay turns it SUCCESS.
        h.wait_until(lambda r=rows: stored(h, r.chain_dead.id)["status"] == "SUCCESS",
                     message="the chain's tail after the replay")
        assert stored(h, rows.chain_dead.id)["result"] == 12   # the chain went on from its replayed middle
        # The linked task's stored FAILURE turns SUCCESS with the replay.
        h.wait_until(lambda r=rows: stored(h, r.linked.id)["status"] == "SUCCESS",
                     message="the linked task's replay")
        assert stored(h, rows.linked.id)["result"] == 7
    assert by_rule["wait"].chord_dead.get(timeout=60) == 106
    for rows in every:
        h.wait_until(lambda r=rows: len(h.deliveries(r.chord_dead_member)) == 4, message="the member's replay")
    h.wait_until(lambda: member_state(h, by_rule["wait"].chord_dead_member) == "released", message="released")
    h.after_a_mover_pass()

    # Exactly 0 or 1 body run per chord as its rule says, each errback exactly once.
    assert body_runs(h, by_rule["wait"].chord_dead.id) == [HEADER + [100]]
    assert body_runs(h, by_rule["fail"].chord_dead.id) == []
    assert len(body_runs(h, by_rule["continue"].chord_dead.id)) == 1
    for rows in every:
        assert body_runs(h, rows.chord_flaky.id) == [HEADER + [100]]
        assert len(h.deliveries(rows.linked.id)) == 4
    assert errbacks(h) == expected_errbacks(every)
    assert h.dead_letters() == []
