"""The pages (GET): overview, failure groups, a DLQ, a dead letter, parked retries; and the login.

Jobs and the audit trail have theirs in ``web/jobs.py``.

Each is a few calls to the operator API and one template. Starlette runs
these plain functions in its thread pool, so Redis round trips never block
the event loop.
"""
from __future__ import annotations

import dataclasses
import re

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from celery_dlq import headers as H
from celery_dlq.ops import DeadLetter, DeadLetterQueue, GroupReport, Operator
from celery_dlq.ops.operator import TREND_KINDS
from celery_dlq.ops.window import find_letter, letter_at, parse_anchor, read_window
from celery_dlq.web.charts import histogram, sparkline, trend_sections
from celery_dlq.web.query import PAGE_SIZES, BadQuery, Query
from celery_dlq.web.render import href, render
from celery_dlq.web.users import TOKEN_USER
from celery_dlq.workflow import summary as workflow_summary

#: Parked retries listed per page.
PARKED_LIMIT = 200
#: Failure groups the overview shows (the largest; ``/groups`` shows them all).
OVERVIEW_GROUPS = 10
#: Seconds the overview (and its in-place refresh) reuses the DLQs a SCAN of the broker found: however many
#: pages are open, the keyspace is scanned at most once per this many seconds.
SCAN_EVERY = 30.0
#: The shortest task id a letter's URL may name (a uuid has 36 characters). Finding a letter searches its DLQ
#: for the id's text and decodes every letter holding it: a one-character id, or a piece of every message's JSON
#: (``"content-type": ``), would send back and decode the whole DLQ.
MIN_TASK_ID = 12
#: What a task id in a letter's URL is made of: letters, digits and ``-_.:@+`` (no quote, space or brace, so it
#: cannot be a piece of a message's JSON structure).
TASK_ID = re.compile(r"[\w.:@+-]+")
#: A number in a letter's ``?at=`` (``<list>:<n>``, the DLQ page's links, or a page position) has at most 18
#: digits: past that no list is that long, and Python refuses to read 4,300 (what is not a number is ignored).
TOO_LONG = re.compile(r"\d{19}")
#: Content types the dashboard never decodes to show a letter, even when the app's ``accept_content`` allows
#: them: unpickling runs whatever code the message names.
NEVER_DECODED = frozenset({"application/x-python-serialize"})


def named_dlq(request: Request, name: str) -> DeadLetterQueue:
    """The DLQ ``name`` (or the DLQ of queue ``name``): a configured one or one present in Redis, else 404
    without a SCAN of the keyspace (:meth:`~celery_dlq.ops.operator.Operator.queue` with ``scan=False``)."""
    return request.app.state.op.queue(name, scan=False)


def letter_task_id(request: Request) -> str:
    """The letter URL's task id, when it is a full one (:data:`MIN_TASK_ID`); else 404, nothing searched."""
    task_id = request.path_params["task_id"]
    if len(task_id) < MIN_TASK_ID or not TASK_ID.fullmatch(task_id):
        raise HTTPException(404, f"no dead letter of task {task_id[:100]}: a letter is found by its full task id "
                                 f"(at least {MIN_TASK_ID} characters, letters, digits and -_.:@+; celery dlq "
                                 "show finds others), or it was replayed or purged")
    return task_id


def displayed(letter: DeadLetter) -> DeadLetter:
    """``letter`` as a page shows it: never decoded with a :data:`NEVER_DECODED` serializer (shown as bytes)."""
    return dataclasses.replace(letter, accept=letter.accept - NEVER_DECODED)


def overview(request: Request) -> Response:
    """An incident first (open, half-open or paused breakers with what each holds; running jobs); then every DLQ:
    depth, queue, parked retries, the oldest dead letter's age; the counters."""
    op = request.app.state.op
    rows = op.queues(max_age=SCAN_EVERY)
    sizes = op.sizes(row.name for row in rows if row.name and row.dead_letters)   # one pipeline for every DLQ
    oldest = {name: size.oldest_at for name, size in sizes.items()}
    report = op.groups(names=_dlqs(rows))
    jobs = request.app.state.jobs.recent()
    return render(request, "overview.html", rows=rows, oldest=oldest, stats=op.stats(rows),
                  jobs=jobs[:10], refresh=request.app.state.refresh, trends=trend_sections(op.trends()),
                  holding=[row for row in op.breakers.rows() if row.state != "closed"],
                  running=[job for job in jobs if job.running], **_groups(op, report, OVERVIEW_GROUPS))


def overview_json(request: Request) -> Response:
    """The overview's figures as JSON, for its in-place refresh (``static/refresh.js``): counters, each DLQ's depth,
    each group's count, the trends' totals. Read-only, behind the same login as every page."""
    op = request.app.state.op
    rows = op.queues(max_age=SCAN_EVERY)
    seen = op.trends()
    return JSONResponse({
        "at": op.clock(), "stats": op.stats(rows), "depths": {row.name: row.dead_letters for row in rows if row.name},
        "groups": {g.group_id: g.count for g in op.groups(names=_dlqs(rows)).merged()},
        "trends": {kind: {"hour": sum(seen.total(kind)), "week": sum(seen.total(kind, "hour"))}
                   for kind in TREND_KINDS},
    })


def _dlqs(rows: list) -> list[str]:
    """The DLQs of :meth:`Operator.queues` rows (read once per page: no second SCAN for the groups)."""
    return sorted({row.name for row in rows if row.name})


def groups_page(request: Request) -> Response:
    """Every failure group, across DLQs or of one (``?dlq=``): what broke, since when, and is it over."""
    op = request.app.state.op
    name = request.query_params.get("dlq") or None
    dlq = named_dlq(request, name).name if name else None
    report = op.groups(names=[dlq] if dlq else sorted(op.known(max_age=SCAN_EVERY)))
    return render(request, "groups.html", dlq=dlq, **_groups(op, report, None))


def _groups(op: Operator, report: GroupReport, limit: int | None) -> dict:
    """The groups part of a page: the rows (at most ``limit``), their sparklines, the letters in no group."""
    merged, now = report.merged(), op.clock()
    shown = merged if limit is None else merged[:limit]
    return {"groups": [(g, sparkline(g.arrivals, now)) for g in shown], "groups_total": len(merged),
            "ungrouped": report.ungrouped}


def dlq_page(request: Request) -> Response:
    """One DLQ, a page at a time from either end, filtered as ``celery dlq list`` filters."""
    dead = named_dlq(request, request.path_params["name"])
    query = Query.parse(request.query_params)
    window = read_window(dead, query.start, query.size, newest_first=query.newest_first, where=query.selection())
    return render(request, "dlq.html", dead=dead, query=query, window=window, sizes=PAGE_SIZES,
                  reasons=H.Reason.ALL,
                  letters=[(anchor, letter, letter.as_dict())
                           for (_, letter), anchor in zip(window.letters, window.anchors)])


def letter_page(request: Request) -> Response:
    """Every ``x-dlq-*`` header, the workflow it belongs to, the arguments (decoded only within
    ``accept_content``), the traceback."""
    op = request.app.state.op
    dead = named_dlq(request, request.path_params["name"])
    task_id = letter_task_id(request)
    hint = request.query_params.get("at", "")
    if TOO_LONG.search(hint):
        raise BadQuery("at is <list>:<n> or a page position, whole numbers of at most 18 digits")
    anchor = parse_anchor(hint)   # "<list>:<n from the old end>": what the DLQ page's links carry
    if anchor is not None or not hint.lstrip("-").isdigit():
        letter = find_letter(dead, task_id, anchor)
    else:  # a page position (links of earlier versions)
        letter = letter_at(dead, int(hint), task_id, newest_first=request.query_params.get("order") != "oldest")
    if letter is None:
        raise HTTPException(404, f"no dead letter of task {task_id} in {dead.name}: "
                                 "it was replayed or purged (perhaps by someone else)")
    letter = displayed(letter)
    d = op.details(letter)
    return render(request, "letter.html", dead=dead, letter=letter, d=d, workflow=workflow_summary(d["workflow"]),
                  traceback=letter.header(H.TRACEBACK) or "")


def parked_page(request: Request) -> Response:
    """Parked retries (soonest due first), optionally of one queue."""
    op = request.app.state.op
    queue = request.query_params.get("queue") or None
    retries = list(op.parked.entries(queue, limit=PARKED_LIMIT))
    due = op.parked.due_histogram(op.clock())
    return render(request, "parked.html", retries=retries, queue=queue, total=op.parked.count(),
                  limit=PARKED_LIMIT, by_queue=op.parked.counts_by_queue(), due=due, due_chart=histogram(due))


def login_page(request: Request) -> Response:
    if request.app.state.access.no_auth:
        return RedirectResponse(href(request, "/"), 303)
    return render(request, "login.html", next=next_path(request.query_params.get("next")), error=None,
                  token_user=TOKEN_USER)


def next_path(target: str | None) -> str:
    """Where to go after the login: a path inside the dashboard only (no open redirect)."""
    ok = target and target.startswith("/") and not target.startswith("//") and "\\" not in target
    return target if target and ok else "/"


ROUTES = [
    Route("/", overview, name="overview"),
    Route("/groups", groups_page, name="groups"),
    Route("/api/overview", overview_json, name="overview_json"),
    Route("/dlq/{name}", dlq_page, name="dlq"),
    Route("/dlq/{name}/letters/{task_id}", letter_page, name="letter"),
    Route("/parked", parked_page, name="parked"),
    Route("/login", login_page, name="login"),
]
