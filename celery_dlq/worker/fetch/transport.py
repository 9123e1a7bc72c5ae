"""celery-dlq's Redis transport: kombu's, with a fetch that never loses a message and never kills a worker.

kombu's Redis transport pops a message with ``BRPOP`` and records it as
unacknowledged in a second round trip, and builds its ``Message`` before any
Celery or celery-dlq code can catch an error. So a message popped but not yet
recorded is lost when the worker dies or Redis restarts in between, and a
list element that is not a kombu message kills the worker. This transport
changes the fetch only (publishing and everything else are kombu's):

* **Fetch in one step** (``redis/lua/fetch.lua``): pop the next element of
  the worker's queues in kombu's priority order and, in the same script,
  record it as this process's, in flight (:mod:`celery_dlq.storage.inflight`).
  An element that is not a kombu envelope goes to its queue's quarantine
  list in that step. Nothing popped is ever only in memory.
* **Leases, not a visibility timeout.** A process's in-flight messages are
  its own while it beats (:mod:`celery_dlq.worker.leader.inflight`); when it has
  been silent for ``dlq_inflight_lease`` they go back to their lists, marked
  so that the next fetch counts the delivery. kombu's ``unacked`` hash and
  its visibility-timeout restore never see them, so a long task never runs
  twice; acknowledging removes the tag from this process's own hash only,
  so a worker that comes back late settles nothing of another's.
* **Validate before kombu sees it** (:func:`celery_dlq.message.envelope_error`):
  what cannot become a task message (not JSON, not an object, no properties,
  a body that is not valid base64, headers that are not an object, a
  protocol-2 message without an ``id``, ...) is moved *raw*, byte for byte,
  to the DLQ of its queue (reason ``invalid_message``, the parse error in
  ``x-dlq-exception-message``) in one script, with one WARNING
  (:mod:`celery_dlq.worker.fetch.rejects`).
* **Wait without taking, one worker woken per message.** A script cannot
  block, so when every list is empty the channel blocks (``BZPOPMIN``) on its queues' wake markers, which
  the fetch listener (one thread, in the worker holding the mover lease: :mod:`celery_dlq.worker.fetch.listener`)
  writes when a queue's lists hold a message: one message wakes one idle worker, as kombu's ``BRPOP`` does.
  The wait's timeout is only a safety net (:data:`MARKER_WAIT`). Where no listener hears all of its queues
  (none yet, one that died, ``dlq_fetch_listener = False``, a server refusing client tracking) the fetch says
  so and the channel waits with ``BLMOVE q q RIGHT RIGHT <dlq_fetch_wait>`` on the main list of one of its
  queues (a no-op move that wakes as soon as a message arrives there); other lists' messages wait that long.
* **Move what came due first, hold what a breaker holds.** Where the broker is the store, the fetch
  first moves due parked retries bound for its lists (:mod:`celery_dlq.worker.fetch.moves`), and keeps
  in Redis, unseen by the worker, a delivery an open circuit breaker holds (:mod:`celery_dlq.worker.features.breaker`).
* **Recover on reconnect and restart.** Tags this process fetched but no
  live channel of it holds (a reply lost with the connection, a channel
  closed while Redis was down) are given back to their queues when the next
  channel starts, and so are those of earlier runs of this worker on this
  host whose process is gone: a restart waits for no lease.
* **Close never crashes.** kombu's restore of unacked messages at close can raise on a broken
  connection: logged, they stay recorded for the recovery above.
"""
from __future__ import annotations

import logging
import random
import time
from typing import Any

import redis
from kombu.exceptions import InconsistencyError
from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads
from kombu.utils.uuid import uuid

from celery_dlq.element import envelope_error
from celery_dlq.internals.kombu_redis import (
    bounded_wait,
    consume_order,
    deliver,
    flush_reauth,
    forget_held,
    forget_settled,
    health_window,
    held_tags,
    hold_in_memory,
    list_key,
    longest_wait,
    rotate,
    set_in_poll,
)
from celery_dlq.storage.dlq import DeadLetterLists
from celery_dlq.storage.fetch import FetchCommands, FetchLayout
from celery_dlq.storage.inflight import InFlight
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.scripts import Scripts
from celery_dlq.worker.fetch.rejects import Rejects
from celery_dlq.worker.fetch.setup import FetchContext, context_of
from celery_dlq.worker.leader import inflight as process

logger = logging.getLogger(__name__)

# -- how an idle fetch waits: its states, its timeouts, its log line (pure) ------------------------------

#: The longest idle wait on the wake markers (seconds): only a safety net, the listener ends it. Kept below
#: kombu's health check of a blocked fetch (``brpop_timeout + health_check_interval``, 26 s by default).
#: Each wait is U(0.5, 1) of it, so workers that went idle together do not time out together.
MARKER_WAIT = 20.0
#: A fetch that found a listener hearing all of its queues is believed for this long (seconds): a fetch that
#: empties its lists then waits on the markers without asking again, and a wait that timed out waits again
#: without a fetch while less than HEARD_FOR - MARKER_WAIT has passed (an idle channel fetches every second
#: timeout, which keeps it believed).
HEARD_FOR = 65.0
#: For this long after a channel starts (a worker's start, a reconnect after a failover) its marker waits last
#: at most ``dlq_fetch_wait``: a failover's new master holds the old master's listening set, and the listener
#: needs a few seconds to track the new one.
SETTLE = 30.0
#: Each channel registers its queues again this often (seconds), so the listener keeps hearing them.
REGISTER_EVERY = 300.0
#: How long a channel's own wake token outlives its write (ms): written when the channel closes.
TOKEN_TTL_MS = 60_000
#: What a channel does next: fetch, block on its markers, or wait on one list (no listener hears it).
FETCH, MARKERS, FALLBACK = "fetch", "markers", "fallback"


def marker_wait(window: float | None, age: float, fetch_wait: float, rng: Any = random.random) -> float:
    """One idle wait on the markers (seconds): U(0.5, 1) of the longest, which stays inside kombu's health
    check of a blocked fetch (``window``: ``internals.kombu_redis.health_window``, None where it has none) and
    is ``fetch_wait`` while the channel is younger than :data:`SETTLE` (``age``, seconds)."""
    longest = MARKER_WAIT if window is None else min(MARKER_WAIT, longest_wait(window))
    if age < SETTLE:
        longest = min(longest, fetch_wait)
    return round(longest * (0.5 + rng() / 2), 3)


def wait_text(how: str, listener: bool, fetch_wait: float) -> str:
    """The INFO line a channel logs when how it waits idle changes."""
    if how == MARKERS:
        return ("celery-dlq: an idle fetch waits for the fetch listener, which wakes one worker per message "
                "on any list it watches")
    why = "dlq_fetch_listener is off" if not listener else "not yet, or none runs"
    return (f"celery-dlq: no fetch listener hears every queue of this worker ({why}): an idle fetch blocks on its "
            f"first list and looks at every list each {fetch_wait:g}s")



class QoS(kombu_redis.QoS):
    """kombu's ack emulation for what ``fetch.lua`` recorded as in flight (kombu's own records otherwise),
    with a close that never raises."""

    def append(self, message: Any, delivery_tag: str) -> None:
        recorded = self.channel._dlq_recorded
        if delivery_tag in recorded:   # fetch.lua recorded it in flight: keep it in memory only
            recorded.discard(delivery_tag)
            self.channel._dlq_ours.add(delivery_tag)
            hold_in_memory(self, message, delivery_tag)
            return
        super().append(message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        if delivery_tag in self.channel._dlq_settled:   # the park script acknowledged it already
            self.channel._dlq_settled.discard(delivery_tag)
            self.channel._dlq_ours.discard(delivery_tag)
            forget_settled(self, delivery_tag)
            return
        super().ack(delivery_tag)

    def _remove_from_indices(self, delivery_tag: str, pipe: Any = None) -> Any:
        """One command for an in-flight message: out of this process's own hash (whatever else holds it now).
        On the channel's own client, which outlives a close: a task of a lost connection still acknowledges."""
        channel = self.channel
        if delivery_tag not in channel._dlq_ours:
            return super()._remove_from_indices(delivery_tag, pipe)
        channel._dlq_ours.discard(delivery_tag)
        return channel._dlq_commands.settle_pipeline(channel._dlq_inflight_key, delivery_tag)

    def restore_by_tag(self, tag: str, client: Any = None, leftmost: bool = False) -> None:
        if tag not in self.channel._dlq_ours:
            return super().restore_by_tag(tag, client, leftmost)
        self.channel._dlq_ours.discard(tag)
        self.channel._dlq_give_back([tag], left=leftmost)

    def restore_unacked(self, client: Any = None) -> Any:
        try:
            ours = [tag for tag in held_tags(self) if tag in self.channel._dlq_ours]
            if ours:   # one script for all of them, as they were: the next fetch counts the delivery
                self.channel._dlq_give_back(ours)
                for tag in ours:
                    self.channel._dlq_ours.discard(tag)
                    forget_held(self, tag)
            return super().restore_unacked(client)
        except Exception as exc:  # kombu's close path on a dead connection (_connparams of None)
            logger.warning("celery-dlq: could not give back %d unacknowledged message(s) at close (%s: %s); "
                           "they stay in flight and come back when this worker reconnects or restarts, or "
                           "after dlq_inflight_lease", len(held_tags(self)), type(exc).__name__, exc)
            for tag in held_tags(self):
                forget_held(self, tag)
            return []


class Channel(kombu_redis.Channel):
    """kombu's Redis channel with celery-dlq's fetch (see the module docstring)."""

    QoS = QoS
    _brpop_sent_at: float | None  # type: ignore[assignment]  # kombu types it None; it holds a monotonic time

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        options = args[0].client.transport_options if args else {}
        #: What this channel needs of the worker's app (``transport_setup.use_in_worker`` hands it over).
        self.fetch_context: FetchContext = context_of(options)
        context = self.fetch_context
        self._dlq_recorded: set[str] = set()
        self._dlq_settled: set[str] = set()
        self._dlq_ours: set[str] = set()   # tags fetch.lua recorded in flight that the QoS holds
        self._dlq_key_cache: dict[tuple[str, ...], tuple[list[str], FetchLayout, list[str]]] = {}
        self._dlq_consumer = process.consumer_id()
        self._dlq_beat_sent: float | None = None
        self._dlq_moves = context.moves
        self._dlq_wait = context.wait
        self._dlq_next = FETCH
        self._dlq_took = False
        self._dlq_sent: tuple[str, list[str]] | None = None
        self._dlq_watch = 0
        self._dlq_recovered = False
        self._dlq_listener = context.listener
        self._dlq_heard_at = -HEARD_FOR      # monotonic: when a fetch last found every queue heard
        self._dlq_registered_at = 0.0        # monotonic: when this channel last registered its queues
        self._dlq_logged_wait: str | None = None
        self._dlq_started = time.monotonic()
        super().__init__(*args, **kwargs)
        self._dlq_keys = Keys(context.key_prefix, self.global_keyprefix)   # full names, for scripts
        self._dlq_plain = redis.Redis(connection_pool=self.pool)  # no key prefixing: scripts get full names
        self._dlq_commands = FetchCommands(self._dlq_plain)   # loads fetch.lua
        self._dlq_wake_key = self._dlq_keys.fetch_wake(f"{self._dlq_consumer}:{uuid()[:8]}")
        self._dlq_inflight = InFlight(self._dlq_plain, self._dlq_keys)
        self._dlq_inflight_key = self._dlq_keys.inflight(self._dlq_consumer)
        self._dlq_rejects = Rejects(DeadLetterLists(self._dlq_plain, Scripts(self._dlq_plain)), self._dlq_keys,
                                    self.global_keyprefix or "", self.ack_keys(), self._dlq_consumer,
                                    self.fetch_context)
        process.opened(self)

    # -- fetch ------------------------------------------------------------------

    def _brpop_start(self, timeout: Any = None) -> None:
        queues = consume_order(self)
        if not queues:
            return
        if not self._dlq_recovered:
            self._dlq_recover()
        keys, layout, markers = self._dlq_fetch_keys(tuple(queues))
        connection = self.client.connection
        set_in_poll(self, connection)
        if self._dlq_next == MARKERS:   # a listener hears every queue: one push wakes one idle worker
            self._dlq_sent = ("BZPOPMIN", keys)
            self._dlq_commands.send_marker_wait(connection, self._dlq_wake_key, markers, self._dlq_marker_wait())
            return
        if self._dlq_next == FALLBACK:   # no listener: block on one list, then look at all
            watched = (self.global_keyprefix or "") + queues[self._dlq_watch % len(queues)]
            self._dlq_watch += 1
            self._dlq_sent = ("BLMOVE", keys)
            self._dlq_commands.send_list_wait(connection, watched, bounded_wait(self, self._dlq_wait))
            return
        self._dlq_sent = ("EVALSHA", keys)
        now, clock = time.time(), time.monotonic()
        moves = self._dlq_moves if self._dlq_took else None
        register = self._dlq_listener and clock - self._dlq_registered_at >= REGISTER_EVERY
        if register:
            self._dlq_registered_at = clock
        beat = process.beat_is_due(self.fetch_context.inflight_lease)
        self._dlq_beat_sent = clock if beat else None
        self._dlq_commands.send_fetch(connection, layout, now_ms=int(now * 1000), beat=beat, register=register,
                                      moves=moves.args(now) if moves else ())

    def _dlq_heard_for(self, seconds: float) -> bool:
        """Whether a fetch found a listener hearing all of this channel's queues in the last ``seconds``."""
        return time.monotonic() - self._dlq_heard_at < seconds

    def _dlq_marker_wait(self) -> float:
        return marker_wait(health_window(self), time.monotonic() - self._dlq_started, self._dlq_wait)

    def _dlq_log_wait(self, how: str) -> None:
        """One INFO line per channel when how it waits idle changes."""
        if how != self._dlq_logged_wait:
            self._dlq_logged_wait = how
            logger.info(wait_text(how, self._dlq_listener, self._dlq_wait))

    def _dlq_fetch_keys(self, queues: tuple[str, ...]) -> tuple[list[str], FetchLayout, list[str]]:
        """The lists of ``queues`` in kombu's BRPOP order, the layout of a fetch over them
        (:class:`~celery_dlq.storage.fetch.FetchLayout`), and the queues' wake markers (cached per queue set)."""
        cached = self._dlq_key_cache.get(queues)
        if cached is None:
            prefix, k = self.global_keyprefix or "", self._dlq_keys
            keys = [list_key(self, queue, pri) for pri in self.priority_steps for queue in queues]
            markers = [k.fetch_marker(queue) for queue in queues] if self._dlq_listener else []
            layout = FetchLayout(k, self._dlq_consumer, tuple(prefix + key for key in keys),
                                 tuple(map(self._queue_of_key, keys)), queues if self._dlq_listener else (),
                                 self.fetch_context.holds,
                                 tuple(self._dlq_moves.keys) if self._dlq_moves else ())   # fetch_moves.py
            cached = self._dlq_key_cache[queues] = (keys, layout, markers)
        return cached

    def _queue_of_key(self, key: str) -> str:
        return key.rsplit(self.sep, 1)[0]

    def _brpop_read(self, **options: Any) -> bool:
        try:
            command, keys = self._dlq_sent or ("EVALSHA", [])
            try:
                reply = self._dlq_commands.read(self.client, command, **options)
            except redis.exceptions.NoScriptError:   # Redis restarted and forgot the script (loaded again)
                raise kombu_redis.Empty() from None
            except self.connection_errors:
                self.client.connection.disconnect()
                raise
            # a fetch moves due retries only while this worker is busy (its last fetch took a message, whether
            # a wake came between or not): never an idle worker's
            if command == "EVALSHA":
                self._dlq_took = bool(reply)
            if command != "EVALSHA":   # woken, or the wait timed out (a safety net): fetch next
                quiet = command == "BZPOPMIN" and reply is None
                self._dlq_next = MARKERS if quiet and self._dlq_heard_for(HEARD_FOR - MARKER_WAIT) else FETCH
                raise kombu_redis.Empty()
            if not reply:   # every list empty: 0 when a listener hears all of them
                heard = reply == 0
                if heard:
                    self._dlq_heard_at = time.monotonic()
                self._dlq_next = MARKERS if heard else FALLBACK
                self._dlq_log_wait(self._dlq_next)
                raise kombu_redis.Empty()
            # Lists emptied by this pop: wait on the markers at once (a push writes them), where the listener
            # was heard lately; else fetch again, which asks.
            more = int(reply[4]) if len(reply) > 4 else 1
            self._dlq_next = FETCH if more or not self._dlq_heard_for(HEARD_FOR) else MARKERS
            return self._dlq_take(reply, keys)
        finally:
            set_in_poll(self, None)
            self._dlq_sent = None
            flush_reauth(self)

    def _dlq_take(self, reply: list, keys: list[str]) -> bool:
        index, element, status, tag = reply[:4]
        if len(reply) > 5:   # due entries this fetch moved onto its lists (fetch_moves.py)
            self.fetch_context.moved.add(reply, 5)
        status = bytes_to_str(status)
        if status == "none":
            raise kombu_redis.Empty()
        if self._dlq_beat_sent is not None and status != "quarantined":
            process.beaten(self._dlq_beat_sent)
        queue = self._queue_of_key(keys[int(index) - 1])
        if status == "quarantined":
            self._dlq_rejects.release_quarantine(queue, element, "not a kombu message (not a JSON object with "
                                                                 "properties, delivery_tag and delivery_info)")
            raise kombu_redis.Empty()
        tag = bytes_to_str(tag)
        try:
            message = loads(bytes_to_str(element))
        except Exception as exc:
            error: str | None = f"not JSON: {exc}"
        else:
            error = envelope_error(message)
        if error:
            self._dlq_rejects.reject(queue, element, tag, error)
            raise kombu_redis.Empty()
        if status == "again":   # given back by a lost consumer: a redelivery, counted as kombu's restores are
            message["properties"]["delivery_info"]["redelivered"] = True
            if isinstance(message.get("headers"), dict):
                message["headers"]["redelivered"] = True
        self._dlq_recorded.add(tag)
        rotate(self, queue)
        try:
            deliver(self, message, queue)
        except Exception as exc:
            if isinstance(exc, self.connection_errors) and not isinstance(exc, KeyError):
                raise   # kombu counts KeyError as a connection error; handing a message over, it never is one
            # The message passed validation, so this is a bug (ours or a library's), not a bad message:
            # logged, never dead-lettered; it stays in flight and comes back.
            self._dlq_recorded.discard(tag)
            forget_held(self.qos, tag)
            logger.exception("celery-dlq: error while handing message %s from %r to the worker; it stays in "
                             "flight and is delivered again when this worker reconnects or restarts", tag, queue)
            raise kombu_redis.Empty() from None
        return True

    # -- acknowledging in another script --------------------------------------------

    def ack_keys(self) -> list[str]:
        """Full name of this process's in-flight hash.

        For a script on the broker's Redis that settles a consumed message
        itself (``park.lua``); then call :meth:`settled` so the channel's ack
        only forgets it.
        """
        return [self._dlq_keys.inflight(self._dlq_consumer)]

    def settled(self, delivery_tag: str) -> None:
        """A script removed ``delivery_tag`` from the unacked records: acking it needs no round trip."""
        self._dlq_settled.add(delivery_tag)

    # -- recovery and close ---------------------------------------------------------

    def _dlq_give_back(self, tags: list[str], left: bool = False) -> int:
        """Give this process's in-flight ``tags`` back to their lists (those it still holds)."""
        return self._dlq_inflight.give_back(self._dlq_consumer, tags, left=left)

    def _dlq_recover(self) -> int:
        """Give back what this process fetched that no live channel of it holds (lost with a connection),
        and what earlier runs of this worker on this host left in flight."""
        self._dlq_recovered = True
        return process.recover(self._dlq_inflight, self._dlq_consumer)

    def close(self) -> None:
        process.closed(self)
        if self._dlq_sent is not None and self._dlq_sent[0] == "BZPOPMIN":
            self._dlq_end_wait()   # kombu's close reads the pending reply: at once, not after MARKER_WAIT
        try:
            super().close()
        except (AttributeError, InconsistencyError, *kombu_redis.get_redis_error_classes()[0]) as exc:
            logger.warning("celery-dlq: error closing a Redis channel (%s: %s); carrying on",
                           type(exc).__name__, exc)

    def _dlq_end_wait(self) -> None:
        try:
            self._dlq_commands.end_wait(self._dlq_wake_key, TOKEN_TTL_MS)
        except redis.RedisError:   # the wait ends at its timeout instead
            logger.debug("celery-dlq: could not end an idle fetch wait", exc_info=True)


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with celery-dlq's :class:`Channel`."""

    Channel = Channel


class SocketTransport(Transport):
    """The same, for a Unix socket (``redis+socket://``): kombu hands the whole URL to ``_connparams``, as it does
    for kombu's own ``redis+socket://``."""

    can_parse_url = True
