"""celery_dlq.ops as the one operator API: one filter parser behind the CLI and the dashboard, counts before a
confirmation, the replay-into-itself refusal, a plan's replay, TaskIds as a value, sizes in one pipeline."""
from __future__ import annotations

import importlib
import sys

import click
import pytest
from starlette.datastructures import ImmutableMultiDict
from starlette.exceptions import HTTPException

from celery_dlq.cli.options import make_filter, make_selection
from celery_dlq.ops import (
    PARAMS,
    BadSelection,
    DeadLetterQueue,
    Filter,
    NothingSelected,
    NotInPlan,
    Operator,
    PlanError,
    PlanReplay,
    ReplayIntoItself,
    Selection,
    Size,
    TaskIds,
    parse_filter,
)
from celery_dlq.web.actions import Action
from celery_dlq.web.api import selection_params
from celery_dlq.web.query import BadQuery, Query
from tests.unit.test_manage import T0, FakeClock, dead_letter, run, twin_of
from tests.unit.test_web_groups import CHARGE, SHIP, world  # noqa: F401  (world: a fixture)

GROUP = "0123456789abcdef"


@pytest.fixture
def op(app, fake):
    return Operator(app, broker=fake, client=fake, clock=FakeClock())

#: The same selections as CLI keyword arguments and as URL parameters (one spelling: PARAMS).
SAME = [
    {"task": "shop.*"},
    {"reason": "max_delivery_attempts", "exception": "ValueError"},
    {"original_queue": "orders", "grep": "declined", "group": GROUP},
    {"since": "2023-11-14T22:13:20", "until": "1700003600"},
    {"task": "shop.#", "since": "1700000000", "grep": "  declined  "},
]


@pytest.mark.parametrize("values", SAME)
def test_the_cli_the_page_and_the_json_api_read_equal_inputs_into_equal_filters(values):
    cli = make_filter(**values)
    page = Query.parse(ImmutableMultiDict(values)).selection()
    api = Query.parse(selection_params({"filter": values})).selection()
    assert cli == page == api == parse_filter(values)
    assert cli is not None and cli != Filter()


def test_the_filter_fields_read_as_documented():
    where = parse_filter({"task": "shop.*", "since": "2023-11-14T22:13:20", "grep": " declined ", "until": ""})
    assert where == Filter(task_name="shop.*", since=T0, text="declined")
    assert parse_filter({}) is None and parse_filter({"task": "  ", "group": None}) is None
    assert set(PARAMS) == {"task", "reason", "exception", "original_queue", "since", "until", "grep", "group"}


@pytest.mark.parametrize("param, value, says", [
    ("group", "not-a-group", "16 hex digits"),
    ("task", "shop.**", "shop.**"),
    ("since", "last tuesday", "last tuesday"),
    ("reason", "bored", "reason must be one of"),
])
def test_both_adapters_refuse_a_bad_value_with_the_parsers_message(param, value, says):
    with pytest.raises(BadSelection) as parsed:
        parse_filter({param: value})
    assert parsed.value.param == param and says in str(parsed.value)
    with pytest.raises(click.BadParameter) as cli:
        make_filter(**{param: value})
    assert str(parsed.value) in cli.value.format_message() and cli.value.param_hint == f"--{param}"
    with pytest.raises(BadQuery) as page:
        Query.parse(ImmutableMultiDict({param: value}))
    assert str(page.value) == str(parsed.value)


def test_an_unknown_parameter_is_refused_not_ignored():
    with pytest.raises(BadSelection, match="unknown filter 'tsk'"):
        parse_filter({"tsk": "shop.*"})


def test_a_selection_says_which_letters_or_is_refused():
    where = Filter(task_name="shop.*")
    assert Selection.of(["a", "b", "a", ""], where).selector() == TaskIds(["a", "b"], where)
    assert Selection.of(["a"]).selector(every=True) == TaskIds(["a"], every=True)
    assert Selection.of(where=where).selector() == where
    assert Selection.of(everything=True).selector() is None
    with pytest.raises(NothingSelected):
        Selection.of()
    with pytest.raises(click.UsageError, match="TASK_ID..., a filter option, or --all"):
        make_selection((), False, {"task": None})
    with pytest.raises(HTTPException) as web:
        Action(ImmutableMultiDict({}), "purge")
    assert web.value.status_code == 400


def test_the_cli_and_the_page_build_the_same_selection_from_ids_and_filters():
    cli = make_selection(("a", "b"), False, {"task": "shop.*", "reason": None})
    page = Action(ImmutableMultiDict([("id", "a"), ("id", "b"), ("task", "shop.*")]), "purge")
    assert page.chosen == cli
    assert page.where() == cli.selector(every=True) == TaskIds(["a", "b"], Filter(task_name="shop.*"), every=True)


# -- counts before a confirmation ---------------------------------------------------------------------------

def test_count_is_what_the_operation_then_takes(op, fake):
    a = dead_letter(fake, at=T0)
    twin_of(fake, a, T0 + 5)
    b = dead_letter(fake, task="mail.send", at=T0 + 10)
    dlq = op.queue("orders")
    assert dlq.count() == dlq.depth() == 3
    assert dlq.count(Filter(task_name="shop.*")) == 2
    assert dlq.count(TaskIds([a.task_id, b.task_id, "nope"])) == 2             # a replay's: the oldest of each
    by_id = TaskIds([a.task_id, b.task_id, "nope"], every=True)                # a purge's: every copy
    assert dlq.count(by_id) == 3
    assert dlq.purge(by_id, force=True).done == 3                               # the same value, counted then used


def test_a_groups_count_comes_from_its_index_without_reading_letters(world, monkeypatch):
    dlq = world.op.queue("orders")
    assert dlq.count(Filter(group=CHARGE)) == 5 and dlq.count(Filter(group=SHIP, task_name="shop.*")) == 2

    def no_pass(*args, **kw):
        raise AssertionError("a group's count reads its index, not the letters")

    monkeypatch.setattr(DeadLetterQueue, "entries", no_pass)
    assert dlq.count(Filter(group=CHARGE)) == 5 and dlq.count(Filter(group="f" * 16)) == 0
    with pytest.raises(AssertionError):
        dlq.count(Filter(group=CHARGE, task_name="shop.*"))   # with another field, it is a pass


def test_the_cli_prompt_and_the_confirmation_page_state_the_same_count(app, fake, op):
    a = dead_letter(fake, at=T0)
    twin_of(fake, a, T0 + 5)
    dead_letter(fake, task="mail.send")
    refused = run(app, fake, "purge", "orders", a.task_id, "--task", "shop.*", ops=op)
    assert "refusing to delete 2 dead letters from DLQ.orders" in refused.output
    page = Action(ImmutableMultiDict([("id", a.task_id), ("task", "shop.*")]), "purge")
    assert op.queue("orders").count(page.where()) == 2


# -- the refusal, in one place ------------------------------------------------------------------------------

def test_replaying_a_dlq_into_itself_is_refused_before_anything_moves(op, fake):
    dead_letter(fake)
    dlq = op.queue("orders")
    with pytest.raises(ReplayIntoItself, match="cannot replay DLQ.orders into itself"):
        dlq.replay(to="DLQ.orders")
    assert issubclass(ReplayIntoItself, ValueError) and dlq.depth() == 1
    with pytest.raises(ReplayIntoItself):
        PlanReplay(op, {"DLQ.orders": ["x"]}, to="DLQ.orders")
    assert dlq.replay(to="elsewhere").done == 1


# -- a replay plan, through ops -----------------------------------------------------------------------------

def test_a_plan_replays_the_oldest_of_each_planned_id_and_reports_the_rest(op, fake):
    a = dead_letter(fake, at=T0)
    twin_of(fake, a, T0 + 5)
    b = dead_letter(fake, queue="emails", at=T0 + 1)
    plan = PlanReplay(op, {"DLQ.orders": [a.task_id, "gone", a.task_id], "DLQ.emails": [b.task_id]})
    assert plan.counts() == {"DLQ.orders": 2, "DLQ.emails": 1} and plan.planned == 3
    orders = plan.replay("DLQ.orders")
    assert (orders.done, orders.not_found, plan.shortfall(orders)) == (1, ["gone"], 1)
    assert op.depth("DLQ.orders") == 1 and fake.llen("orders") == 1              # the twin stays
    emails = plan.replay("DLQ.emails", dry_run=True)
    assert (emails.matched, emails.done, plan.shortfall(emails)) == (1, 0, 0) and op.depth("DLQ.emails") == 1


def test_a_plan_paces_across_dlqs_and_checks_every_dlq_first(op, fake):
    dead_letter(fake, queue="emails")
    plan = PlanReplay(op, {"DLQ.orders": ["x"], "DLQ.emails": ["y"]})
    slept = []
    for dead, _ in plan.shares.values():
        dead.sleep = slept.append
    plan.replay("DLQ.orders", rate=4)
    plan.replay("DLQ.emails", rate=4)
    assert slept and slept[0] == 0.25                                             # before the second DLQ's first
    with pytest.raises(NotInPlan, match="the plan selects nothing from DLQ.emails"):
        PlanReplay(op, {"DLQ.orders": ["x"]}, only="emails")
    fake.lpush("orders", b"live")
    with pytest.raises(PlanError, match="the plan names 'orders', which is not a dead-letter queue here"):
        PlanReplay(op, {"DLQ.empty": ["x"], "orders": ["y"]})
    empty = PlanReplay(op, {"DLQ.empty": ["x"]})                                  # empty now: kept, not found
    assert empty.replay("DLQ.empty").not_found == ["x"]


# -- TaskIds as a value ---------------------------------------------------------------------------------------

def test_task_ids_are_a_value_each_pass_starting_afresh(op, fake):
    a = dead_letter(fake, at=T0)
    twin_of(fake, a, T0 + 5)
    wanted = TaskIds([a.task_id, a.task_id, "nope"])
    assert wanted.ids == (a.task_id, "nope") and wanted == TaskIds([a.task_id, "nope"])
    with pytest.raises(AttributeError):
        wanted.ids = ()
    dlq = op.queue("orders")
    firsts = [list(dlq.entries(wanted)) for _ in range(3)]
    assert [[x.dead_lettered_at for x in found] for found in firsts] == [[T0]] * 3
    one_pass = wanted.start()
    assert [one_pass.matches(x) for x in dlq.entries()] == [True, False]       # the oldest of the id, once
    assert one_pass.missing == ["nope"] and wanted.start().missing == [a.task_id, "nope"]
    assert dlq.replay(wanted, dry_run=True).matched == dlq.replay(wanted, dry_run=True).matched == 1


# -- sizes: every DLQ's depth and oldest dead letter in one pipeline --------------------------------------------

class CountingPipelines:
    """The fakeredis client, counting pipelines executed."""

    def __init__(self, client) -> None:
        self.client, self.executed = client, 0

    def __getattr__(self, name):
        return getattr(self.client, name)

    def pipeline(self, *args, **kw):
        pipe, outer = self.client.pipeline(*args, **kw), self
        original = pipe.execute

        def execute(*a, **k):
            outer.executed += 1
            return original(*a, **k)

        pipe.execute = execute
        return pipe


def test_sizes_read_every_dlq_in_one_round_trip(app, fake):
    dead_letter(fake, at=T0 + 10)
    dead_letter(fake, at=T0, priority=6)                     # the oldest is in a priority sub-list
    dead_letter(fake, queue="emails", at=T0 + 20)
    broker = CountingPipelines(fake)
    op = Operator(app, broker=broker, client=fake)
    sizes = op.sizes(["DLQ.orders", "DLQ.emails", "DLQ.none"])
    assert broker.executed == 1
    assert sizes == {"DLQ.orders": Size(2, T0), "DLQ.emails": Size(1, T0 + 20), "DLQ.none": Size(0, None)}
    assert sizes["DLQ.orders"].age(T0 + 30) == 30 and sizes["DLQ.none"].age(T0) is None


# -- one public path ------------------------------------------------------------------------------------------

def test_celery_dlq_manage_warns_and_still_gives_the_names():
    import celery_dlq.ops as ops

    sys.modules.pop("celery_dlq.manage", None)
    with pytest.warns(DeprecationWarning, match="celery_dlq.ops"):
        manage = importlib.import_module("celery_dlq.manage")
    sys.modules.pop("celery_dlq.manage", None)
    assert set(manage.__all__) == set(ops.__all__)
    assert all(getattr(manage, name) is getattr(ops, name) for name in ops.__all__)
    assert {"Operator", "Filter", "TaskIds", "DeadLetterQueue", "ParkedRetries", "GroupStats"} <= set(ops.__all__)
