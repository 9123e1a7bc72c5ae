"""The operator API (manage.py), retention and the CLI, on fakeredis with real kombu messages.

Dead letters are made the way a worker makes them: a real Celery task
message (sent through kombu's in-memory transport) is dead-lettered by the
real DeadLetterer, and kombu's JSON for it is pushed onto a fakeredis list,
exactly as kombu's Redis transport stores it.
"""
from __future__ import annotations

import base64
import json
import logging
import uuid

import pytest
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner

from celery_dlq import cli
from celery_dlq import headers as H
from celery_dlq.cli import base as cli_base
from celery_dlq.cli.options import parse_time
from celery_dlq.errors import ConfigurationError
from celery_dlq.message import CARRIED_PROPERTIES, Envelope
from celery_dlq.ops import (
    BrokerNotSupported,
    DeadLetter,
    DeadLetterQueue,
    Filter,
    ForceRequired,
    Operator,
    TaskIds,
    UnknownQueue,
)
from celery_dlq.policy import RedeliveryPolicy
from celery_dlq.storage.archive import EventLog
from celery_dlq.storage.factory import redis_side
from celery_dlq.storage.keys import Keys, QueueLists, Stat
from celery_dlq.storage.sharding import Shards
from celery_dlq.storage.shards import ShardedStore
from celery_dlq.worker.deadletter.dead_letterer import DeadLetterer
from celery_dlq.worker.deadletter.retention import Retention

T0 = 1_700_000_000.0
SOURCE = Celery("source", broker="memory://", set_as_current=False)
UNPICKLED: list[str] = []


def side_effect(note: str) -> str:
    """What unpickling the evil argument calls: proof that something was unpickled."""
    UNPICKLED.append(note)
    return note


class Evil:
    def __reduce__(self):
        return side_effect, ("unpickled!",)


def kombu_message(task: str, args: tuple, kwargs: dict | None, serializer: str = "json",
                  priority: int | None = None) -> dict:
    """A real Celery message as kombu's virtual transport stores it (what Redis would hold)."""
    stage = f"stage-{uuid.uuid4().hex}"
    SOURCE.send_task(task, args=args, kwargs=kwargs or {}, queue=stage, serializer=serializer, priority=priority)
    with SOURCE.connection_for_write() as conn:
        return conn.default_channel._get(stage)


def dead_letter(fake, task="shop.charge", args=(1,), kwargs=None, queue="orders", reason="max_delivery_attempts",
                exc: BaseException = ValueError("card declined"), delivery=3, serializer="json",
                priority=None, at: float | None = None, dlq: str | None = None, prefix: str = "") -> DeadLetter:
    """Dead-letter a real message with the real DeadLetterer; push kombu's JSON onto fakeredis."""
    msg = kombu_message(task, args, kwargs, serializer, priority)
    props = msg["properties"]
    envelope = Envelope(body=base64.b64decode(msg["body"]), content_type=msg["content-type"],
                        content_encoding=msg["content-encoding"], headers=msg["headers"],
                        properties={k: props[k] for k in CARRIED_PROPERTIES if props.get(k) is not None},
                        exchange="", routing_key=queue, queue=queue)
    dlq = dlq or f"DLQ.{queue}"
    policy = RedeliveryPolicy(dead_letter=dlq)
    DeadLetterer(SOURCE, fake, ShardedStore(fake, Shards("src"), events_max_length=100_000), audit_ttl=60,
                 redis_url="redis://").dead_letter(
        envelope, delivery=delivery, policy=policy, reason=reason, failure=H.describe_exception(exc), worker="w1@h")
    with SOURCE.connection_for_write() as conn:
        stored = conn.default_channel._get(dlq)
    if at is not None:
        stored["headers"][H.DEAD_LETTERED_AT] = at
    raw = json.dumps(stored).encode()
    key = QueueLists(prefix).key(dlq, priority or 0)
    fake.lpush(key, raw)
    return DeadLetter(dlq, key, raw, stored)


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def op(app, fake):
    return Operator(app, broker=fake, client=fake, clock=FakeClock())


def stored(fake, key: str) -> list[dict]:
    """A list's messages, oldest first."""
    return [json.loads(raw) for raw in reversed(fake.lrange(key, 0, -1))]


def twin_of(fake, letter: DeadLetter, at: float) -> None:
    """Push another dead letter of ``letter``'s task id, newer (dead-lettered at ``at``)."""
    twin = dict(letter.message, headers=dict(letter.headers, **{H.DEAD_LETTERED_AT: at}))
    fake.lpush(letter.key, json.dumps(twin))


class CountingRedis:
    """The fakeredis client, noting the key of every LRANGE: how often each DLQ list is read."""

    def __init__(self, client) -> None:
        self.client, self.lranges = client, []

    def lrange(self, key, start, end):
        self.lranges.append(key.decode() if isinstance(key, bytes) else key)
        return self.client.lrange(key, start, end)

    def __getattr__(self, name):
        return getattr(self.client, name)


def read_once(lranges: list[str], dlq: str, prefix: str = "") -> bool:
    """Whether every list of ``dlq`` was read exactly once (one pass; each page under PAGE)."""
    return sorted(lranges) == sorted(QueueLists(prefix).keys(dlq))


# -- kombu's layout -------------------------------------------------------------

def test_queue_lists_follow_kombus_priority_steps_and_global_keyprefix():
    lists = QueueLists("tenant:")
    assert lists.keys("DLQ.a") == ["tenant:DLQ.a", "tenant:DLQ.a\x06\x163", "tenant:DLQ.a\x06\x166",
                                   "tenant:DLQ.a\x06\x169"]
    from kombu.transport.redis import Channel
    for priority in range(10):  # same step as kombu's own _q_for_pri
        expected = Channel._q_for_pri(Channel.__new__(Channel), "q", priority)
        assert QueueLists().key("q", priority) == expected
    assert QueueLists().key("q", "junk") == "q"
    assert lists.queue_of("tenant:DLQ.a\x06\x166") == "DLQ.a"


# -- enumerating ------------------------------------------------------------------

def test_queues_count_every_priority_list_and_parked_retries(op, fake, app):
    dead_letter(fake, queue="orders")
    dead_letter(fake, queue="orders", priority=9)
    dead_letter(fake, queue="mail")
    op.sharded.home.store.park("t1:2", Envelope(b"[]", None, None, {}, {}, "", "orders", "orders").dumps(), "orders", T0)
    op.sharded.home.store.park("t2:2", Envelope(b"[]", None, None, {}, {}, "", "billing", "billing").dumps(), "billing", T0)
    rows = {row.name: row.as_dict() for row in op.queues()}
    assert rows["DLQ.orders"] == {"name": "DLQ.orders", "queue": "orders", "dead_letters": 2, "parked": 1}
    assert rows["DLQ.mail"]["dead_letters"] == 1
    assert rows["DLQ.billing"] == {"name": "DLQ.billing", "queue": "billing", "dead_letters": 0, "parked": 1}
    assert op.parked.sharded.client.llen("DLQ.orders") == 1  # LLEN alone would say 1


def test_queues_find_configured_shapes_names_and_honour_global_keyprefix(fake):
    app = Celery("ops", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.broker_transport_options = {"global_keyprefix": "t1:"}
    app.conf.dlq_queue_policies = {"payments.#": {"dead_letter_queue_prefix": "", "dead_letter_queue_suffix": ".dead"},
                                   "audit": {"dead_letter": "graveyard"}}
    op = Operator(app, broker=fake, client=fake)
    dead_letter(fake, queue="payments.eu", dlq="payments.eu.dead", prefix="t1:")
    dead_letter(fake, queue="audit", dlq="graveyard", prefix="t1:")
    dead_letter(fake, queue="orders", prefix="t1:")
    fake.lpush("DLQ.not-ours", b"x")  # another app's key space
    rows = {row.name: row for row in op.queues()}
    assert rows["payments.eu.dead"].dead_letters == 1 and rows["payments.eu.dead"].queue == "payments.eu"
    assert rows["graveyard"].dead_letters == 1
    assert rows["DLQ.orders"].dead_letters == 1
    assert "DLQ.not-ours" not in rows
    assert op.queue("payments.eu").name == "payments.eu.dead"  # by the queue it serves
    assert op.queue("orders").replay().done == 1
    assert fake.llen("t1:orders") == 1 and op.depth("DLQ.orders") == 0
    with pytest.raises(ValueError, match="into itself"):
        DeadLetterQueue(op, "DLQ.orders").replay(to="DLQ.orders")


def test_unknown_queue_and_non_redis_broker_fail_clearly(op, fake, monkeypatch):
    with pytest.raises(UnknownQueue, match="'nope'"):
        op.queue("nope")
    fake.lpush("mail", b"a live task message")  # a live queue is never taken for a DLQ
    with pytest.raises(UnknownQueue, match="'mail'"):
        op.queue("mail")
    dead_letter(fake, queue="mail")
    monkeypatch.setattr(fake, "scan_iter", None)  # an existing DLQ is found without a SCAN
    assert op.queue("mail").name == op.queue("DLQ.mail").name == "DLQ.mail"
    assert op.queue("orders").name == "DLQ.orders"  # the app's default queue: configured, even empty
    app = Celery("amqp", broker="amqp://guest:secret@rabbit//", set_as_current=False)
    app.conf.dlq_redis_url = "redis://127.0.0.1:1/0"
    amqp_op = Operator(app, client=fake)
    with pytest.raises(BrokerNotSupported, match=r"Redis broker.*amqp://guest:\*\*@rabbit"):
        amqp_op.queues()
    assert list(amqp_op.parked.entries()) == []  # parked retries still work: they are in dlq_redis_url


# -- reading ----------------------------------------------------------------------

def test_entries_oldest_first_in_pages_with_every_field(op, fake):
    ids = [dead_letter(fake, args=(i,), kwargs={"n": i}).task_id for i in range(7)]
    dlq = op.queue("orders")
    letters = list(dlq.entries(batch=3))
    assert [letter.task_id for letter in letters] == ids
    d = letters[0].as_dict()
    assert d["task_id"] == ids[0] and d["task_name"] == "shop.charge"
    assert d["original_queue"] == "orders" and d["dead_letter_queue"] == "DLQ.orders"
    assert d["reason"] == "max_delivery_attempts" and d["delivery_count"] == 3
    assert d["exception_type"] == "ValueError" and d["exception_message"] == "card declined"
    assert d["decoded"] and d["args"] == [0] and d["kwargs"] == {"n": 0} and d["body"] is None
    assert d["size"] == len(letters[0].raw)
    assert set(d["headers"]) >= {H.REASON, H.TRACEBACK, H.WORKER, H.DEAD_LETTERED_AT, H.FIRST_FAILURE_AT}
    assert all(name.startswith("x-dlq-") for name in d["headers"])
    assert [letter.task_id for letter in dlq.entries(limit=2)] == ids[:2]
    assert dlq.get(ids[4]).arguments() == ([4], {"n": 4})
    assert dlq.get("missing") is None


def test_filters(op, fake):
    a = dead_letter(fake, task="shop.charge", exc=ValueError("card declined"), at=T0 - 100)
    b = dead_letter(fake, task="shop.refund.eu", reason="non_retryable", exc=KeyError("no order 7"), at=T0 - 50)
    c = dead_letter(fake, task="mail.send", reason="worker_lost", exc=ConnectionError("SMTP down"), at=T0)
    dlq = op.queue("orders")

    def ids(**kw):
        return [letter.task_id for letter in dlq.entries(Filter(**kw))]

    assert ids(task_name="shop.*") == [a.task_id]
    assert ids(task_name="shop.#") == [a.task_id, b.task_id]
    assert ids(reason="worker_lost") == [c.task_id]
    assert ids(exception_type="KeyError") == [b.task_id]
    assert ids(exception_type="builtins.KeyError") == []
    assert ids(original_queue="orders") == [a.task_id, b.task_id, c.task_id]
    assert ids(original_queue="other") == []
    assert ids(since=T0 - 60) == [b.task_id, c.task_id]
    assert ids(since=T0 - 60, until=T0) == [b.task_id]
    assert ids(text="smtp") == [c.task_id]
    assert ids(task_id=b.task_id) == [b.task_id]
    with pytest.raises(ConfigurationError):
        Filter(task_name="shop.**")


def test_task_ids_select_in_one_pass_the_oldest_of_each_or_every_one(op, fake):
    a = dead_letter(fake, at=T0)
    twin_of(fake, a, T0 + 5)                           # a's task id again, newer
    b = dead_letter(fake, task="mail.send", at=T0 + 10)
    dlq = op.queue("orders")
    wanted = TaskIds([b.task_id, a.task_id, "nope", b.task_id])
    assert len(wanted) == 3
    found = list(dlq.entries(wanted))
    assert [(x.task_id, x.dead_lettered_at) for x in found] == [(a.task_id, T0), (b.task_id, T0 + 10)]
    assert wanted.missing_from(found) == ["nope"]      # oldest first, each id once, in the DLQ's order
    assert list(dlq.entries(wanted)) == found          # a value: a second pass selects the same again
    every = TaskIds([a.task_id, b.task_id], Filter(task_name="shop.*"), every=True)
    assert [x.dead_lettered_at for x in dlq.entries(every)] == [T0, T0 + 5]
    assert every.missing_from(dlq.entries(every)) == [b.task_id]   # rejected by where=
    assert len(list(dlq.entries(every))) == 2
    limited = TaskIds([a.task_id, b.task_id])
    assert [x.task_id for x in dlq.entries(limited, limit=1)] == [a.task_id]
    assert TaskIds([a.task_id]) == TaskIds([a.task_id, a.task_id]) and hash(TaskIds([a.task_id]))


def test_a_replay_and_a_purge_by_id_report_the_ids_they_did_not_find(op, fake):
    a = dead_letter(fake, at=T0)
    b = dead_letter(fake, at=T0 + 1)
    dlq = op.queue("orders")
    out = dlq.replay(TaskIds([b.task_id, "gone", a.task_id]), limit=1)
    assert (out.done, out.not_found) == (1, [b.task_id, "gone"])   # b was past the limit: never offered
    purged = dlq.purge(TaskIds(["gone", b.task_id], every=True), force=True)
    assert (purged.done, purged.not_found) == (1, ["gone"])


def test_pickle_is_listed_raw_never_unpickled_unless_accepted(op, fake, app):
    UNPICKLED.clear()
    letter = dead_letter(fake, args=(Evil(),), serializer="pickle")
    (listed,) = op.queue("orders").entries()
    d = listed.as_dict()
    assert d["content_type"] == "application/x-python-serialize"
    assert d["decoded"] is False and d["args"] is None and d["kwargs"] is None
    assert base64.b64decode(d["body"]) == letter.body and d["body"]
    assert d["task_id"] == letter.task_id and d["reason"] == "max_delivery_attempts"
    assert UNPICKLED == []
    # The same message with pickle accepted is decoded: the test above would have noticed.
    app.conf.accept_content = ["json", "pickle"]
    trusting = Operator(app, broker=fake, client=fake)
    assert next(trusting.queue("orders").entries()).arguments() == (["unpickled!"], {})
    assert UNPICKLED == ["unpickled!"]


def test_a_stored_value_that_is_not_kombu_json_is_listed_and_can_be_purged(op, fake):
    dead_letter(fake)
    fake.rpush("DLQ.orders", b"\x00garbage")  # oldest
    garbage, real = list(op.queue("orders").entries())
    assert garbage.task_id is None and garbage.as_dict()["size"] == 8
    out = op.queue("orders").replay()
    assert out.done == 1 and len(out.failed) == 1 and "not a kombu message" in out.failed[0]
    assert op.queue("orders").purge(force=True).done == 1
    assert fake.llen("DLQ.orders") == 0


# -- replay ------------------------------------------------------------------------

def test_replay_moves_back_with_the_count_reset_and_history_kept(op, fake):
    letter = dead_letter(fake, priority=6)
    task_id = letter.task_id
    keys = op.keys
    fake.set(keys.delivery_count(task_id), 3)
    fake.set(keys.delivery_count(f"{task_id}:{letter.properties['delivery_tag']}"), 3)
    fake.set(keys.audit(task_id, 3), b"done")
    out = op.queue("DLQ.orders").replay()
    assert (out.matched, out.done, out.missing, out.failed) == (1, 1, 0, [])
    assert out.targets == {"orders": 1}
    assert op.depth("DLQ.orders") == 0
    (msg,) = stored(fake, "orders\x06\x166")  # kombu's priority list for priority 6
    headers = msg["headers"]
    assert H.DELIVERY_COUNT not in headers and headers["retries"] == 0
    assert headers[H.REPLAY_COUNT] == 1 and headers[H.REPLAYED_AT] == T0
    assert headers[H.REASON] == "max_delivery_attempts" and headers[H.ORIGINAL_QUEUE] == "orders"
    assert msg["properties"]["delivery_info"] == {"exchange": "", "routing_key": "orders"}
    assert msg["properties"]["delivery_tag"] != letter.properties["delivery_tag"]
    assert msg["body"] == letter.message["body"] and headers["id"] == task_id
    assert not fake.exists(keys.delivery_count(task_id), keys.audit(task_id, 3),
                           keys.delivery_count(f"{task_id}:{letter.properties['delivery_tag']}"))
    assert fake.hget(keys.stats, "replayed") == b"1"


def test_replay_again_counts_replays_and_to_another_queue(op, fake):
    dead_letter(fake)
    op.queue("orders").replay()
    raw = fake.rpop("orders")
    msg = json.loads(raw)
    msg["headers"][H.DELIVERY_COUNT] = 2  # it failed again and was dead-lettered again
    fake.lpush("DLQ.orders", json.dumps(msg))
    out = op.queue("orders").replay(to="orders.debug")
    assert out.targets == {"orders.debug": 1}
    (again,) = stored(fake, "orders.debug")
    assert again["headers"][H.REPLAY_COUNT] == 2
    assert again["properties"]["delivery_info"] == {"exchange": "", "routing_key": "orders.debug"}


def test_replay_selected_limited_dry_run(op, fake):
    letters = [dead_letter(fake, task="shop.charge" if i % 2 else "mail.send", args=(i,)) for i in range(6)]
    dlq = op.queue("orders")
    dry = dlq.replay(Filter(task_name="shop.*"), dry_run=True)
    assert (dry.matched, dry.done, dry.targets) == (3, 0, {"orders": 3})
    assert op.depth("DLQ.orders") == 6 and fake.llen("orders") == 0
    out = dlq.replay(Filter(task_name="shop.*"), limit=2, batch=2)
    assert out.done == 2
    assert [m["headers"]["id"] for m in stored(fake, "orders")] == [letters[1].task_id, letters[3].task_id]
    assert [letter.task_id for letter in dlq.entries()] == [x.task_id for x in letters if x is not letters[1]
                                                            and x is not letters[3]]


def test_replay_interrupted_then_run_again_delivers_each_exactly_once(op, fake):
    ids = [dead_letter(fake, args=(i,)).task_id for i in range(25)]
    dlq = op.queue("orders")
    calls = []

    def crash_on_third_page(n):
        calls.append(n)
        if len(calls) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        dlq.replay(batch=4, progress=crash_on_third_page)
    assert fake.llen("orders") == 12 and op.depth("DLQ.orders") == 13
    assert dlq.replay(batch=4).done == 13
    moved = [m["headers"]["id"] for m in stored(fake, "orders")]
    assert moved == ids  # each exactly once, oldest first


def test_an_unthrottled_replay_overlapping_its_batches_moves_each_selected_letter_once(op, fake):
    """Each batch is written while the next page is read and planned: across priority lists, with a filter
    that leaves letters in every page, and letters arriving meanwhile, each selected letter moves once."""
    letters = [dead_letter(fake, task="shop.charge" if i % 3 else "mail.send", args=(i,), priority=9 if i > 13 else 0)
               for i in range(24)]
    dlq = op.queue("orders")
    original, seen = dlq._run, []

    def arrivals_meanwhile(batch):   # pushed on the new end: they shift no page's offset
        seen.append(len(batch.letters))
        dead_letter(fake, task="mail.send", args=(100 + len(seen),), priority=9)
        return original(batch)

    dlq._run = arrivals_meanwhile
    progress: list[int] = []
    out = dlq.replay(Filter(task_name="shop.*"), batch=4, progress=progress.append)
    charges = [x.task_id for x in letters if x.task_name == "shop.charge"]
    assert (out.matched, out.done, out.missing, out.failed) == (len(charges), len(charges), 0, [])
    moved = [m["headers"]["id"] for key in ("orders", "orders\x06\x169") for m in stored(fake, key)]
    assert moved == charges   # oldest first in each list, each once
    assert sum(progress) == len(charges) and len(seen) > 2
    assert [x.task_name for x in dlq.entries()] == ["mail.send"] * (24 - len(charges) + len(seen))
    assert out.targets == {"orders": len(charges)}


def test_a_dead_letter_removed_meanwhile_is_not_pushed(op, fake):
    dead_letter(fake)
    dlq = op.queue("orders")
    original = dlq._run

    def someone_else_first(batch):   # between the read and the move: another replay or a purge
        letter = batch.letters[0]
        fake.lrem(letter.key, -1, letter.raw)
        return original(batch)

    dlq._run = someone_else_first
    out = dlq.replay()
    assert (out.matched, out.done, out.missing) == (1, 0, 1)
    assert fake.llen("orders") == 0


def test_replay_rate_limit_paces_with_the_injected_clock(op, fake):
    for i in range(4):
        dead_letter(fake, args=(i,))
    dlq = op.queue("orders")
    now = [100.0]
    sleeps = []
    dlq.monotonic = lambda: now[0]
    dlq.sleep = lambda s: (sleeps.append(round(s, 3)), now.__setitem__(0, now[0] + s))
    assert dlq.replay(rate=2).done == 4
    assert sleeps == [0.0, 0.5, 0.5, 0.5]
    with pytest.raises(ValueError):
        dlq.replay(rate=0)


def test_replay_without_an_original_queue_fails_that_message_only(op, fake):
    letter = dead_letter(fake)
    msg = dict(letter.message, headers={k: v for k, v in letter.headers.items() if k != H.ORIGINAL_QUEUE})
    fake.lset("DLQ.orders", 0, json.dumps(msg))
    dead_letter(fake)
    out = op.queue("orders").replay()
    assert out.done == 1 and len(out.failed) == 1 and "use to=" in out.failed[0]
    assert op.queue("orders").replay(to="orders").done == 1


def test_a_raw_invalid_element_is_listed_shown_as_bytes_and_never_replayed(op, fake):
    from celery_dlq.element import raw_dead_letter

    fake.lpush("DLQ.orders", raw_dead_letter(b"\x00not json", queue="orders", dlq="DLQ.orders", error="not JSON",
                                             worker="w", now=T0, tag="t1"))
    dead_letter(fake)
    (raw, message) = list(op.queue("orders").entries())
    assert raw.header(H.REASON) == "invalid_message" and raw.body == b"\x00not json"
    assert raw.as_dict()["decoded"] is False
    out = op.queue("orders").replay()
    assert out.done == 1 and len(out.failed) == 1 and "nothing to replay" in out.failed[0]
    assert [letter.body for letter in op.queue("orders").entries()] == [b"\x00not json"]   # still there, to purge


def test_a_quarantine_is_listed_read_raw_and_purged(op, fake, app):
    fake.lpush(op.keys.quarantine("orders"), b"\x00first", b"[1, 2]")
    rows = {info.name: info for info in op.queues()}
    assert rows["quarantine:orders"].dead_letters == 2 and rows["quarantine:orders"].queue == "orders"
    quarantine = op.queue("quarantine:orders")
    assert [letter.body for letter in quarantine.entries()] == [b"\x00first", b"[1, 2]"]   # oldest first, raw
    assert all(letter.as_dict()["body"] for letter in quarantine.entries())
    listed = run(app, fake, "list", "quarantine:orders", "--json", ops=op)
    assert [base64.b64decode(row["body"]) for row in json.loads(listed.output)] == [b"\x00first", b"[1, 2]"]
    assert quarantine.purge(force=True).done == 2 and fake.llen(op.keys.quarantine("orders")) == 0
    with pytest.raises(UnknownQueue):
        op.queue("quarantine:orders")


# -- purge -------------------------------------------------------------------------

def test_purge_needs_force_then_deletes_one_filtered_or_all(op, fake):
    a = dead_letter(fake, reason="worker_lost")
    dead_letter(fake)
    dead_letter(fake, priority=3)
    dlq = op.queue("orders")
    with pytest.raises(ForceRequired):
        dlq.purge()
    with pytest.raises(ForceRequired):
        dlq.purge(Filter(task_id=a.task_id))
    assert dlq.depth() == 3
    assert dlq.purge(Filter(reason="worker_lost"), force=True).done == 1
    assert dlq.get(a.task_id) is None
    out = dlq.purge(force=True)
    assert out.done == 2 and dlq.depth() == 0
    assert fake.hget(op.keys.stats, "purged") == b"3"


# -- parked retries ----------------------------------------------------------------

def park(op, task_id: str, due: float, queue: str = "orders") -> None:
    headers = {"id": task_id, "task": "shop.charge", H.DELIVERY_COUNT: 2, H.LAST_EXCEPTION: "ValueError: boom"}
    envelope = Envelope(b"[[], {}, {}]", "application/json", "utf-8", headers, {}, "", queue, queue)
    op.sharded.home.store.park(f"{task_id}:2", envelope.dumps(), queue, due)


def test_parked_list_redeliver_and_delete(op):
    park(op, "a", T0 + 60)
    park(op, "b", T0 + 30, queue="mail")
    rows = list(op.parked.entries())
    assert [(r.entry_id, r.task_id, r.task_name, r.queue, r.due, r.delivery_count, r.last_exception) for r in rows] \
        == [("b:2", "b", "shop.charge", "mail", T0 + 30, 2, "ValueError: boom"),
            ("a:2", "a", "shop.charge", "orders", T0 + 60, 2, "ValueError: boom")]
    assert [r.entry_id for r in op.parked.entries(queue="orders")] == ["a:2"]
    assert op.parked.redeliver_now("a") == 1  # by task id
    assert op.parked.sharded.get("a:2").due == T0
    assert op.parked.redeliver_now("nope") == 0
    assert op.parked.redeliver_now() == 1
    with pytest.raises(ForceRequired):
        op.parked.delete("b:2")
    assert op.parked.delete("b:2", force=True) == 1
    assert [r.entry_id for r in op.parked.entries()] == ["a:2"]


def test_stats(op, fake):
    dead_letter(fake)
    park(op, "a", T0)
    fake.hincrby(op.keys.stats, "dead_lettered", 5)
    assert op.stats() == {"dead_letters_now": 1, "dead_lettered": 5, "parked": 1, "parked_now": 1}


# -- retention ---------------------------------------------------------------------

def trimmer(app, fake, broker=None):
    """Retention on ``fake`` (the store and the broker), keys prefixed ``r``, archive on."""
    store = ShardedStore(fake, Shards("r"), events_max_length=100_000)
    return Retention(redis_side(app, client=fake, broker=fake if broker is None else broker, sharded=store))


def test_trim_by_length_removes_oldest_across_priority_lists(app, fake, caplog):
    letters = [dead_letter(fake, args=(i,), at=T0 + i, priority=9 if i % 2 else 0) for i in range(6)]
    retention = trimmer(app, fake)
    with caplog.at_level(logging.WARNING, logger="celery_dlq.worker.deadletter.retention"):
        assert retention.trim("DLQ.orders", max_length=2) == 4
    left = [json.loads(r)["headers"]["id"] for key in QueueLists().keys("DLQ.orders") for r in fake.lrange(key, 0, -1)]
    assert sorted(left) == sorted([letters[4].task_id, letters[5].task_id])
    assert fake.hget(Keys("r").stats, Stat.TRIMMED) == b"4"
    assert caplog.text.count("trimmed dead letter shop.charge") == 4
    assert "dead_letter_max_length" in caplog.text


def test_trim_by_age_and_policy_hook(app, fake):
    old = [dead_letter(fake, at=T0 - 7200 + i) for i in range(3)]
    new = dead_letter(fake, at=T0 - 10)
    retention = trimmer(app, fake)
    assert retention.after_dead_letter("DLQ.orders", RedeliveryPolicy()) == 0  # no limits: untouched
    assert retention.trim("DLQ.orders", ttl=3600, now=T0) == 3
    assert [json.loads(r)["headers"]["id"] for r in fake.lrange("DLQ.orders", 0, -1)] == [new.task_id]
    assert all(not fake.lpos("DLQ.orders", letter.raw) for letter in old)


def test_trim_many_pages_and_stops_at_the_cap(app, fake, monkeypatch):
    import celery_dlq.worker.deadletter.retention as retention_module
    for i in range(30):
        dead_letter(fake, args=(i,), at=T0 + i)
    monkeypatch.setattr(retention_module, "PAGE", 4)
    monkeypatch.setattr(retention_module, "MAX_PER_CALL", 20)
    retention = trimmer(app, fake)
    assert retention.trim("DLQ.orders", max_length=5) == 20
    assert retention.trim("DLQ.orders", max_length=5) == 5
    ages = [json.loads(r)["headers"][H.DEAD_LETTERED_AT] for r in fake.lrange("DLQ.orders", 0, -1)]
    assert ages == [T0 + i for i in range(29, 24, -1)]


def test_trim_failure_is_logged_not_raised(app, fake, caplog):
    class Broken:
        def pipeline(self, **kw):
            raise ConnectionError("redis went away")

    retention = trimmer(app, fake, broker=Broken())
    with caplog.at_level(logging.ERROR):
        assert retention.after_dead_letter("DLQ.orders", RedeliveryPolicy(dead_letter_max_length=1)) == 0
    assert "could not trim DLQ.orders" in caplog.text


# -- CLI (in-process; tests/integration runs the real `celery` program) -------------

def run(app, fake, *args, ops=None):
    ops = ops or Operator(app, broker=fake, client=fake)
    runner = CliRunner()
    original = cli_base.make_operator
    cli_base.make_operator = lambda _app: ops
    try:
        return runner.invoke(cli.dlq, list(args), obj=CLIContext(app=app, no_color=True, workdir=None))
    finally:
        cli_base.make_operator = original


def test_cli_json_shapes_and_exit_codes(app, fake):
    letter = dead_letter(fake)
    result = run(app, fake, "queues", "--json")
    assert result.exit_code == 0, result.output
    (row,) = [r for r in json.loads(result.output) if r["name"] == "DLQ.orders"]
    assert row["dead_letters"] == 1 and row["parked"] == 0
    result = run(app, fake, "list", "orders", "--json")
    (entry,) = json.loads(result.output)
    for name in ("task_id", "task_name", "original_queue", "reason", "delivery_count", "exception_type",
                 "exception_message", "dead_lettered_at"):
        assert name in entry
    assert json.loads(run(app, fake, "show", letter.task_id, "--json").output)[0]["task_id"] == letter.task_id
    assert run(app, fake, "show", "nope").exit_code == 1
    assert run(app, fake, "list", "nope").exit_code == 2
    assert "unknown dead-letter queue 'nope'" in run(app, fake, "list", "nope").output
    assert run(app, fake, "replay", "orders").exit_code == 2           # says nothing about which
    assert run(app, fake, "list", "orders", "--since", "yesterday").exit_code == 2
    missed = run(app, fake, "list", "orders", "--grep", "no such text", "--json")
    assert missed.exit_code == 1 and missed.output.startswith("[]") and "nothing matched in DLQ.orders" in missed.output
    assert run(app, fake, "list", "orders", "--grep", "card declined").exit_code == 0
    assert run(app, fake, "replay", "orders", "--task", "x.*", "--all").exit_code == 1  # nothing matched
    purge = run(app, fake, "purge", "orders", "--all")                 # no terminal, no --force
    assert purge.exit_code == 2 and "refusing" in purge.output and fake.llen("DLQ.orders") == 1
    result = run(app, fake, "replay", "orders", letter.task_id)
    assert result.exit_code == 0 and "Replayed 1 of 1 matching dead letter from DLQ.orders: 1 to orders." \
        in result.output
    assert json.loads(run(app, fake, "stats", "--json").output)[0].keys() == {"name", "value"}


def test_cli_partial_failure_exits_1(app, fake):
    letter = dead_letter(fake)
    dead_letter(fake)
    msg = dict(letter.message, headers={k: v for k, v in letter.headers.items() if k != H.ORIGINAL_QUEUE})
    fake.lset("DLQ.orders", -1, json.dumps(msg))
    result = run(app, fake, "replay", "orders", "--all")
    assert result.exit_code == 1
    assert "Replayed 1 of 2" in result.output and "1 dead letter could not be handled" in result.output


def test_cli_replay_of_ids_is_one_paced_pass(app, fake):
    a, x, b = dead_letter(fake, args=(1,)), dead_letter(fake, args=(2,)), dead_letter(fake, args=(3,))
    c = dead_letter(fake, args=(4,), priority=9)
    broker = CountingRedis(fake)
    ops = Operator(app, broker=broker, client=fake, clock=FakeClock())
    now, sleeps = [100.0], []
    queue = ops.queue

    def paced_queue(name):  # the injected clock, as in test_replay_rate_limit_paces_with_the_injected_clock
        dlq = queue(name)
        dlq.monotonic = lambda: now[0]
        dlq.sleep = lambda s: (sleeps.append(round(s, 3)), now.__setitem__(0, now[0] + s))
        return dlq

    ops.queue = paced_queue
    result = run(app, fake, "replay", "orders", c.task_id, b.task_id, a.task_id, "--rate", "2", ops=ops)
    assert result.exit_code == 0, result.output
    assert result.output == "Replayed 3 of 3 matching dead letters from DLQ.orders: 3 to orders.\n"
    assert sleeps == [0.0, 0.5, 0.5]                   # 3 messages at 2/s: paced across the ids
    assert read_once(broker.lranges, "DLQ.orders")     # one pass, not one per id
    assert [m["headers"]["id"] for m in stored(fake, "orders")] == [a.task_id, b.task_id]   # the DLQ's order
    assert [m["headers"]["id"] for m in stored(fake, QueueLists().key("orders", 9))] == [c.task_id]
    assert [letter.task_id for letter in ops.queue("orders").entries()] == [x.task_id]


def test_cli_replay_of_ids_moves_the_oldest_of_each_once_and_missing_ids_as_before(app, fake):
    a, b = dead_letter(fake, args=(1,), at=T0), dead_letter(fake, args=(2,), at=T0 + 1)
    twin_of(fake, a, T0 + 5)
    one = run(app, fake, "replay", "orders", a.task_id, a.task_id, "nope")
    assert one.exit_code == 0 and one.output == ("Replayed 1 of 1 matching dead letter from DLQ.orders: 1 to orders.\n"
                                                  "1 task id not in DLQ.orders: nope\n")   # reported by ops
    assert [m["headers"][H.DEAD_LETTERED_AT] for m in stored(fake, "orders")] == [T0]
    none = run(app, fake, "replay", "orders", "nope", "nope-2")
    assert none.exit_code == 1 and none.output == "Error: nothing matched in DLQ.orders\n"
    filtered = run(app, fake, "replay", "orders", b.task_id, "--task", "mail.*")
    assert filtered.exit_code == 1 and fake.llen("orders") == 1
    limited = run(app, fake, "replay", "orders", a.task_id, b.task_id, "--limit", "1")
    assert limited.exit_code == 0 and "Replayed 1 of 1 matching dead letter" in limited.output
    assert [m["headers"][H.DEAD_LETTERED_AT] for m in stored(fake, "orders")] == [T0, T0 + 1]


def test_cli_purge_of_ids_deletes_every_dead_letter_of_each_in_one_pass(app, fake):
    a, b, keep = dead_letter(fake, args=(1,), at=T0), dead_letter(fake, args=(2,), priority=3), dead_letter(fake)
    twin_of(fake, a, T0 + 5)
    broker = CountingRedis(fake)
    ops = Operator(app, broker=broker, client=fake, clock=FakeClock())
    refused = run(app, fake, "purge", "orders", a.task_id, b.task_id, "nope", ops=ops)
    assert refused.exit_code == 2
    assert "refusing to delete 3 dead letters from DLQ.orders without --force" in refused.output
    assert read_once(broker.lranges, "DLQ.orders") and ops.depth("DLQ.orders") == 4
    broker.lranges.clear()
    result = run(app, fake, "purge", "orders", a.task_id, b.task_id, "nope", "--force", ops=ops)
    assert result.exit_code == 0 and result.output == ("Deleted 3 of 3 matching dead letters from DLQ.orders.\n"
                                                       "1 task id not in DLQ.orders: nope\n")
    assert read_once(broker.lranges, "DLQ.orders")
    assert [letter.task_id for letter in ops.queue("orders").entries()] == [keep.task_id]
    missed = run(app, fake, "purge", "orders", "nope", "--force", ops=ops)
    assert missed.exit_code == 1 and missed.output == "Error: nothing matched in DLQ.orders\n"


def test_parse_time():
    assert parse_time("1700000000") == 1_700_000_000.0
    assert parse_time("2h", now=T0) == T0 - 7200
    assert parse_time("2023-11-14T22:13:20") == 1_700_000_000.0
    assert parse_time("2023-11-14T22:13:20Z") == 1_700_000_000.0


def test_cli_parked_retries(app, fake):
    ops = Operator(app, broker=fake, client=fake, clock=FakeClock())
    park(ops, "a", T0 + 60)
    park(ops, "b", T0 + 30)
    rows = json.loads(run(app, fake, "parked", "--json").output)
    assert [(r["entry_id"], r["task_name"], r["delivery_count"]) for r in rows] == \
        [("b:2", "shop.charge", 2), ("a:2", "shop.charge", 2)]
    assert "ValueError: boom" in run(app, fake, "parked").output
    assert run(app, fake, "redeliver").exit_code == 2                  # ids or --all
    assert run(app, fake, "redeliver", "nope").exit_code == 1          # nothing matched
    assert run(app, fake, "redeliver", "a").output == "1 parked retry due now; the workers' movers deliver it.\n"
    refused = run(app, fake, "parked", "--delete", "b")               # no terminal, no --force
    assert refused.exit_code == 2 and len(list(ops.parked.entries())) == 2
    assert run(app, fake, "delayed", "--delete", "b", "--force").output == "Deleted 1 parked retry.\n"  # old name
    assert " parked " in run(app, fake, "--help").output and "delayed" not in run(app, fake, "--help").output
    assert [r.entry_id for r in ops.parked.entries()] == ["a:2"]


# -- the archive keeps what operators and retention do ----------------------------

def archived(op) -> list[tuple[str, str, str, str]]:
    log = EventLog(op.client, op.keys, 1000)
    return [(e.type, e.task_id, e.dlq, e.reason) for _, e in log.events()]


def test_replay_purge_and_trim_are_archived(op, fake, app):
    first, second, third, fourth = (dead_letter(fake, args=(i,), at=T0 + i) for i in range(4))
    dlq = op.queue("orders")
    dlq.replay(Filter(task_id=first.task_id))
    dlq.replay(Filter(task_id=first.task_id))          # gone already: nothing more to archive
    dlq.purge(Filter(task_id=second.task_id), force=True)
    Retention(op.side).trim("DLQ.orders", max_length=1)
    assert archived(op) == [("replayed", first.task_id, "DLQ.orders", "max_delivery_attempts"),
                            ("purged", second.task_id, "DLQ.orders", "max_delivery_attempts"),
                            ("trimmed", third.task_id, "DLQ.orders", "max_length")]
    assert dlq.purge(force=True).done == 1              # all, with the archive on: read, then removed
    assert archived(op)[-1] == ("purged", fourth.task_id, "DLQ.orders", "max_delivery_attempts")


def test_purge_all_deletes_the_lists_whole_when_the_archive_is_off(fake):
    app = Celery("ops", broker="redis://127.0.0.1:1/0", set_as_current=False)
    app.conf.update(task_default_queue="orders", dlq_events_max_length=0)
    op = Operator(app, broker=fake, client=fake, clock=FakeClock())
    for priority in (0, 3):
        dead_letter(fake, priority=priority)
    assert op.queue("orders").purge(force=True).done == 2
    assert op.depth("DLQ.orders") == 0
    assert archived(op) == []
