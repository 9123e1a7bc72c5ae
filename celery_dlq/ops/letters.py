"""What a dead letter is, as an operator reads it, and how operators select them.

:class:`DeadLetter` is one message exactly as kombu stored it in a DLQ, with
the ``x-dlq-*`` history read from its headers and its arguments decoded only
when ``accept_content`` allows (listing a DLQ must never unpickle). A
selection is anything with ``matches(letter)``: :class:`Filter` (fields such
as task name, reason, time) or :class:`TaskIds` (a set of task ids, served in
one pass); both are values, built from options or a query string by
:mod:`celery_dlq.ops.selection`. :mod:`celery_dlq.ops.queue` reads, replays and purges what
they select; nothing here talks to Redis.
"""
from __future__ import annotations

import base64
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from kombu.serialization import loads
from kombu.utils.uuid import uuid

from celery_dlq import headers as H
from celery_dlq.matching import Pattern
from celery_dlq.message import RawMessage, TaskIdentity, decode_raw, task_arguments
from celery_dlq.workflow import membership

T = TypeVar("T")


class cached(Generic[T]):
    """``functools.cached_property`` without its lock: Python 3.10 and 3.11 take one on each first read,
    and a replay reads three per letter (its profile: BENCHMARKS.md section 11)."""

    def __init__(self, func: Callable[[Any], T]) -> None:
        self.func, self.name = func, func.__name__
        self.__doc__ = func.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> T:
        if obj is None:
            return self  # type: ignore[return-value]
        value = obj.__dict__[self.name] = self.func(obj)   # found in __dict__ from now on: a non-data descriptor
        return value


@dataclass(frozen=True)
class DeadLetter(TaskIdentity):
    """One dead letter exactly as stored; ``message`` is kombu's JSON, {} if it is not JSON."""

    queue: str
    key: str
    raw: bytes
    message: dict
    accept: frozenset = frozenset()

    @classmethod
    def parse(cls, queue: str, key: str, raw: bytes, accept: frozenset) -> DeadLetter:
        return cls(queue, key, raw, decode_raw(raw).doc, accept)

    @cached
    def decoded(self) -> RawMessage:
        return RawMessage(self.message)

    @cached
    def headers(self) -> dict:
        return self.decoded.headers   # read a dozen times per letter in a replay: decoded once

    @cached
    def properties(self) -> dict:
        return self.decoded.properties

    def header(self, name: str) -> Any:
        return self.headers.get(name)

    @property
    def delivery_count(self) -> int | None:
        return H.delivery_count_of(self.headers) if H.DELIVERY_COUNT in self.headers else None

    @property
    def group(self) -> str | None:
        """Its failure group id (``x-dlq-group``); None for a letter written without one."""
        value = self.header(H.GROUP)
        return value if isinstance(value, str) and value else None

    @property
    def replay_count(self) -> int:
        value = self.headers.get(H.REPLAY_COUNT)
        return value if isinstance(value, int) and value > 0 else 0

    @property
    def dead_lettered_at(self) -> float | None:
        return self.decoded.dead_lettered_at

    @property
    def body(self) -> bytes:
        """The message body; for an element that is no kombu message (a quarantined one), the element itself."""
        return self.decoded.body if self.message else bytes(self.raw)

    @property
    def content_type(self) -> str:
        return self.decoded.content_type or "application/data"

    def arguments(self) -> tuple[list, dict] | None:
        """``(args, kwargs)``, only when ``accept_content`` allows the content type, else None.

        A content type outside ``accept`` (pickle, by default) is never handed
        to a deserializer: listing a DLQ must not run code an attacker queued.
        """
        body = self._task_body
        return None if body is None else task_arguments(body)

    @cached
    def _task_body(self) -> Any:
        """The decoded body when ``accept_content`` allows its content type; None otherwise or undecodable."""
        if self.content_type not in self.accept:
            return None
        try:
            return loads(self.body, self.content_type, self.decoded.content_encoding, accept=self.accept)
        except Exception:  # undecodable or not a task body: shown raw
            return None

    def workflow(self) -> dict | None:
        """The chord and/or chain it belongs to (:func:`celery_dlq.workflow.membership`); None when none."""
        body = self._task_body
        embed = body[2] if isinstance(body, (list, tuple)) and len(body) > 2 else None
        return membership(self.headers, embed)

    def as_dict(self) -> dict:
        arguments = self.arguments()
        return {
            "task_id": self.task_id, "task_name": self.task_name, "dead_letter_queue": self.queue,
            "original_queue": self.header(H.ORIGINAL_QUEUE), "reason": self.header(H.REASON),
            "delivery_count": self.delivery_count, "exception_type": self.header(H.EXCEPTION_TYPE),
            "exception_message": self.header(H.EXCEPTION_MESSAGE), "dead_lettered_at": self.dead_lettered_at,
            "worker": self.header(H.WORKER), "replay_count": self.replay_count, "group": self.group,
            "priority": self.properties.get("priority"), "content_type": self.content_type, "size": len(self.raw),
            "decoded": arguments is not None, "args": arguments[0] if arguments else None,
            "kwargs": arguments[1] if arguments else None,
            "body": None if arguments else base64.b64encode(self.body).decode("ascii"),
            "headers": H.dlq_headers(self.headers), "workflow": self.workflow(),
        }

    def target(self, to: str | None) -> tuple[str, str, str] | None:
        """``(queue, exchange, routing_key)`` a replay delivers to; None when unknown."""
        if to:
            return to, "", to
        queue = self.header(H.ORIGINAL_QUEUE)
        if not queue:
            return None
        return queue, self.header(H.ORIGINAL_EXCHANGE) or "", self.header(H.ORIGINAL_ROUTING_KEY) or queue

    def replayed(self, exchange: str, routing_key: str, now: float, tag: str | None = None) -> dict:
        """The message to deliver: delivery count reset, ``x-dlq-*`` history kept, replay noted.

        ``tag`` is its new delivery tag (:func:`~celery_dlq.message.delivery_tags`); a new uuid4 by default.
        """
        headers = dict(self.headers)
        headers.pop(H.DELIVERY_COUNT, None)
        if "task" in headers:  # Celery protocol 2: task.request.retries starts over too
            headers["retries"] = 0
        headers[H.REPLAYED_AT] = now
        headers[H.REPLAY_COUNT] = self.replay_count + 1
        properties = dict(self.properties, delivery_tag=tag or uuid(),
                          delivery_info={"exchange": exchange, "routing_key": routing_key})
        return dict(self.message, headers=headers, properties=properties)


class Selector(Protocol):
    """What a DLQ operation asks of a selection: :class:`Filter`, :class:`TaskIds`, or your own.

    ``matches`` is asked of each dead letter once per pass, oldest first, and
    only until the operation's ``limit`` is reached. A selection that must
    remember what a pass took (the oldest letter of each id, once) offers
    ``start()``, which gives a new matcher for each pass (:func:`one_pass`):
    the selection itself stays a value and can be used again.
    """

    def matches(self, letter: DeadLetter) -> bool: ...


def one_pass(where: Selector | None) -> Selector | None:
    """The matcher of one pass over a DLQ: ``where.start()`` when it has one, else ``where`` itself."""
    start = getattr(where, "start", None)
    return start() if callable(start) else where


@dataclass(frozen=True)
class Filter:
    """Which dead letters an operation selects; unset fields select everything.

    ``task_name`` is a wildcard pattern (``proj.*``, ``orders.#``);
    ``exception_type`` matches the full name or its last part (``ValueError``);
    ``since``/``until`` bound ``x-dlq-dead-lettered-at`` (unix seconds);
    ``text`` is a case-insensitive substring of the exception message;
    ``group`` a failure group id (``x-dlq-group``; ``celery dlq groups``).
    """

    task_id: str | None = None
    task_name: str | None = None
    reason: str | None = None
    exception_type: str | None = None
    original_queue: str | None = None
    since: float | None = None
    until: float | None = None
    text: str | None = None
    group: str | None = None
    _pattern: Pattern | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.task_name is not None:  # a bad pattern fails now, not per message
            object.__setattr__(self, "_pattern", Pattern.parse(self.task_name, "task name filter"))

    def needle(self) -> str | None:
        """Text every matching letter's stored JSON holds, for a search inside Redis to pass over the rest
        (candidates are still checked with :meth:`matches`); None when no field gives one."""
        for value, quoted in ((self.group, False), (self.task_id, False), (self.task_name, True),
                              (self.exception_type, False), (self.original_queue, True), (self.reason, True)):
            if value and value.isascii() and value.isprintable() and not set(value) & set('"\\*#/'):
                return f'"{value}"' if quoted else value
        return None

    def matches(self, letter: DeadLetter) -> bool:
        at = letter.dead_lettered_at
        exc_type = letter.header(H.EXCEPTION_TYPE) or ""
        return all((
            self.task_id is None or letter.task_id == self.task_id,
            self._pattern is None or self._pattern.matches(letter.task_name or ""),
            self.reason is None or letter.header(H.REASON) == self.reason,
            self.exception_type is None or exc_type == self.exception_type
            or exc_type.endswith("." + self.exception_type),
            self.original_queue is None or letter.header(H.ORIGINAL_QUEUE) == self.original_queue,
            self.since is None or (at is not None and at >= self.since),
            self.until is None or (at is not None and at < self.until),
            self.text is None or self.text.lower() in str(letter.header(H.EXCEPTION_MESSAGE) or "").lower(),
            self.group is None or letter.group == self.group,
        ))


@dataclass(frozen=True, init=False)
class TaskIds:
    """Selects dead letters by task id, a whole set of ids in one pass over a DLQ: a value, used as often as liked.

    One ``Filter(task_id=...)`` per id would read the DLQ once per id, and a
    replay's ``rate`` would pace nothing (each call moving one message); this
    selects them all while the DLQ is read once, oldest first.

    In a pass (:meth:`start`, which every DLQ operation takes) it selects the
    oldest dead letter of each id, once: what a replay by id moves, since two
    copies of one task would run it twice. With ``every=True`` it selects
    every dead letter of each id: what a purge by id deletes. ``where``, when
    given, must match too (a dead letter of a listed id that ``where`` rejects
    does not use up its id). The ids a pass did not select are reported by
    the operation (``Outcome.not_found``) or by :meth:`missing_from`.
    """

    ids: tuple[str, ...]
    where: Filter | None
    every: bool

    def __init__(self, ids: Iterable[str], where: Filter | None = None, *, every: bool = False) -> None:
        object.__setattr__(self, "ids", tuple(dict.fromkeys(ids)))   # in order, each once
        object.__setattr__(self, "where", where)
        object.__setattr__(self, "every", every)

    def __len__(self) -> int:
        return len(self.ids)

    def matches(self, letter: DeadLetter) -> bool:
        """Whether ``letter`` is of one of the ids and ``where`` matches it (any copy: :meth:`start` keeps one)."""
        return letter.task_id in self.ids and (self.where is None or self.where.matches(letter))

    def start(self) -> IdPass:
        """The matcher of one pass: the oldest letter of each id once (every letter with ``every``)."""
        return IdPass(self)

    def missing_from(self, letters: Iterable[DeadLetter]) -> list[str]:
        """The ids none of ``letters`` has, in the order given."""
        found = {letter.task_id for letter in letters}
        return [task_id for task_id in self.ids if task_id not in found]


class IdPass:
    """One pass of a :class:`TaskIds`: what it took so far, and the ids it has not (:attr:`missing`)."""

    def __init__(self, ids: TaskIds) -> None:
        self.ids = ids
        self._left: dict[str | None, None] = dict.fromkeys(ids.ids)

    def matches(self, letter: DeadLetter) -> bool:
        task_id = letter.task_id
        if task_id not in (self.ids.ids if self.ids.every else self._left):
            return False
        if self.ids.where is not None and not self.ids.where.matches(letter):
            return False
        self._left.pop(task_id, None)
        return True

    @property
    def missing(self) -> list[str]:
        """Ids not selected (yet): after a pass, those that were not there or not matched by ``where``."""
        return [task_id for task_id in self._left if task_id is not None]
