"""The operator API over dead-letter queues and parked retries (what ``celery dlq`` runs).

Small objects addressed by name and id, as Sidekiq's ``DeadSet``/``RetrySet``:
:class:`Operator` (one app) gives :class:`DeadLetterQueue` (one DLQ: list,
show, replay, purge) and :class:`ParkedRetries` (the delayed store: list,
redeliver now, delete).

Dead letters live on the broker, in the Redis lists kombu uses for the queue
``DLQ.<queue>`` (one per priority step), as kombu's JSON. They are read a
page at a time from the oldest end and never deserialized unless the app's
``accept_content`` allows their content type. A replay rewrites each message
and moves it with one Lua script (remove this exact element from the DLQ,
push the copy onto the target queue), so a replay interrupted anywhere and
run again delivers every message once. Only a Redis broker is supported.
"""
from __future__ import annotations

import base64
import time
from bisect import bisect
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import redis
from kombu.serialization import loads, prepare_accept_content
from kombu.utils import json
from kombu.utils.url import maybe_sanitize_url
from kombu.utils.uuid import uuid

from celery_dlq import events
from celery_dlq import headers as H
from celery_dlq.envelope import Envelope
from celery_dlq.errors import DLQError
from celery_dlq.keys import Keys, Scripts
from celery_dlq.matching import Pattern
from celery_dlq.policy import RedeliveryPolicy
from celery_dlq.settings import REDIS_SCHEMES
from celery_dlq.store import DelayedStore

#: kombu's Redis transport: priority sub-lists are ``name + SEP + step``.
SEP = "\x06\x16"
PRIORITY_STEPS = (0, 3, 6, 9)
#: Dead letters read per LRANGE (and moved per pipeline).
PAGE = 500
STAT_REPLAYED, STAT_PURGED = "replayed", "purged"


class BrokerNotSupported(DLQError):
    """Dead letters are read from the broker's Redis lists: other brokers have none."""


class UnknownQueue(DLQError):
    """No dead-letter queue by that name exists or is configured."""


class ForceRequired(DLQError):
    """A destructive operation was asked for without ``force=True``."""


def connect(url: str) -> redis.Redis:
    """A bytes client that fails fast: an operator wants an error, not a hang."""
    if url.startswith("redis+socket://"):
        url = "unix://" + url[len("redis+socket://"):]
    return redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=30)


def broker_url(app: Any) -> str:
    """The broker URL, when it is Redis; else :class:`BrokerNotSupported`."""
    url = app.conf.broker_write_url or app.conf.broker_url
    if isinstance(url, (list, tuple)):
        url = url[0] if url else None
    url = url.split(";")[0].strip() if isinstance(url, str) else url
    if not (isinstance(url, str) and url.startswith(REDIS_SCHEMES)):
        shown = maybe_sanitize_url(url) if isinstance(url, str) else "amqp:// (Celery's default)"
        raise BrokerNotSupported(f"dead letters can only be managed on a Redis broker; the broker is {shown}")
    return url


@dataclass(frozen=True)
class QueueLists:
    """Where kombu's Redis transport keeps a queue: a LIST per priority step."""

    global_keyprefix: str = ""
    steps: tuple[int, ...] = PRIORITY_STEPS
    sep: str = SEP

    def keys(self, queue: str) -> list[str]:
        """Every list of ``queue``, priority 0 first; ``LLEN`` of the first alone undercounts."""
        return [self.key(queue, step) for step in self.steps]

    def key(self, queue: str, priority: Any = 0) -> str:
        """The list kombu pushes a message of ``priority`` onto (as ``Channel._q_for_pri``)."""
        try:
            priority = min(max(int(priority), 0), 9)
        except (TypeError, ValueError):
            priority = 0
        step = self.steps[max(bisect(self.steps, priority) - 1, 0)]
        return self.global_keyprefix + (f"{queue}{self.sep}{step}" if step else queue)

    def queue_of(self, key: str) -> str:
        key = key[len(self.global_keyprefix):] if key.startswith(self.global_keyprefix) else key
        return key.rsplit(self.sep, 1)[0]


def queue_lists(app: Any, global_keyprefix: str) -> QueueLists:
    """The lists of the app's broker, with its ``priority_steps``/``sep`` transport options."""
    options = app.conf.broker_transport_options or {}
    return QueueLists(global_keyprefix, tuple(options.get("priority_steps") or PRIORITY_STEPS),
                      options.get("sep") or SEP)


def broker_client(app: Any, client: Any, redis_url: str) -> Any:
    """A client on the broker's Redis: ``client`` itself when it is ``redis_url``'s and that is the broker."""
    url = broker_url(app)
    return client if url == redis_url else connect(url)


@dataclass(frozen=True)
class DeadLetter:
    """One dead letter exactly as stored; ``message`` is kombu's JSON, {} if it is not JSON."""

    queue: str
    key: str
    raw: bytes
    message: dict
    accept: frozenset = frozenset()

    @classmethod
    def parse(cls, queue: str, key: str, raw: bytes, accept: frozenset) -> DeadLetter:
        try:
            message = json.loads(raw)
        except ValueError:
            message = None
        return cls(queue, key, raw, message if isinstance(message, dict) else {}, accept)

    @property
    def headers(self) -> dict:
        return self.message.get("headers") or {}

    @property
    def properties(self) -> dict:
        return self.message.get("properties") or {}

    @property
    def task_id(self) -> str | None:
        return self.headers.get("id") or self.properties.get("correlation_id")

    @property
    def task_name(self) -> str | None:
        return self.headers.get("task")

    def header(self, name: str) -> Any:
        return self.headers.get(name)

    @property
    def delivery_count(self) -> int | None:
        return H.delivery_count_of(self.headers) if H.DELIVERY_COUNT in self.headers else None

    @property
    def replay_count(self) -> int:
        value = self.headers.get(H.REPLAY_COUNT)
        return value if isinstance(value, int) and value > 0 else 0

    @property
    def dead_lettered_at(self) -> float | None:
        value = self.headers.get(H.DEAD_LETTERED_AT)
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def body(self) -> bytes:
        body = self.message.get("body") or ""
        body = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        if self.properties.get("body_encoding") == "base64":
            try:
                return base64.b64decode(body, validate=True)
            except ValueError:
                pass  # not what it claims: show it as stored
        return body

    @property
    def content_type(self) -> str:
        return self.message.get("content-type") or "application/data"

    def arguments(self) -> tuple[list, dict] | None:
        """``(args, kwargs)``, only when ``accept_content`` allows the content type, else None.

        A content type outside ``accept`` (pickle, by default) is never handed
        to a deserializer: listing a DLQ must not run code an attacker queued.
        """
        if self.content_type not in self.accept:
            return None
        try:
            body = loads(self.body, self.content_type, self.message.get("content-encoding"), accept=self.accept)
            if isinstance(body, (list, tuple)) and len(body) >= 2:   # protocol 2: [args, kwargs, embed]
                return list(body[0] or ()), dict(body[1] or {})
            if isinstance(body, dict) and "args" in body:            # protocol 1
                return list(body.get("args") or ()), dict(body.get("kwargs") or {})
        except Exception:  # undecodable or not a task body: shown raw
            pass
        return None

    def as_dict(self) -> dict:
        arguments = self.arguments()
        return {
            "task_id": self.task_id, "task_name": self.task_name, "dead_letter_queue": self.queue,
            "original_queue": self.header(H.ORIGINAL_QUEUE), "reason": self.header(H.REASON),
            "delivery_count": self.delivery_count, "exception_type": self.header(H.EXCEPTION_TYPE),
            "exception_message": self.header(H.EXCEPTION_MESSAGE), "dead_lettered_at": self.dead_lettered_at,
            "worker": self.header(H.WORKER), "replay_count": self.replay_count,
            "priority": self.properties.get("priority"), "content_type": self.content_type, "size": len(self.raw),
            "decoded": arguments is not None, "args": arguments[0] if arguments else None,
            "kwargs": arguments[1] if arguments else None,
            "body": None if arguments else base64.b64encode(self.body).decode("ascii"),
            "headers": H.dlq_headers(self.headers),
        }

    def target(self, to: str | None) -> tuple[str, str, str] | None:
        """``(queue, exchange, routing_key)`` a replay delivers to; None when unknown."""
        if to:
            return to, "", to
        queue = self.header(H.ORIGINAL_QUEUE)
        if not queue:
            return None
        return queue, self.header(H.ORIGINAL_EXCHANGE) or "", self.header(H.ORIGINAL_ROUTING_KEY) or queue

    def replayed(self, exchange: str, routing_key: str, now: float) -> dict:
        """The message to deliver: delivery count reset, ``x-dlq-*`` history kept, replay noted."""
        headers = dict(self.headers)
        headers.pop(H.DELIVERY_COUNT, None)
        if "task" in headers:  # Celery protocol 2: task.request.retries starts over too
            headers["retries"] = 0
        headers[H.REPLAYED_AT] = now
        headers[H.REPLAY_COUNT] = self.replay_count + 1
        properties = dict(self.properties, delivery_tag=uuid(),
                          delivery_info={"exchange": exchange, "routing_key": routing_key})
        return dict(self.message, headers=headers, properties=properties)


@dataclass(frozen=True)
class Filter:
    """Which dead letters an operation selects; unset fields select everything.

    ``task_name`` is a wildcard pattern (``proj.*``, ``orders.#``);
    ``exception_type`` matches the full name or its last part (``ValueError``);
    ``since``/``until`` bound ``x-dlq-dead-lettered-at`` (unix seconds);
    ``text`` is a case-insensitive substring of the exception message.
    """

    task_id: str | None = None
    task_name: str | None = None
    reason: str | None = None
    exception_type: str | None = None
    original_queue: str | None = None
    since: float | None = None
    until: float | None = None
    text: str | None = None
    _pattern: Pattern | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.task_name is not None:  # a bad pattern fails now, not per message
            object.__setattr__(self, "_pattern", Pattern.parse(self.task_name, "task name filter"))

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
        ))


@dataclass
class Outcome:
    """What a replay or purge did; ``missing`` ones were gone (moved by someone else) when reached."""

    matched: int = 0
    done: int = 0
    missing: int = 0
    failed: list[str] = field(default_factory=list)
    targets: Counter = field(default_factory=Counter)
    dry_run: bool = False


class _Pages:
    """Oldest-first pages of lists being changed: add to ``removed`` what you took from the last page.

    A page is counted from the right (oldest) end, so messages added at the
    left meanwhile never shift it; removals do, and are subtracted.
    """

    def __init__(self, client: Any, keys: list[str], batch: int) -> None:
        self.client, self.keys, self.batch, self.removed = client, keys, batch, 0

    def __iter__(self) -> Iterator[tuple[str, list[bytes]]]:
        for key in self.keys:
            seen = self.removed = 0
            while True:
                skip = seen - self.removed
                raw = self.client.lrange(key, -(skip + self.batch), -(skip + 1))
                if not raw:
                    break
                seen += len(raw)
                yield key, raw[::-1]
                if len(raw) < self.batch:
                    break


class DeadLetterQueue:
    """One DLQ (Sidekiq's ``DeadSet``): iterate, show, replay, purge."""

    def __init__(self, operator: Operator, name: str) -> None:
        self.op, self.name = operator, name
        self.sleep: Callable[[float], None] = time.sleep
        self.monotonic: Callable[[], float] = time.monotonic

    def __repr__(self) -> str:
        return f"DeadLetterQueue({self.name!r})"

    def depth(self) -> int:
        return self.op.depth(self.name)

    def _selected(self, pages: _Pages, where: Filter | None, limit: int | None) -> Iterator[list[DeadLetter]]:
        left = limit
        for key, raws in pages:
            letters = [DeadLetter.parse(self.name, key, raw, self.op.accept) for raw in raws]
            letters = [letter for letter in letters if where is None or where.matches(letter)][:left]
            if left is not None:
                left -= len(letters)
            if letters:
                yield letters
            if left == 0:
                return

    def entries(self, where: Filter | None = None, limit: int | None = None,
                batch: int = PAGE) -> Iterator[DeadLetter]:
        """Matching dead letters, oldest first (priority 0 first), ``batch`` per round trip. Not a snapshot."""
        for letters in self._selected(_Pages(self.op.broker, self.op.lists.keys(self.name), batch), where, limit):
            yield from letters

    def get(self, task_id: str) -> DeadLetter | None:
        return next(self.entries(Filter(task_id=task_id), limit=1), None)

    def replay(self, where: Filter | None = None, *, to: str | None = None, limit: int | None = None,
               rate: float | None = None, dry_run: bool = False,
               progress: Callable[[int], None] | None = None, batch: int = PAGE) -> Outcome:
        """Move matching dead letters back to their original queue (or ``to``), oldest first.

        ``rate`` caps messages per second. Each message moves atomically
        (see ``lua/replay_move.lua``); run it again after an interruption.
        """
        if rate is not None and not rate > 0:
            raise ValueError(f"rate must be > 0 messages/s, got {rate!r}")
        if to == self.name:  # each moved message would come round again: it would never end
            raise ValueError(f"cannot replay {self.name} into itself")
        out, started = Outcome(dry_run=dry_run), self.monotonic()
        pages = _Pages(self.op.broker, self.op.lists.keys(self.name), batch)
        for letters in self._selected(pages, where, limit):
            out.matched += len(letters)
            for chunk in ([[letter] for letter in letters] if rate else [letters]):
                if rate:
                    self.sleep(max(0.0, started + (out.done + out.missing) / rate - self.monotonic()))
                pages.removed += self._move(chunk, to, out)
                if progress:
                    progress(len(chunk))
        return out

    def _move(self, letters: list[DeadLetter], to: str | None, out: Outcome) -> int:
        """Move ``letters``; returns how many left the list (moved here, or gone already)."""
        now, plans = self.op.clock(), []
        for letter in letters:
            target = letter.target(to) if letter.message else None
            if target is None:
                why = "not a kombu message" if not letter.message else "no x-dlq-original-queue header; use to="
                out.failed.append(f"{letter.task_id or '<unknown id>'}: {why}")
                continue
            queue, exchange, routing_key = target
            plans.append((letter, queue, self.op.lists.key(queue, letter.properties.get("priority")),
                          json.dumps(letter.replayed(exchange, routing_key, now))))
        if out.dry_run or not plans:
            out.targets.update(queue for _, queue, _, _ in plans)
            return 0
        self.op.forget([plan[0] for plan in plans])
        pipe = self.op.broker.pipeline(transaction=False)
        script = self.op.scripts.get("replay_move")
        for letter, _, target_key, payload in plans:
            script(keys=[letter.key, target_key], args=[letter.raw, payload], client=pipe)
        moved = pipe.execute()
        for (_, queue, _, _), ok in zip(plans, moved):
            out.targets[queue] += 1 if ok else 0
        out.done += sum(moved)
        out.missing += len(plans) - sum(moved)
        self.op.count(STAT_REPLAYED, sum(moved))
        events.replayed(self.op, [plan[0] for plan, ok in zip(plans, moved) if ok], dlq=self.name, now=now)
        return len(plans)

    def purge(self, where: Filter | None = None, *, force: bool = False, limit: int | None = None,
              progress: Callable[[int], None] | None = None, batch: int = PAGE) -> Outcome:
        """Delete matching dead letters for good; without ``force=True`` nothing is deleted."""
        if not force:
            raise ForceRequired(f"purging {self.name} deletes dead letters for good: pass force=True")
        out = Outcome()
        if where is None and limit is None and not events.log_of(self.op).enabled:
            # Nothing to archive: delete the lists whole. With the archive on,
            # each letter is read and removed (below) so its `purged` event is
            # written and a letter arriving meanwhile is never deleted unseen.
            keys = self.op.lists.keys(self.name)
            pipe = self.op.broker.pipeline(transaction=True)
            for key in keys:
                pipe.llen(key)
            pipe.delete(*keys)
            out.matched = out.done = sum(pipe.execute()[:-1])
        else:
            pages = _Pages(self.op.broker, self.op.lists.keys(self.name), batch)
            for letters in self._selected(pages, where, limit):
                pipe = self.op.broker.pipeline(transaction=False)
                for letter in letters:
                    pipe.lrem(letter.key, -1, letter.raw)
                results = pipe.execute()
                removed = sum(results)
                events.purged(self.op, [letter for letter, n in zip(letters, results) if n], dlq=self.name)
                out.matched += len(letters)
                out.done += removed
                out.missing += len(letters) - removed
                pages.removed += len(letters)
                if progress:
                    progress(len(letters))
        self.op.count(STAT_PURGED, out.done)
        return out


@dataclass(frozen=True)
class ParkedRetry:
    """A retry waiting in the delayed store; ``delivery_count`` is the delivery it will be."""

    entry_id: str
    queue: str
    due: float | None
    lease_until: float | None
    task_id: str | None
    task_name: str | None
    delivery_count: int | None
    last_exception: str | None

    @classmethod
    def from_entry(cls, entry: Any) -> ParkedRetry:
        try:
            envelope = Envelope.loads(entry.payload)
        except (ValueError, KeyError, TypeError):
            return cls(entry.entry_id, entry.queue, entry.due, entry.lease_until, None, None, None, None)
        return cls(entry.entry_id, entry.queue, entry.due, entry.lease_until, envelope.task_id,
                   envelope.task_name, H.delivery_count_of(envelope.headers),
                   envelope.headers.get(H.LAST_EXCEPTION))

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class ParkedRetries:
    """The delayed store as an operator sees it (Sidekiq's ``RetrySet``), by entry or task id."""

    def __init__(self, store: DelayedStore) -> None:
        self.store = store

    def entries(self, queue: str | None = None, limit: int | None = None) -> Iterator[ParkedRetry]:
        for n, entry in enumerate(self.store.entries(queue)):
            if limit is not None and n >= limit:
                return
            yield ParkedRetry.from_entry(entry)

    def find(self, ident: str) -> list[str]:
        """Entry ids for an entry id, or for every entry of a task id."""
        if self.store.get(ident) is not None:
            return [ident]
        return [retry.entry_id for retry in self.entries() if retry.task_id == ident]

    def redeliver_now(self, ident: str | None = None) -> int:
        """Make one entry (or a task's entries), or every parked entry, due now."""
        if ident is None:
            return self.store.redeliver_now()
        return sum(self.store.redeliver_now(entry_id) for entry_id in self.find(ident))

    def delete(self, ident: str, *, force: bool = False) -> int:
        """Delete a parked retry (or a task's) for good: its message is gone, so ``force=True`` is required."""
        if not force:
            raise ForceRequired(f"deleting parked retry {ident!r} loses the message: pass force=True")
        return sum(self.store.remove(entry_id) for entry_id in self.find(ident))


@dataclass(frozen=True)
class QueueInfo:
    """One DLQ (``name``; None for a queue whose dead letters are dropped) and its queue."""

    name: str | None
    queue: str | None
    dead_letters: int
    parked: int

    def as_dict(self) -> dict:
        return {"name": self.name, "queue": self.queue, "dead_letters": self.dead_letters, "parked": self.parked}


class Operator:
    """The operator's view of one app: its DLQs, parked retries and counters.

    ``broker`` (the broker's Redis) and ``client`` (``dlq_redis_url``) may be
    given, as tests do; by default they are connected on first use, so the
    parked-retry half works even when the broker is not Redis.
    """

    def __init__(self, app: Any, *, broker: Any = None, client: Any = None,
                 clock: Callable[[], float] = time.time) -> None:
        from celery_dlq.extension import get_dlq

        self.app, self.clock, self._broker, self._scripts = app, clock, broker, None
        self.settings = get_dlq(app).settings
        self.lists = queue_lists(app, self.settings.global_keyprefix)
        self.client = client if client is not None else connect(self.settings.redis_url)
        self.keys = Keys(self.settings.key_prefix, self.settings.global_keyprefix)
        self.parked = ParkedRetries(DelayedStore(self.client, self.keys, clock=clock))
        self.accept = frozenset(prepare_accept_content(app.conf.accept_content))

    @property
    def broker(self) -> Any:
        """The broker's Redis, where DLQs are lists; :class:`BrokerNotSupported` on another broker."""
        if self._broker is None:
            self._broker = broker_client(self.app, self.client, self.settings.redis_url)
        return self._broker

    @property
    def scripts(self) -> Scripts:
        if self._scripts is None:
            self._scripts = Scripts(self.broker)
        return self._scripts

    def depth(self, name: str) -> int:
        """Dead letters in ``name``, every priority sub-list counted."""
        pipe = self.broker.pipeline(transaction=False)
        for key in self.lists.keys(name):
            pipe.llen(key)
        return sum(pipe.execute())

    def dlq_of(self, queue: str) -> str | None:
        """The DLQ of ``queue`` under its queue-level policy; None when dead letters are dropped."""
        return self.settings.policy_for("", queue).dead_letter_queue(queue)

    def queue(self, name: str) -> DeadLetterQueue:
        """The DLQ ``name``, or the DLQ of queue ``name``; :class:`UnknownQueue` if neither exists.

        A name counts when it is configured, or shaped like a DLQ and present
        in Redis: never a live queue, and no SCAN unless it is unknown.
        """
        shapes, configured = self._configured(self.parked.store.counts_by_queue())
        for candidate in (name, self.dlq_of(name)):
            if candidate in configured or (_shaped(candidate, shapes) and self.depth(candidate)):
                return DeadLetterQueue(self, candidate)
        known = self.known()
        raise UnknownQueue(f"unknown dead-letter queue {name!r}"
                           + (f" (known: {', '.join(sorted(known))})" if known else " (there are none)"))

    def queues(self) -> list[QueueInfo]:
        """Every DLQ found or configured, with its depth and the parked retries of its queues."""
        by_queue = self.parked.store.counts_by_queue()
        parked = Counter()
        for queue, n in by_queue.items():
            parked[self.dlq_of(queue)] += n
        rows = [QueueInfo(name, origin, self.depth(name), parked[name])
                for name, origin in sorted(self.known(by_queue).items())]
        rows += [QueueInfo(None, queue, 0, n) for queue, n in sorted(by_queue.items()) if self.dlq_of(queue) is None]
        return rows

    def known(self, queues: Any = ()) -> dict[str, str | None]:
        """DLQ name -> its queue (None when shared), named in the configuration or found by SCAN."""
        shapes, known = self._configured(queues)
        for prefix, suffix in shapes:
            match = self.lists.global_keyprefix + _glob(prefix) + "*" + _glob(suffix)
            for key in self.broker.scan_iter(match=match, count=1000, _type="list"):
                name = self.lists.queue_of(key.decode("utf-8", "replace"))
                if _shaped(name, [(prefix, suffix)]):
                    known.setdefault(name, name[len(prefix):len(name) - len(suffix)])
        return known

    def _configured(self, queues: Any = ()) -> tuple[set[tuple[str, str]], dict[str, str | None]]:
        """DLQ shapes, and the DLQs named by policies or serving declared or parked-for queues."""
        shapes, known = self._dlq_shapes()
        for queue in [*self.app.amqp.queues, *queues]:
            dlq = self.dlq_of(queue)
            if dlq:
                known.setdefault(dlq, queue)
        return shapes, known

    def _dlq_shapes(self) -> tuple[set[tuple[str, str]], dict[str, str | None]]:
        """(prefix, suffix) pairs and named DLQs from every configured policy layer."""
        base = RedeliveryPolicy()
        layers = [self.settings.default_policy]
        layers += [fields for _, fields in self.settings.task_policies.items + self.settings.queue_policies.items]
        layers += [getattr(task, "redelivery_policy", None) or {} for task in list(self.app.tasks.values())]
        shapes, named = {(base.dead_letter_queue_prefix, base.dead_letter_queue_suffix)}, {}
        for fields in layers:
            fields = fields.as_fields() if isinstance(fields, RedeliveryPolicy) else fields
            if isinstance(fields.get("dead_letter"), str):
                named[fields["dead_letter"]] = None
            shapes.add((fields.get("dead_letter_queue_prefix", base.dead_letter_queue_prefix),
                        fields.get("dead_letter_queue_suffix", base.dead_letter_queue_suffix)))
        return {s for s in shapes if s[0] or s[1]}, named

    def stats(self) -> dict[str, int]:
        """The ``stats`` counters, plus what is parked and dead-lettered right now."""
        counters = {k.decode(): int(v) for k, v in self.client.hgetall(self.keys.stats).items()}
        counters["parked_now"] = self.parked.store.count()
        counters["dead_letters_now"] = sum(info.dead_letters for info in self.queues())
        return dict(sorted(counters.items()))

    def forget(self, letters: list[DeadLetter]) -> None:
        """Delete the delivery counters and dead-letter audit of messages about to be replayed.

        Otherwise the replayed copy would start at the old count, and failing
        again at the same delivery it would meet a ``done`` audit and be
        acknowledged as "already dead-lettered": lost. Idempotent, and done
        before the move, so an interruption in between loses nothing.
        """
        pipe = self.client.pipeline(transaction=False)
        for letter in letters:
            task_id, tag = letter.task_id, letter.properties.get("delivery_tag")
            if task_id:
                pipe.delete(self.keys.delivery_count(task_id), self.keys.delivery_count(f"{task_id}:{tag}"),
                            self.keys.audit(task_id, letter.delivery_count or 1))
        pipe.execute()

    def count(self, stat: str, n: int) -> None:
        if n:
            self.client.hincrby(self.keys.stats, stat, n)


def _shaped(name: str | None, shapes: Any) -> bool:
    """Whether ``name`` is ``prefix + queue + suffix`` for one of ``shapes``."""
    return bool(name) and any(name.startswith(p) and name.endswith(s) and len(name) > len(p) + len(s)
                              for p, s in shapes)


def _glob(text: str) -> str:
    """``text`` with Redis glob characters escaped, for SCAN MATCH."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
