"""Failure groups: the fingerprint, and the index kept exact by the scripts that add and remove dead letters.

Every count is checked against a recount of the DLQ's letters themselves
(:func:`recount`), once on fakeredis and once on the test run's redis-server.
"""
from __future__ import annotations

import json
import time
from collections import Counter

import fakeredis
import pytest
import redis
from celery import Celery

from celery_dlq import RedeliveryPolicy
from celery_dlq import headers as H
from celery_dlq.fingerprint import group_id, normalise
from celery_dlq.message import Envelope, decode_raw
from celery_dlq.ops import Filter, Operator
from celery_dlq.storage.keys import QueueLists
from celery_dlq.storage.sharding import Shards
from celery_dlq.storage.shards import ShardedStore
from celery_dlq.worker.deadletter.dead_letterer import DeadLetterer
from celery_dlq.worker.deadletter.retention import Retention


@pytest.mark.parametrize("message, normalised", [
    ("'user_42'", "<str>"),
    ('missing "sku-1"', "missing <str>"),
    ("payment gateway down for order 42", "payment gateway down for order <n>"),
    ("timeout after 3.5s on 10.0.0.5:6379", "timeout after <n>s on <n>"),
    ("task d17a02ed-cec0-4b9c-bb9d-ef29dc5c511e failed", "task <id> failed"),
    ("object at 0x7f3a2b1c", "object at <hex>"),
    ("user_42 not found, #7", "user_<n> not found, #<n>"),
    ("took 1e-3 s, -5 left, 10,000 rows", "took <n> s, <n> left, <n> rows"),
    ("  two\n lines  ", "two lines"),
    (None, ""),
])
def test_normalise_leaves_out_what_varies(message, normalised):
    assert normalise(message) == normalised


def test_group_id_is_task_type_and_normalised_message():
    assert group_id("shop.charge", "KeyError", "'user_1'") == group_id("shop.charge", "KeyError", "'user_2'")
    assert group_id("shop.charge", "KeyError", "'a'") != group_id("shop.refund", "KeyError", "'a'")
    assert group_id("shop.charge", "KeyError", "'a'") != group_id("shop.charge", "ValueError", "'a'")
    assert group_id("shop.charge", "E", "order 1 failed") != group_id("shop.charge", "E", "order 1 lost")
    assert len(group_id("t", "E", "m")) == 16 and int(group_id("t", "E", "m"), 16) >= 0


@pytest.fixture(params=["fakeredis", "redis"])
def broker(request, redis_server):
    if request.param == "fakeredis":
        client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    else:
        client = redis.Redis.from_url(redis_server.url)
    yield client
    if request.param == "redis":
        client.flushdb()
    client.close()


@pytest.fixture
def world(broker, unique):
    app = Celery("groups", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.task_default_queue = f"o{unique}"
    store = ShardedStore(broker, Shards(f"g{unique}"), events_max_length=1000)
    letterer = DeadLetterer(app, broker, store, audit_ttl=60, redis_url="redis://store", broker=broker)
    return World(app, broker, letterer, Operator(app, broker=broker, client=broker), f"o{unique}")


class World:
    def __init__(self, app, broker, letterer, op, queue):
        self.app, self.broker, self.letterer, self.op, self.queue = app, broker, letterer, op, queue
        self.dlq = f"DLQ.{queue}"
        self.sent = 0

    def fail(self, task: str, exc_type: str, message: str, reason: str = "max_delivery_attempts",
             priority: int | None = None) -> str:
        self.sent += 1
        task_id = f"id-{self.sent}"
        envelope = Envelope(body=b"[[1], {}, {}]", content_type="application/json", content_encoding="utf-8",
                            headers={"task": task, "id": task_id},
                            properties={"correlation_id": task_id, **({"priority": priority} if priority else {})},
                            exchange="", routing_key=self.queue, queue=self.queue)
        self.letterer.dead_letter(envelope, delivery=3, policy=RedeliveryPolicy(), reason=reason,
                                  failure={"type": exc_type, "message": message, "traceback": ""}, worker="w@h")
        return task_id

    def letters(self) -> list[dict]:
        return [json.loads(raw) for key in self.op.list_keys(self.dlq) for raw in self.broker.lrange(key, 0, -1)]

    def counts(self) -> dict[str, int]:
        return {g.group_id: g.count for g in self.op.groups(self.dlq).per_dlq[self.dlq]}


def recount(world: World) -> Counter:
    """The groups counted from the letters themselves: what the index must say."""
    return Counter(letter["headers"][H.GROUP] for letter in world.letters() if H.GROUP in letter["headers"])


def assert_exact(world: World) -> None:
    report = world.op.groups(world.dlq)
    rows = report.per_dlq[world.dlq]
    assert {g.group_id: g.count for g in rows} == dict(recount(world))
    by_reason = Counter((l["headers"][H.GROUP], l["headers"][H.REASON]) for l in world.letters()
                        if H.GROUP in l["headers"])
    assert {(g.group_id, r): n for g in rows for r, n in g.reasons.items()} == dict(by_reason)
    fields = world.broker.hgetall(world.op.lists.groups(world.dlq))
    live = {g.group_id for g in rows}
    assert {name.split(b":")[1].decode() for name in fields} == live   # an emptied group leaves nothing behind


def test_dead_letters_are_counted_in_their_group_with_first_last_reasons_and_arrivals(world):
    before = time.time()
    for n in range(5):
        world.fail("shop.charge", "KeyError", f"'user_{n}'")
    for n in range(3):
        world.fail("shop.charge", "ValueError", f"card {n} declined", reason="non_retryable")
    world.fail("shop.ship", "ValueError", "card 9 declined", priority=9)   # another task, another sub-list
    world.fail("shop.ship", "ValueError", "card 10 declined", priority=9)
    assert_exact(world)
    rows = world.op.groups(world.dlq).per_dlq[world.dlq]
    assert [(g.task, g.exception_type, g.title, g.count) for g in rows] == [
        ("shop.charge", "KeyError", "<str>", 5),
        ("shop.charge", "ValueError", "card <n> declined", 3),
        ("shop.ship", "ValueError", "card <n> declined", 2)]
    charge = rows[0]
    assert charge.group_id == group_id("shop.charge", "KeyError", "'user_0'")
    assert charge.reasons == {"max_delivery_attempts": 5}
    assert rows[1].reasons == {"non_retryable": 3}
    assert before <= charge.first <= charge.last <= time.time()
    assert charge.sample_task_id == "id-5" and charge.sample_message == "'user_4'"
    assert len(charge.arrivals) == 24 and charge.arrivals[-1] == 5 and sum(charge.arrivals) == 5
    assert world.op.groups(world.dlq).ungrouped == {}
    merged = world.op.groups().merged()
    assert [(g.count, g.dlqs) for g in merged] == [(5, {world.dlq: 5}), (3, {world.dlq: 3}), (2, {world.dlq: 2})]


def test_replay_of_a_group_moves_exactly_its_letters_and_uncounts_them(world):
    charge = [world.fail("shop.charge", "KeyError", f"'user_{n}'") for n in range(4)]
    others = [world.fail("shop.charge", "ValueError", f"card {n} declined") for n in range(3)]
    gid = group_id("shop.charge", "KeyError", "'x'")
    out = world.op.queue(world.dlq).replay(Filter(group=gid), batch=3)   # two batches
    assert (out.matched, out.done, out.missing) == (4, 4, 0)
    replayed = [json.loads(raw)["headers"]["id"] for raw in world.broker.lrange(world.queue, 0, -1)]
    assert sorted(replayed) == sorted(charge)
    assert sorted(l["headers"]["id"] for l in world.letters()) == sorted(others)
    assert gid not in world.counts()
    assert_exact(world)
    again = world.op.queue(world.dlq).replay(Filter(group=gid))          # run again: nothing twice
    assert (again.matched, again.done) == (0, 0) and world.broker.llen(world.queue) == 4


def test_a_group_replay_decodes_only_the_letters_holding_its_id(world, monkeypatch):
    from celery_dlq.ops.letters import DeadLetter

    charge = [world.fail("shop.charge", "KeyError", f"'user_{n}'") for n in range(3)]
    for n in range(5):
        world.fail("shop.charge", "ValueError", f"card {n} declined")
    parse, parsed = DeadLetter.parse.__func__, []

    def counted(cls, queue, key, raw, accept):
        parsed.append(raw)
        return parse(cls, queue, key, raw, accept)

    monkeypatch.setattr(DeadLetter, "parse", classmethod(counted))
    gid = group_id("shop.charge", "KeyError", "'x'")
    out = world.op.queue(world.dlq).replay(Filter(group=gid), batch=3)
    assert out.done == 3 and len(parsed) == 3   # the five others were passed over undecoded
    assert sorted(json.loads(raw)["headers"]["id"] for raw in world.broker.lrange(world.queue, 0, -1)) == \
        sorted(charge)
    assert_exact(world)


def test_purge_by_filter_and_purge_all_keep_the_counts(world):
    for n in range(3):
        world.fail("shop.charge", "KeyError", f"'user_{n}'")
        world.fail("shop.ship", "ValueError", f"card {n} declined", priority=6)
    out = world.op.queue(world.dlq).purge(Filter(task_name="shop.ship", since=0), force=True)
    assert out.done == 3
    assert list(world.counts().values()) == [3]
    assert_exact(world)
    world.op.queue(world.dlq).purge(force=True)   # no filter: the lists and the index go together
    assert world.counts() == {} and not world.broker.exists(world.op.lists.groups(world.dlq))


def test_retention_trims_uncount_the_trimmed(world):
    for n in range(6):
        world.fail("shop.charge", "KeyError", f"'user_{n}'")
        world.fail("shop.ship", "ValueError", f"card {n} declined")
    retention = Retention(world.op.side)
    assert retention.trim(world.dlq, max_length=5) == 7
    assert sum(world.counts().values()) == 5
    assert_exact(world)


def test_a_letter_without_a_group_is_reported_apart_and_never_uncounted(world):
    world.fail("shop.charge", "KeyError", "'user_1'")
    stranger = world.letters()[0]
    stranger["headers"].pop(H.GROUP)
    stranger["headers"]["id"] = "raw-1"
    world.broker.lpush(world.dlq, json.dumps(stranger))   # as a raw dead letter of the fetch path is pushed
    report = world.op.groups(world.dlq)
    assert report.ungrouped == {world.dlq: 1}
    world.op.queue(world.dlq).purge(Filter(task_id="raw-1"), force=True)
    assert world.counts() == {group_id("shop.charge", "KeyError", "'x'"): 1}
    assert world.op.groups(world.dlq).ungrouped == {}
    assert_exact(world)


def test_the_letter_is_what_kombu_would_have_pushed(world):
    world.fail("shop.charge", "KeyError", "'user_1'", priority=5)
    [raw] = world.broker.lrange(QueueLists().key(world.dlq, 5), 0, -1)
    letter = decode_raw(raw)
    assert letter.properties["delivery_info"] == {"exchange": "", "routing_key": world.dlq}
    assert letter.properties["body_encoding"] == "base64" and letter.properties["priority"] == 5
    assert letter.properties["delivery_tag"] and letter.properties["delivery_mode"] == 2
    assert letter.body == b"[[1], {}, {}]" and letter.headers[H.REASON] == "max_delivery_attempts"


def cli(world: World, *args: str):
    from celery.bin.base import CLIContext
    from click.testing import CliRunner

    from celery_dlq import cli as dlq_cli
    from celery_dlq.cli import base as cli_base

    original, cli_base.make_operator = cli_base.make_operator, lambda _app: world.op
    try:
        return CliRunner().invoke(dlq_cli.dlq, list(args), obj=CLIContext(app=world.app, no_color=True, workdir=None))
    finally:
        cli_base.make_operator = original


def test_cli_groups_lists_them_and_replay_group_takes_one(world):
    for n in range(3):
        world.fail("shop.charge", "KeyError", f"'user_{n}'")
    world.fail("shop.ship", "ValueError", "card 9 declined")
    result = cli(world, "groups", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [(r["task_name"], r["exception_type"], r["title"], r["count"], r["dlqs"]) for r in rows] == [
        ("shop.charge", "KeyError", "<str>", 3, {world.dlq: 3}), ("shop.ship", "ValueError", "card <n> declined", 1,
                                                                   {world.dlq: 1})]
    one = json.loads(cli(world, "groups", world.dlq, "--json").output)
    assert [(r["group"], r["dlq"], r["count"]) for r in one] == [(r["group"], world.dlq, r["count"]) for r in rows]
    table = cli(world, "groups")
    assert table.exit_code == 0 and "4 dead letters in 2 failure groups" in table.output
    assert rows[0]["group"] in table.output and "KeyError: <str>" in table.output
    bad = cli(world, "replay", world.dlq, "--group", "nope")
    assert bad.exit_code == 2 and "16 hex digits" in bad.output
    done = cli(world, "replay", world.dlq, "--group", rows[0]["group"])
    assert done.exit_code == 0 and "Replayed 3 of 3" in done.output, done.output
    assert world.broker.llen(world.queue) == 3 and world.counts() == {rows[1]["group"]: 1}
    assert_exact(world)


def test_a_letter_carries_its_payload_hash_and_its_replay_event_reuses_it(world):
    from celery_dlq.message import payload_hash
    from celery_dlq.storage.events import Event, _as_envelope, event_of

    world.fail("shop.charge", "KeyError", "'user_1'")
    (letter,) = world.op.queue(world.dlq).entries()
    expected = payload_hash("shop.charge", b"[[1], {}, {}]", "application/json", "utf-8")
    assert letter.header(H.PAYLOAD_HASH) == expected
    assert event_of("replayed", _as_envelope(letter), dlq=world.dlq).payload_hash == expected
    forged = json.loads(letter.raw)
    forged["headers"][H.PAYLOAD_HASH] = "not a hash"          # not 32 characters: computed from the body
    assert event_of("replayed", _as_envelope(json.dumps(forged)), dlq=world.dlq).payload_hash == expected
    world.op.queue(world.dlq).replay()
    replayed = [Event.from_fields(fields) for _, fields in world.op.archive.read() if fields[b"type"] == b"replayed"]
    assert [event.payload_hash for event in replayed] == [expected]
