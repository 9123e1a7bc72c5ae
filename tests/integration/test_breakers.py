"""Circuit breakers and snoozes with real workers: what ran is read from the tasks' delivery log in Redis."""
from __future__ import annotations

import json

from celery_dlq.storage import breaker_state as B
from celery_dlq.storage.breakers import Breakers
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.totals import Metric, field
from celery_dlq.worker.run.events import BREAKER_CHANGED


def breakers(h) -> list[dict]:
    return [json.loads(v) for v in h.redis.hgetall(Keys(h.prefix).breakers).values()]


def breaker_events(h) -> list[str]:
    """The states breakers went through, from the archive stream, in order."""
    rows = h.redis.xrange(Keys(h.prefix).events)
    return [f[b"reason"].decode() for _, f in rows if f.get(b"type", b"").strip(b"'") == b"breaker"]


def held_entries(h, queue: str, group: str) -> set[str]:
    return {e.decode() for e in h.redis.zrange(Keys(h.prefix).breaker_held(queue, group), 0, -1)}


def kept_by_fetch(h) -> set[str]:
    """The task ids of the deliveries the fetch script keeps in Redis for an open breaker."""
    members = h.redis.zrange(Keys(h.prefix).breaker_held_raw, 0, -1)
    return {json.loads(m.split(b"\x1f", 2)[2])["headers"]["id"] for m in members}


def ran_ok(h, task_id: str) -> bool:
    return any(row.get("ok") for row in h.deliveries(task_id))


def test_a_failing_group_opens_holds_its_task_only_then_a_probe_closes_it_and_releases(harness):
    h = harness
    h.redis.set(f"{h.prefix}:gateway_down", 1)
    h.worker(concurrency=2)
    first = [h.send("proj.gateway", args=(i,)).id for i in range(3)]
    h.wait_until(lambda: [b["state"] for b in breakers(h)] == ["open"], message="the breaker opens")
    (summary,) = breakers(h)
    assert summary["task"] == "proj.gateway" and summary["queue"] == h.queue

    held = [h.send("proj.gateway", args=(10 + i,)).id for i in range(4)]
    healthy = [h.send("proj.noop", args=(i,)).id for i in range(4)]
    h.wait_until(lambda: all(h.deliveries(t) for t in healthy), message="the queue's other task runs")
    # The first held delivery is parked by the worker (it comes back to probe); the fetch keeps the rest.
    h.wait_until(lambda: set(held) <= {e.split(":")[0] for e in held_entries(h, h.queue, summary["group"])}
                 | kept_by_fetch(h), message="the new deliveries are held")
    assert len(kept_by_fetch(h) & set(held)) >= 2
    assert not any(h.deliveries(t) for t in held)            # held: never run while open
    assert h.redis.hget(Keys(h.prefix).metrics,
                        field(Metric.HELD, queue=h.queue, task="proj.gateway")) is not None

    h.redis.delete(f"{h.prefix}:gateway_down")              # the outage ends: the next probe succeeds
    h.wait_until(lambda: all(ran_ok(h, t) for t in first + held), timeout=60,
                 message="every held and failed delivery succeeds after the close")
    assert [b["state"] for b in breakers(h)] == ["closed"]
    states = breaker_events(h)
    assert states[0] == "open" and states[-2:] == ["half_open", "closed"], states
    for t in held:   # each ran once, successfully, as its first delivery: holding used no attempt
        rows = h.deliveries(t)
        assert [(r["delivery"], r["ok"]) for r in rows] in ([(1, True)], [(1, False), (2, True)]), rows
    assert sum(len(h.deliveries(t)) == 1 for t in held) >= 3   # at most one of them was a failed probe
    for t in first:  # failed once before the breaker opened; its retry was held, then ran
        assert [r["ok"] for r in h.deliveries(t)][-1] is True


def test_pause_and_resume_a_task_from_the_cli(harness):
    h = harness
    h.extra_env["DLQ_TEST_CONF"] = json.dumps({"dlq_task_policies": {"proj.noop": {"breaker": "manual"}},
                                               "dlq_breaker_refresh": 0.2})
    h.worker()
    refused = h.dlq("pause", "proj.noop", "-Q", h.queue)
    assert refused.returncode == 2 and "without --force" in refused.stderr
    assert breakers(h) == []
    paused = h.dlq("pause", "proj.noop", "-Q", h.queue, "--by", "alice", "--force")
    assert paused.returncode == 0, paused.stderr
    (row,) = h.dlq_json("breakers")
    assert (row["task"], row["queue"], row["state"], row["paused_by"]) == ("proj.noop", h.queue, "open", "alice")
    [audited] = [r for r in h.dlq_json("audit") if r["action"] == "pause"]
    assert (audited["who"], audited["task"], audited["queue"]) == ("alice", "proj.noop", h.queue)

    ids = [h.send("proj.noop", args=(i,)).id for i in range(3)]
    other = h.send("proj.flaky", args=(0,)).id
    h.wait_until(lambda: h.deliveries(other), message="another task runs")
    h.wait_until(lambda: h.dlq_json("breakers")[0]["held"] == 3, message="the paused task is held")
    assert not any(h.deliveries(t) for t in ids)

    assert h.dlq("resume", "proj.noop", "-Q", h.queue).returncode == 2
    resumed = h.dlq("resume", "proj.noop", "-Q", h.queue, "--force")
    assert resumed.returncode == 0 and "Closed 1 breaker; 3 held deliveries released" in resumed.stdout
    h.wait_until(lambda: all(h.deliveries(t) for t in ids), message="the held deliveries run")
    assert [[r["delivery"] for r in h.deliveries(t)] for t in ids] == [[1], [1], [1]]
    assert h.dlq_json("breakers")[0]["state"] == "closed"
    [audited] = [r for r in h.dlq_json("audit") if r["action"] == "resume"]
    assert audited["counts"] == {"closed": 1, "released": 3} and "@" in audited["who"]
    assert h.dlq("resume", "proj.noop", "--force").returncode == 1    # nothing left to resume


def test_deliveries_the_fetch_kept_for_a_forgotten_breaker_are_swept_back_and_run_once(harness):
    """A breaker deleted while it held (``forget``, or the worker releasing them killed): the worker holding
    the mover lease finds the kept deliveries no breaker holds and pushes them back, each run once."""
    h = harness
    h.extra_env["DLQ_TEST_CONF"] = json.dumps({"dlq_task_policies": {"proj.noop": {"breaker": "manual"}},
                                               "dlq_jobs_poll": 0.2})
    assert h.dlq("pause", "proj.noop", "-Q", h.queue, "--force").returncode == 0
    h.worker()
    ids = [h.send("proj.noop", args=(i,)).id for i in range(5)]
    h.wait_until(lambda: kept_by_fetch(h) == set(ids), message="the fetch keeps them")
    assert not any(h.deliveries(t) for t in ids)
    (row,) = h.dlq_json("breakers")
    assert Breakers(h.redis, Keys(h.prefix)).forget(h.queue, row["group"])
    h.wait_until(lambda: all(h.deliveries(t) for t in ids), message="swept back and run")
    assert kept_by_fetch(h) == set()
    h.after_a_mover_pass()
    assert [[r["delivery"] for r in h.deliveries(t)] for t in ids] == [[1]] * 5


def test_a_snooze_uses_no_attempt_and_its_bound_dead_letters(harness):
    h = harness
    h.worker()
    ok = h.send("proj.snoozes", kwargs={"times": 2}).id
    over = h.send("proj.snoozes", kwargs={"times": 10}).id
    h.wait_until(lambda: len(h.deliveries(ok)) == 3 and h.dead_letters(), message="a success and a dead letter")
    assert [(r["delivery"], r["snoozed"]) for r in h.deliveries(ok)] == [(1, 0), (1, 1), (1, 2)]
    assert [(r["delivery"], r["snoozed"]) for r in h.deliveries(over)] == [(1, 0), (1, 1), (1, 2), (1, 3)]
    (letter,) = h.dead_letters()
    headers = letter["headers"]
    assert headers["id"] == over and headers["x-dlq-reason"] == "non_retryable"
    assert headers["x-dlq-exception-type"].endswith("SnoozeLimitExceeded")
    assert "max_snoozes=3" in headers["x-dlq-exception-message"]
    assert headers["x-dlq-delivery-count"] == 1 and headers["x-dlq-snoozes"] == 3
    counted = h.redis.hget(Keys(h.prefix).metrics, field(Metric.SNOOZED, queue=h.queue, task="proj.snoozes"))
    assert int(counted) == 5


def test_each_state_change_is_a_task_event_under_the_task_that_caused_it(harness):
    from tests.integration.test_flower import EventTap, events_worker

    h = harness
    tap = EventTap(h.broker).start()
    try:
        h.redis.set(f"{h.prefix}:gateway_down", 1)
        events_worker(h)
        first = [h.send("proj.gateway", args=(i,)).id for i in range(3)]
        h.wait_until(lambda: [e["state"] for e in tap.events if e["type"] == BREAKER_CHANGED] == ["open"],
                     message="the open breaker's event")
        (opened,) = [e for e in tap.events if e["type"] == BREAKER_CHANGED]
        assert opened["uuid"] in first and opened["name"] == "proj.gateway" and opened["queue"] == h.queue
        assert opened["cooldown"] == 4.0 and opened["group"] == breakers(h)[0]["group"]
        h.redis.delete(f"{h.prefix}:gateway_down")
        h.wait_until(lambda: [e["state"] for e in tap.events if e["type"] == BREAKER_CHANGED][-2:]
                     == ["half_open", "closed"], timeout=60, message="the probe's events")
        probe, closed = [e for e in tap.events if e["type"] == BREAKER_CHANGED][-2:]
        assert probe["uuid"] == closed["uuid"] and ran_ok(h, closed["uuid"])
    finally:
        tap.stop()


def test_a_closed_breaker_redrives_its_group_at_a_rising_velocity_exactly_once(harness):
    """20 tasks fail both attempts (dead-lettered) and open the breaker; the outage ends; a held delivery
    probes and closes it; the worker's automatic redrive job replays the 20 letters, 2/s doubling every 5 s."""
    h = harness
    h.redis.set(f"{h.prefix}:gateway_down", 1)
    h.worker(concurrency=2, DLQ_TEST_CONF=json.dumps({"dlq_jobs_poll": 0.2, "dlq_breaker_refresh": 0.2}))
    failed = [h.send("proj.gateway_redrive", args=(i,)).id for i in range(20)]
    h.wait_until(lambda: len(h.dead_letters()) == 20, timeout=60, message="20 dead letters")
    h.wait_until(lambda: [b["state"] for b in breakers(h)] == ["open"], message="the breaker opens")
    h.redis.delete(f"{h.prefix}:gateway_down")
    probe = h.send("proj.gateway_redrive", args=(99,)).id      # held, then the probe after the cool-down
    h.wait_until(lambda: ran_ok(h, probe), timeout=30, message="the probe succeeds")
    h.wait_until(lambda: all(ran_ok(h, t) for t in failed), timeout=60, message="every letter redriven")
    h.wait_until(lambda: h.dead_letters() == [], message="the DLQ empty")

    for t in failed:   # two failed deliveries, then exactly one replay, which succeeded
        assert [r["ok"] for r in h.deliveries(t)] == [False, False, True], h.deliveries(t)
    (job,) = h.dlq_json("jobs")
    assert job["kind"] == "redrive" and job["state"] == "done" and job["done"] == 20, job
    assert job["who"] == f"breaker {h.queue}/{breakers(h)[0]['group']}"
    assert any(row["action"] == "start" and row["who"] == job["who"] for row in h.dlq_json("audit"))
    replayed = sorted(r["at"] for t in failed for r in h.deliveries(t) if r["ok"])
    first, last = replayed[:8], replayed[-8:]
    # 2/s for the first 5 s (8 letters in pairs a second apart: 3 s), 4/s after (8 letters: 2 s)
    assert first[-1] - first[0] >= 2.5, replayed
    assert last[-1] - last[0] <= (first[-1] - first[0]) * 0.75, replayed
    assert job["rate"] >= 4.0, job


def test_an_automatic_redrive_stops_when_the_failures_return(harness):
    """6 letters open the breaker; a probe closes it; the redrive replays at 1/s; after its first success the
    outage returns and 8 new failures open the breaker again: the job stops, the rest stay dead letters."""
    h = harness
    h.redis.set(f"{h.prefix}:gateway_down", 1)
    h.worker(concurrency=2, DLQ_TEST_CONF=json.dumps({"dlq_jobs_poll": 0.2, "dlq_breaker_refresh": 0.2}))
    first = [h.send("proj.gateway_flaps", args=(i,)).id for i in range(6)]
    h.wait_until(lambda: len(h.dead_letters()) == 6, timeout=30, message="6 dead letters")
    h.wait_until(lambda: [b["state"] for b in breakers(h)] == ["open"], message="the breaker opens")
    h.redis.delete(f"{h.prefix}:gateway_down")
    probe = h.send("proj.gateway_flaps", args=(99,)).id
    h.wait_until(lambda: ran_ok(h, probe), timeout=30, message="the probe succeeds")
    h.wait_until(lambda: any(ran_ok(h, t) for t in first), timeout=30, message="the redrive's first success")
    h.redis.set(f"{h.prefix}:gateway_down", 1)                  # the outage is back
    for i in range(8):
        h.send("proj.gateway_flaps", args=(100 + i,))
    h.wait_until(lambda: h.dlq_json("jobs")[0]["state"] == "stopped", timeout=30, message="the redrive stops")

    (job,) = h.dlq_json("jobs")
    assert "breaker" in job["reason"] and job["who"].startswith("breaker "), job
    assert [b["state"] for b in breakers(h)] == ["open"]
    h.after_a_mover_pass()
    replayed = [t for t in first if len(h.deliveries(t)) > 1]
    assert 1 <= len(replayed) < 6 and job["done"] == len(replayed), (replayed, job)
    for t in first:   # the failed delivery, then at most one replay
        assert len(h.deliveries(t)) <= 2, h.deliveries(t)
    left = {letter["headers"]["id"] for letter in h.dead_letters()}
    assert set(first) - set(replayed) <= left   # the rest wait in the DLQ for the next close



def test_held_deliveries_are_released_at_a_rising_pace_after_the_breaker_closes(harness):
    """The pace a recovered service sees, with a real worker: a trickle first, then faster each second.

    ``proj.gateway`` releases 2 a second after its breaker closes, doubling each second up to 20. Of the
    40 deliveries held while it was open, those the fetch kept in Redis are pushed back at that pace by the
    worker that closed it: the k-th to run (from 0) cannot start before the pace had released k + 1
    (:func:`~celery_dlq.storage.breaker_state.release_offsets`), and each of the first three seconds runs
    more than the one before. All at once (no pace) or at a flat 2 a second (no rise) both fail."""
    h = harness
    h.redis.set(f"{h.prefix}:gateway_down", 1)
    h.worker(concurrency=4)
    for i in range(3):
        h.send("proj.gateway", args=(i,))
    h.wait_until(lambda: [b["state"] for b in breakers(h)] == ["open"], message="the breaker opens")
    (summary,) = breakers(h)
    held = [h.send("proj.gateway", args=(10 + i,)).id for i in range(40)]
    h.wait_until(lambda: set(held) <= {e.split(":")[0] for e in held_entries(h, h.queue, summary["group"])}
                 | kept_by_fetch(h), timeout=60, message="the 40 deliveries held")
    kept = kept_by_fetch(h) & set(held)
    assert len(kept) >= 30, len(kept)            # all but the few the worker parked before the fetch held them
    h.redis.delete(f"{h.prefix}:gateway_down")  # the outage ends: the next probe succeeds and closes the breaker
    h.wait_until(lambda: all(ran_ok(h, t) for t in held), timeout=90, message="every held delivery succeeds")
    assert [b["state"] for b in breakers(h)] == ["closed"]

    starts = sorted(next(r["at"] for r in h.deliveries(t) if r["ok"]) for t in kept)
    offsets = [at - starts[0] for at in starts]
    pace = (2.0, 20.0)   # proj.gateway's breaker.release_rate, breaker.max_release_rate
    # The first started after its release; the rest no sooner than the pace released them, less what the
    # first waited between its release and its start (well under a second, even on a loaded machine).
    first_wait = 0.5
    for k, offset in enumerate(offsets):
        earliest = B.release_offsets(k + 1, *pace)[-1]
        assert offset >= earliest - first_wait, f"delivery {k} ran {offset:.2f} s in, released at {earliest:.2f} s"
    per_second = [sum(1 for o in offsets if s <= o < s + 1) for s in range(3)]
    assert per_second[0] < per_second[1] < per_second[2], (per_second, [round(o, 2) for o in offsets])
