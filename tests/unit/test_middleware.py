"""The hook chain: its features and hooks match docs/architecture.md's table; the chain calls them in order."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from celery import Celery

import celery_dlq
from celery_dlq.worker.middleware import HOOKS, Chain, Middleware, overridden
from celery_dlq.worker.runtime import Runtime

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def table() -> list[tuple[str, str, tuple[str, ...]]]:
    """The rows of "The hook chain" table: (feature, module, hooks)."""
    text = DOC.read_text()
    section = text.split("## The hook chain", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("feature", "") or set(cells[0]) <= {"-"}:
            continue
        rows.append((cells[0], cells[1].strip("`"), tuple(re.findall(r"`(\w+)`", cells[2]))))
    return rows


def test_the_chains_features_and_their_hooks_are_the_docs_table():
    runtime = Runtime(Celery("chain", broker="redis://localhost:1/0", set_as_current=False))
    root = Path(celery_dlq.__file__).resolve().parent
    found = [(feature.name, Path(inspect.getfile(type(feature))).resolve().relative_to(root.parent).as_posix()
              .removeprefix("celery_dlq/"), overridden(feature)) for feature in runtime.chain.features]
    assert table() and found == table()


def test_the_docs_table_names_hooks_that_exist():
    assert {hook for _, _, hooks in table() for hook in hooks} <= set(HOOKS)


def test_every_hook_of_the_base_does_nothing_and_the_chain_has_a_method_for_each():
    assert set(HOOKS) == {name for name, value in vars(Middleware).items()
                          if callable(value) and not name.startswith("_")}
    assert all(callable(getattr(Chain, hook)) for hook in HOOKS)


class Recorder(Middleware):
    def __init__(self, name: str, log: list, takes: bool = False) -> None:
        self.name, self.log, self.takes = name, log, takes

    def fetched(self, task, message, ctx, hostname):
        self.log.append((self.name, "fetched"))
        return self.takes

    def acknowledged(self, request):
        self.log.append((self.name, "acknowledged"))


class Quiet(Middleware):
    name = "quiet"


def test_each_hook_keeps_only_its_implementers_in_order():
    log: list = []
    first, second, quiet = Recorder("a", log), Recorder("b", log), Quiet()
    chain = Chain((first, quiet, second))
    assert chain.implementers["fetched"] == (first.fetched, second.fetched)
    assert chain.implementers["raised"] == ()           # no implementer: an empty loop
    assert overridden(quiet) == ()
    chain.acknowledged(object())
    assert log == [("a", "acknowledged"), ("b", "acknowledged")]


def test_the_first_feature_that_takes_a_fetched_message_ends_the_chain():
    log: list = []
    chain = Chain((Recorder("a", log, takes=True), Recorder("b", log)))
    assert chain.fetched(None, None, None, "w") is True
    assert log == [("a", "fetched")]
    log.clear()
    assert Chain((Recorder("a", log), Recorder("b", log))).fetched(None, None, None, "w") is False
    assert log == [("a", "fetched"), ("b", "fetched")]


class Boom(Middleware):
    name = "boom"

    def delivery_succeeded(self, request):
        raise KeyError("a bug of ours")


def test_the_chain_does_not_swallow_a_features_bug():
    with pytest.raises(KeyError):
        Chain((Boom(),)).delivery_succeeded(object())


# -- the features' hooks -----------------------------------------------------------


@pytest.fixture
def fresh_internals():
    from celery_dlq.internals import base

    base.forget()
    yield
    base.forget()


class Members:
    """A process's chord members whose chord waits for a dead-lettered member (``waits``), the calls it saw."""

    def __init__(self, waits: bool = True) -> None:
        self.parked: list = []
        self.waits = waits

    def park_unlock(self, request, args, kwargs, *, joining=True) -> bool:
        self.parked.append((args, kwargs))
        self.joining = joining
        return self.waits


def _unlock_app() -> tuple[Celery, Members]:
    from celery_dlq.internals.celery_canvas import chord_unlock_of
    from celery_dlq.worker.features.chords import wrap_chord_unlock

    app = Celery("unlock", broker="redis://localhost:1/0", set_as_current=False)
    app.finalize()
    chord_unlock_of(app).run = lambda *args, **kwargs: "celery's own"   # what Celery's body would do
    members = Members()
    wrap_chord_unlock(app, lambda: members)
    return app, members


def test_chord_unlock_parks_while_a_member_waits(fresh_internals):
    app, members = _unlock_app()
    assert app.tasks["celery.chord_unlock"].run("g1", None) is None
    assert members.parked == [(("g1", None), {})]


def _header_read(monkeypatch, members: Members, ready: bool) -> list:
    """Make the wrapper's header read return ``ready``; the order of header reads and ledger looks."""
    from celery_dlq.worker.features import chords

    order: list = []
    monkeypatch.setattr(chords, "header_ready", lambda app, args, kwargs: order.append("header") or ready)
    look = members.park_unlock
    members.park_unlock = lambda *a, **kw: order.append("ledger") or look(*a, **kw)   # type: ignore[method-assign]
    return order


def test_chord_unlock_reads_its_header_before_the_ledger_and_polls_again_itself(fresh_internals, monkeypatch):
    """A member that fails between the two reads was marked dying first: read in this order, Celery's body
    never joins a member's own failure that the ledger has not seen."""
    from celery.exceptions import Retry

    app, members = _unlock_app()
    members.waits = False
    task = app.tasks["celery.chord_unlock"]
    order = _header_read(monkeypatch, members, ready=False)
    with pytest.raises(Retry):
        task.run("g1", None, interval=0.5, result=[])
    assert order == ["header", "ledger"] and members.joining is False   # polls again: nothing to write
    order = _header_read(monkeypatch, members, ready=True)
    assert task.run("g1", None, result=[]) == "celery's own" and order == ["header", "ledger"]
    assert members.joining is True


def test_chord_unlock_polls_again_when_its_header_or_ledger_cannot_be_read(fresh_internals, monkeypatch):
    """A failed read (a locked database, Redis away) never lets Celery's body join unchecked: the poll retries
    with the error, as Celery's own body does when its header read fails."""
    from celery_dlq.worker.features import chords

    app, members = _unlock_app()
    task = app.tasks["celery.chord_unlock"]
    polls: list = []

    class PolledAgain(Exception):
        pass

    def poll_again(task, kwargs, exc=None):
        polls.append(exc)
        raise PolledAgain

    def unreadable(app, args, kwargs):
        raise OSError("database is locked")

    def ledger_away(*a, **kw):
        raise ConnectionError("redis away")

    monkeypatch.setattr(chords, "poll_again", poll_again)
    monkeypatch.setattr(chords, "header_ready", unreadable)
    with pytest.raises(PolledAgain):
        task.run("g1", None, interval=0.5, result=[])
    monkeypatch.setattr(chords, "header_ready", lambda app, args, kwargs: True)
    members.park_unlock = ledger_away   # type: ignore[method-assign]
    with pytest.raises(PolledAgain):
        task.run("g1", None, interval=0.5, result=[])
    assert [type(exc) for exc in polls] == [OSError, ConnectionError]


def test_where_chord_unlocks_assumption_moved_celerys_own_runs(fresh_internals, monkeypatch):
    from celery_dlq.internals.celery_canvas import CHORD_UNLOCK
    from tests.internals_hiding import hide, key

    hide(key(CHORD_UNLOCK.internals[0]), monkeypatch)
    app, members = _unlock_app()
    assert app.tasks["celery.chord_unlock"].run("g1", None) == "celery's own"
    assert members.parked == []


def test_chord_unlocks_behaviour_check_names_a_run_that_takes_no_group_first(monkeypatch):
    from celery_dlq.internals import celery_canvas

    monkeypatch.setattr(celery_canvas, "UNLOCK_PARAMS", ("chord_id", "callback"))
    problem = celery_canvas.CHORD_UNLOCK.problems()
    assert len(problem) == 1 and "expected (chord_id, callback, ...)" in problem[0]



def test_chord_unlocks_check_reads_celerys_parameters_through_celery_dlqs_own_wrapper(fresh_internals, monkeypatch):
    """An app's task is shared by default: every app finalized later gets a copy, the check's own throwaway
    app included, and a RedeliveryTask's copy installs celery-dlq there, which wraps that app's chord_unlock.
    The check then read the wrapper's ``(args, kwargs)`` and turned parking off (CI's SQLite chord failures)."""
    import celery._state

    from celery_dlq import RedeliveryTask
    from celery_dlq.internals.celery_canvas import CHORD_UNLOCK

    monkeypatch.setattr(celery._state, "_on_app_finalizers", set(celery._state._on_app_finalizers))
    app = Celery("shared", broker="redis://localhost:1/0", set_as_current=False)
    celery_dlq.install(app)

    @app.task(bind=True, base=RedeliveryTask, name="shared.redelivered")
    def redelivered(self):
        return None

    app.finalize()
    assert getattr(app.tasks["celery.chord_unlock"].run, "_celery_dlq_parks", False)
    assert CHORD_UNLOCK.problems() == []


class Policies:
    def __init__(self, policy) -> None:
        self.policy_ = policy

    def policy(self, task, queue):
        return self.policy_


def test_a_snooze_past_its_bound_is_raised_as_a_failure_other_exceptions_are_not_its_own():
    from types import SimpleNamespace

    from celery_dlq import RedeliveryPolicy
    from celery_dlq import headers as H
    from celery_dlq.errors import SnoozeLimitExceeded
    from celery_dlq.worker.features.snooze import Snooze, Snoozing

    snoozing = Snoozing(Policies(RedeliveryPolicy(max_snoozes=1)), parking=None)   # type: ignore[arg-type]
    task = SimpleNamespace(app=Celery("snooze", set_as_current=False), name="t")
    first = {"delivery_info": {"routing_key": "q"}}
    request = SimpleNamespace(delivery_info={"routing_key": "q"}, get=first.get)
    snooze = Snooze(5)
    assert snoozing.raised(task, request, ValueError("boom")) is None
    assert snoozing.raised(task, request, snooze) is snooze
    again = SimpleNamespace(delivery_info={"routing_key": "q"}, get={H.SNOOZES: 1}.get)
    assert isinstance(snoozing.raised(task, again, snooze), SnoozeLimitExceeded)


def test_a_snooze_is_parked_without_an_attempt_and_a_plain_retry_is_left_to_celery():
    from types import SimpleNamespace

    from celery.exceptions import Retry

    from celery_dlq import RedeliveryPolicy
    from celery_dlq.worker.features.snooze import Snooze, Snoozing

    parked: list = []
    parking = SimpleNamespace(park_again=lambda ctx, *, delay, snooze=False: parked.append((ctx, delay, snooze)))
    snoozing = Snoozing(Policies(RedeliveryPolicy()), parking)
    request = SimpleNamespace(dlq_context=lambda: "ctx")
    assert snoozing.taking_over(request, Retry("celery's")) is False and parked == []
    assert snoozing.taking_over(request, Snooze(7)) is True and parked == [("ctx", 7.0, True)]


class Counters:
    def __init__(self) -> None:
        self.uncounted: list = []

    def uncount(self, keys) -> None:
        self.uncounted.extend(keys)


def test_a_requeue_takes_its_delivery_count_back_where_counts_are_persisted():
    from types import SimpleNamespace

    from celery_dlq import RedeliveryPolicy
    from celery_dlq.worker.features.delivery_counts import DeliveryCounts

    counters = Counters()
    counts = DeliveryCounts(lambda: SimpleNamespace(counters=counters), lambda: Chain(()))  # type: ignore[arg-type]
    message = SimpleNamespace(headers={}, properties={"delivery_tag": "tag-1"})

    def request(persist: bool):
        ctx = SimpleNamespace(policy=RedeliveryPolicy(persist_delivery_count_before_delivery=persist), delivery=2)
        return SimpleNamespace(id="t1", message=message, dlq_context=lambda: ctx, task=SimpleNamespace(name="t"))

    counts.requeued(request(persist=False))
    assert counters.uncounted == []
    counts.requeued(request(persist=True))
    assert counters.uncounted == [("t1", "tag-1", 2)]


def test_the_delivery_path_names_no_feature():
    """request.py, task.py and the strategy call the chain; a feature's own calls live in its module."""
    from celery_dlq.worker.park import parking as park
    from celery_dlq.worker.run import request
    from celery_dlq.worker.run import strategy
    from celery_dlq.worker.run import task

    features = (".breakers.", ".chords.", ".counters.", "take_chord(", "check_snooze(", "park_again(", "ack_keys(",
                ".settled(", "Snooze)")
    sources = {"request": inspect.getsource(request), "task": inspect.getsource(task),
               "strategy": inspect.getsource(strategy.strategy),
               "park": inspect.getsource(park.Parking.redeliver_later)}
    assert {name: [f for f in features if f in text] for name, text in sources.items()} == \
        {name: [] for name in sources}
