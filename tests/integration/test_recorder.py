"""Every path that ends a message is recorded by worker/deadletter/recorder.py, and nothing else writes those records.

Each reason of ``Reason.ALL`` is produced by the real code that produces it
(the Request, the strategy, Celery's discard callbacks, the mover, the
fetch's rejects), against the test run's redis-server, with
:meth:`Recorder.record` replaced by a stub: the path must call it, and must
write no counter, trend, archive event or signal of its own. The recorder is then called with what the path
handed it, and must write each of them once. End to end with a real worker:
tests/integration/test_recorded.py.
"""
from __future__ import annotations

import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis
from billiard.einfo import ExceptionInfo
from billiard.exceptions import WorkerLostError
from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded
from kombu.message import Message
from kombu.utils import json

import celery_dlq
from celery_dlq import RedeliveryTask, task_dead_lettered
from celery_dlq import headers as H
from celery_dlq.errors import MessageExpired
from celery_dlq.headers import Reason
from celery_dlq.message import Envelope
from celery_dlq.storage import totals, trends
from celery_dlq.storage.archive import EventLog
from celery_dlq.storage.events import EventType
from celery_dlq.storage.keys import Keys, Stat
from celery_dlq.storage.dlq import DeadLetterLists
from celery_dlq.storage.scripts import Scripts
from celery_dlq.storage.totals import Metric
from celery_dlq.worker.run import strategy
from celery_dlq.worker.features.delivery_counts import count_or_dead_letter
from celery_dlq.worker.run.discards import dead_letter_first
from celery_dlq.worker.park.mover import MoverThread
from celery_dlq.worker.deadletter.recorder import Recorder
from celery_dlq.worker.fetch.rejects import Rejects
from celery_dlq.worker.run.request import RedeliveryRequest
from celery_dlq.worker.runtime import Runtime
from celery_dlq.worker.fetch.setup import FetchContext

PACKAGE = Path(celery_dlq.__file__).parent
#: The recorder's own method (the fixture puts a stub in its place).
_REAL_RECORD = Recorder.record


class World:
    """A real runtime on the test run's redis-server, one queue and key prefix, its task and what was recorded."""

    def __init__(self, redis_url: str, unique: str) -> None:
        self.queue, self.prefix = f"q{unique}", f"rec{unique}"
        self.app = Celery("rec", broker=redis_url, set_as_current=False)
        # A DLQ name of its own: the operator tests running beside this one list every DLQ.* in the database.
        self.dlq = f"{self.prefix}.DLQ.{self.queue}"
        self.app.conf.update(task_default_queue=self.queue, dlq_key_prefix=self.prefix,
                             dlq_default_policy={"dead_letter_queue_prefix": f"{self.prefix}.DLQ."})
        self.runtime: Runtime = celery_dlq.install(self.app, validate=False)

        @self.app.task(bind=True, base=RedeliveryTask, name="rec.task", ignore_result=True, shared=False,
                       redelivery_policy={"max_delivery_attempts": 3, "dead_letter_on": (KeyError,)})
        def task(self):
            return None

        self.task = task
        self.client = redis.Redis.from_url(redis_url)
        self.keys = Keys(self.prefix)
        self.signals: list[dict] = []
        self.calls: list[tuple[tuple, dict]] = []

    @property
    def context(self) -> FetchContext:
        """A fetch channel's context, made when a path needs it (tests change the conf first)."""
        return FetchContext.of(self.runtime.config, self.runtime.redis, self.runtime.fetch_moved)

    def message(self, name: str = "rec.task", delivery: int = 3, **headers) -> Message:
        task_id = f"id-{name}-{delivery}-{len(self.calls)}"
        sent = self.app.amqp.as_task_v2(task_id, name, args=(), kwargs={})
        return Message(body=json.dumps(sent.body).encode(), content_type="application/json", content_encoding="utf-8",
                       headers={**sent.headers, H.DELIVERY_COUNT: delivery, **headers},
                       properties={**sent.properties, "delivery_tag": f"tag-{task_id}"},
                       delivery_info={"exchange": "", "routing_key": self.queue}, delivery_tag=f"tag-{task_id}",
                       channel=SimpleNamespace(basic_ack=lambda *a, **k: None, basic_reject=lambda *a, **k: None,
                                               no_ack_consumers=None))

    def letter_count(self) -> int:
        return self.client.llen(self.dlq)

    def recorded(self, reason: str) -> dict:
        """What the records say of ``reason``: stats, metric, trend, archive events, signals."""
        metric = sum(n for (name, labels), n in totals.read(self.client, self.keys).items()
                     if name == Metric.DEAD_LETTERED and dict(labels).get("reason") == reason)
        trend = trends.parse(self.client.hgetall(self.keys.trends).items(), time.time())
        archived = [event for _, event in EventLog(self.client, self.keys, 1000).events()
                    if event.type == EventType.DEAD_LETTERED and event.reason == reason]
        return {"stats": int(self.client.hget(self.keys.stats, Stat.DEAD_LETTERED) or 0), "metric": metric,
                "trend": sum(sum(v) for (kind, dim, name), v in trend.minutes.items()
                             if (kind, dim, name) == ("dead_lettered", "reason", reason)),
                "archive": len(archived), "signals": [s["reason"] for s in self.signals]}

    def close(self) -> None:
        self.client.delete(self.dlq, *self.client.keys(f"*{self.prefix}*"))   # the DLQ's groups hash too
        self.client.close()


@pytest.fixture
def world(redis_server, unique, monkeypatch):
    w = World(redis_server.url, unique)

    def receiver(sender=None, **kwargs):
        w.signals.append({"sender": sender, **kwargs})

    def stub(self, *args, **kwargs):
        w.calls.append((args, kwargs))
        pipe = kwargs.get("pipe")
        if pipe is not None:
            pipe.execute()   # the caller's own writes (the audit marker), not the records

    monkeypatch.setattr(Recorder, "record", stub)
    task_dead_lettered.connect(receiver, weak=False)
    yield w
    task_dead_lettered.disconnect(receiver)
    w.close()


def _einfo(exc: BaseException) -> ExceptionInfo:
    try:
        raise exc
    except BaseException:
        return ExceptionInfo()


def _request(world: World, message: Message) -> RedeliveryRequest:
    return RedeliveryRequest(message, app=world.app, task=world.task, hostname="w@test")


def _failure(world: World, exc: BaseException, delivery: int = 3) -> None:
    _request(world, world.message(delivery=delivery)).on_failure(_einfo(exc))


def _lost(world: World) -> None:
    _failure(world, WorkerLostError("child gone"))


def _discarded(world: World, reason: str) -> None:
    c = SimpleNamespace(app=world.app, hostname="w@test")
    name = "rec.nothing" if reason == Reason.UNKNOWN_TASK else "rec.task"
    message = world.message(name=name, delivery=1)
    dead_letter_first(world.runtime.config, world.runtime.redis, c, lambda *a: None, reason, body_first=True)(message.body, message, KeyError(name))


def _fetched_invalid(world: World) -> None:
    keys, consumer = world.keys, "c1"
    world.client.hset(keys.inflight(consumer), "t1", b"x")
    rejects = Rejects(DeadLetterLists(world.client, Scripts(world.client)), keys, "", [keys.inflight(consumer)], "w@test",
                      world.context)
    rejects.reject(world.queue, b"not json", "t1", "not JSON")


def _quarantined(world: World) -> None:
    world.client.lpush(world.keys.quarantine(world.queue), b"\x00junk")
    rejects = Rejects(DeadLetterLists(world.client, Scripts(world.client)), world.keys, "", [world.keys.inflight("c1")],
                      "w@test", world.context)
    rejects.release_quarantine(world.queue, b"\x00junk", "not a kombu message")


def _expired_while_parked(world: World) -> None:
    message = world.message(delivery=2, expires="2000-01-01T00:00:00+00:00")
    envelope = Envelope.from_message(message, world.queue)
    store = world.runtime.redis().store
    store.park(f"{envelope.task_id}:2", envelope.dumps(), world.queue, due=0.0)
    (claimed,) = store.claim_due()
    mover = MoverThread(world.app, world.runtime.config, world.runtime.redis(), "w@test")
    mover._dead_letter_expired(world.runtime.redis().sharded.home, [(claimed, envelope)])


def _forged_count(world: World) -> None:
    message = world.message(delivery=1)
    ctx = world.runtime.config.context(world.task, message)
    strategy._dead_letter_invalid(world.runtime.redis(), world.task, message, ctx, "w@test", "forged delivery count")


def _lost_before_reporting(world: World) -> None:
    message = world.message(delivery=3)
    message.delivery_info["redelivered"] = True   # restored after its worker died: counted past the limit
    ctx = world.runtime.config.context(world.task, message)
    assert count_or_dead_letter(world.runtime.redis(), world.task, message, ctx, "w@test", world.runtime.chain)


PATHS = {
    "last failure (request)": (Reason.MAX_DELIVERY_ATTEMPTS, lambda w: _failure(w, ValueError("boom"))),
    "dead_letter_on (request)": (Reason.NON_RETRYABLE, lambda w: _failure(w, KeyError("missing"), delivery=1)),
    "worker lost (request)": (Reason.WORKER_LOST, _lost),
    "lost before reporting (strategy)": (Reason.WORKER_LOST, _lost_before_reporting),
    "soft time limit (request)": (Reason.TIME_LIMIT, lambda w: _failure(w, SoftTimeLimitExceeded("slow"))),
    "expired (request)": (Reason.EXPIRED, lambda w: _failure(w, MessageExpired("too late"), delivery=1)),
    "expired while parked (mover)": (Reason.EXPIRED, _expired_while_parked),
    "unknown task (Celery's discard)": (Reason.UNKNOWN_TASK, lambda w: _discarded(w, Reason.UNKNOWN_TASK)),
    "invalid task (Celery's discard)": (Reason.INVALID_MESSAGE, lambda w: _discarded(w, Reason.INVALID_MESSAGE)),
    "forged delivery count (strategy)": (Reason.INVALID_MESSAGE, _forged_count),
    "invalid element (fetch)": (Reason.INVALID_MESSAGE, _fetched_invalid),
    "quarantined element (fetch)": (Reason.INVALID_MESSAGE, _quarantined),
}


def test_every_reason_has_a_path_here():
    assert {reason for reason, _ in PATHS.values()} == set(Reason.ALL)


@pytest.mark.parametrize("path", list(PATHS))
def test_each_path_hands_its_letter_to_the_recorder_which_alone_records_it(world, path):
    reason, drive = PATHS[path]
    nothing = {"stats": 0, "metric": 0, "trend": 0, "archive": 0, "signals": []}
    drive(world)
    assert world.letter_count() == 1, "the path stored its letter"
    assert [kwargs["reason"] for _, kwargs in world.calls] == [reason], "the path called the recorder once"
    assert world.recorded(reason) == nothing, "the path wrote no record of its own"
    (args, kwargs) = world.calls[0]
    kwargs.pop("pipe", None)
    _REAL_RECORD(world.runtime.redis().deadletterer.recorder, *args, **kwargs)
    assert world.recorded(reason) == {"stats": 1, "metric": 1, "trend": 1, "archive": 1, "signals": [reason]}


def test_an_invalid_message_from_the_fetch_is_signalled_without_a_task(world, monkeypatch):
    monkeypatch.setattr(Recorder, "record", _REAL_RECORD)
    _fetched_invalid(world)
    (signal,) = world.signals
    assert (signal["sender"], signal["task_id"], signal["task_name"]) == (None, None, None)
    assert (signal["original_queue"], signal["dead_letter_queue"]) == (world.queue, world.dlq)
    assert signal["exception"]["type"] == "celery_dlq.errors.InvalidMessage"
    assert signal["exception"]["message"] == "not JSON" and signal["delivery_count"] == 1
    assert world.recorded(Reason.INVALID_MESSAGE)["trend"] == 1


def test_an_invalid_message_is_trimmed_by_its_dlqs_retention(world, monkeypatch):
    monkeypatch.setattr(Recorder, "record", _REAL_RECORD)
    world.app.conf.dlq_queue_policies = {world.queue: {"dead_letter_max_length": 1}}
    _fetched_invalid(world)
    _quarantined(world)
    assert world.letter_count() == 1
    assert int(world.client.hget(world.keys.stats, Stat.DEAD_LETTERED)) == 2


def test_a_drop_is_recorded_there_too(world, monkeypatch):
    monkeypatch.setattr(Recorder, "record", _REAL_RECORD)
    world.app.conf.dlq_default_policy = {"dead_letter": False}
    _failure(world, ValueError("boom"))
    assert world.letter_count() == 0
    assert [(s["reason"], s["dead_letter_queue"]) for s in world.signals] == [(Reason.MAX_DELIVERY_ATTEMPTS, None)]
    assert int(world.client.hget(world.keys.stats, Stat.DROPPED)) == 1
    assert [n for (name, _), n in totals.read(world.client, world.keys).items() if name == Metric.DROPPED] == [1]
    assert [event.type for _, event in EventLog(world.client, world.keys, 1000).events()] == [EventType.DROPPED]
    assert world.recorded(Reason.MAX_DELIVERY_ATTEMPTS)["trend"] == 0


# -- no second writer -----------------------------------------------------------

#: What writes the record of a dead letter or a drop; only worker/deadletter/recorder.py may hold these.
WRITERS = {
    "the stats counter": r"Stat\.(DEAD_LETTERED|DROPPED)\b",
    "the metric": r"Metric\.(DEAD_LETTERED|DROPPED)\b",
    "the trend": r"series\(\s*[\"']dead_lettered[\"']",
    "the archive event": r"\.(dead_lettered|dropped)\(\s*(letter|envelope|message)\b",
    "the signal": r"task_dead_lettered\s*[,)]|task_dead_lettered\.send",
    "the retention": r"\.after_dead_letter\(",
}
#: The recorder, and the package root that exports the signal.
DEFINED = {"worker/deadletter/recorder.py", "__init__.py"}


def second_writers(files: dict[str, str]) -> dict[str, list[str]]:
    """``{what: [module, ...]}`` of the modules outside :data:`DEFINED` that write a dead letter's records."""
    found: dict[str, list[str]] = {}
    for name, text in sorted(files.items()):
        if name in DEFINED:
            continue
        for what, pattern in WRITERS.items():
            if re.search(pattern, text):
                found.setdefault(what, []).append(name)
    return found


def test_no_module_but_the_recorder_writes_a_dead_letters_records():
    files = {str(path.relative_to(PACKAGE)): path.read_text() for path in PACKAGE.rglob("*.py")}
    assert second_writers(files) == {}


def test_the_check_finds_a_second_writer():
    recorder = (PACKAGE / "worker" / "deadletter" / "recorder.py").read_text()
    assert set(second_writers({"worker/copy.py": recorder})) == set(WRITERS)
    assert second_writers({"worker/fetch/rejects.py": "pipe.hincrby(keys.stats, Stat.DEAD_LETTERED, 1)"}) == \
        {"the stats counter": ["worker/fetch/rejects.py"]}
