"""Waking an idle fetch: keyspace notifications of the lists a channel watches, heard on a thread.

The fetch (:mod:`celery_dlq.worker.transport`) pops and records in one
script, and a script cannot block. Redis has no blocking wait over several
lists that takes nothing, so an idle channel blocks instead on a key of its
own (``BZPOPMIN <fetch wake key> 5``, or ``dlq_fetch_wait`` if longer:
nothing ends the wait but the token below, so its timeout is only a safety
net; one command per 5 s at rest,
where kombu's ``BRPOP`` sends one a second) and a :class:`Waker` thread listens to the
server's keyspace notifications (``__keyspace@<db>__:<list>``) of every
list the channel watches (each queue, each priority sub-list). When one of
them is pushed to while the channel waits, the thread writes the token the
channel waits for, and the channel fetches over every list at once.

Correct in every order: a push heard while a fetch is in flight, or before
the wait is sent, makes the next start a fetch instead of a wait (the
``dirty`` flag); a token written after the wait timed out only makes the
next wait return at once. While the subscription is down (a Redis restart)
the channel falls back to the wait below, and once subscribed again it
fetches once, for whatever was pushed meanwhile.

Redis sends these notifications only where ``notify-keyspace-events``
includes keyspace (``K``) list (``l``, or ``A``) events; celery-dlq never
changes a server's configuration unless ``dlq_fetch_notifications =
"configure"``. Elsewhere (or with ``"off"``) an idle channel waits with a
no-op ``BLMOVE q q RIGHT RIGHT <dlq_fetch_wait>`` on its first list, which
wakes at once for a message there, and then fetches over every list: a
message on another list waits up to ``dlq_fetch_wait``. Which applies is
found out when a channel first goes idle and logged once per process.

Every idle channel hears every push, so a message published while N
workers idle wakes all N (each tries a fetch; one gets it), where kombu's
``BRPOP`` wakes one. That costs Redis a few commands per worker per message
published while they idle, none while they are busy or idle with nothing
published.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Iterable

import redis

logger = logging.getLogger(__name__)

#: Keyspace events of a list that can make it non-empty (a pop, a trim or a delete cannot).
PUSH_EVENTS = frozenset({b"lpush", b"rpush", b"linsert", b"lset", b"restore", b"rename_to", b"copy_to"})
#: The idle wait where notifications wake it (seconds): only a safety net, so five times kombu's BRPOP timeout.
NOTIFIED_WAIT = 5.0
#: How long an unused wake token outlives its write (ms): a token of a channel that died goes away.
TOKEN_TTL_MS = 60_000

_logged: set[str] = set()


def lists_notified(flags: str) -> bool:
    """Whether ``notify-keyspace-events`` flags include keyspace events of lists."""
    return "K" in flags and ("l" in flags or "A" in flags)


def notifications_on(client: Any, setting: str) -> tuple[bool, str]:
    """Whether the server sends keyspace list events (turned on first with ``setting == "configure"``) and why."""
    if setting == "off":
        return False, "dlq_fetch_notifications is 'off'"
    try:
        reply = client.config_get("notify-keyspace-events")
    except redis.ResponseError as exc:   # an ACL or a managed Redis that refuses CONFIG
        return False, f"CONFIG GET notify-keyspace-events was refused ({exc})"
    flags = next(iter(reply.values()), b"") if reply else b""
    flags = flags.decode() if isinstance(flags, bytes) else str(flags)
    if lists_notified(flags):
        return True, f"the server's notify-keyspace-events is {flags!r}"
    if setting != "configure":
        return False, (f"the server's notify-keyspace-events is {flags!r}, without keyspace list events "
                       f"(K and l); set it, or dlq_fetch_notifications = 'configure'")
    wanted = "".join(dict.fromkeys(flags + "Kl"))
    try:
        client.config_set("notify-keyspace-events", wanted)
    except redis.ResponseError as exc:
        return False, f"CONFIG SET notify-keyspace-events {wanted!r} was refused ({exc})"
    return True, f"set the server's notify-keyspace-events to {wanted!r} (dlq_fetch_notifications = 'configure')"


def log_mode_once(on: bool, why: str, wait: float) -> None:
    """One INFO line per process and mode: how an idle fetch waits."""
    if on:
        text = (f"celery-dlq: an idle fetch waits for keyspace notifications of every list it watches "
                f"({why}): a message on any of them is fetched at once")
    else:
        text = (f"celery-dlq: an idle fetch blocks on its first list and looks at every list each {wait:g}s "
                f"({why}): a message on another list (a second queue, a priority) waits up to {wait:g}s")
    if text not in _logged:
        _logged.add(text)
        logger.info(text)


class Waker:
    """Hears pushes to a channel's lists (a thread with a pub/sub connection) and ends its idle wait."""

    def __init__(self, client: Any, db: int, wake_key: str) -> None:
        self.client, self.wake_key = client, wake_key
        self.prefix = f"__keyspace@{db}__:"
        self._lock = threading.Lock()
        self._wanted: set[str] = set()
        self._subscribed: set[str] = set()
        self._dirty = True
        self._waiting = self._token_sent = False
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the channel's side (the worker's event loop) -----------------------------

    def watch(self, keys: Iterable[str]) -> bool:
        """Listen for pushes to ``keys`` (full names); whether every one is heard already."""
        keys = set(keys)
        with self._lock:
            self._wanted |= keys
            ready = keys <= self._subscribed
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="celery-dlq-fetch-wake", daemon=True)
            self._thread.start()
        return ready

    def begin_wait(self) -> bool:
        """True: send the idle wait now. False: a push was heard since the last fetch began; fetch instead."""
        with self._lock:
            if self._dirty:
                return False
            self._waiting, self._token_sent = True, False
            return True

    def begin_fetch(self) -> None:
        """A fetch is about to be sent: what was pushed before it, it finds."""
        with self._lock:
            self._dirty = self._waiting = False

    def end_wait(self) -> None:
        with self._lock:
            self._waiting = False

    def stop(self) -> None:
        """Stop the thread and end a pending wait (a closing channel reads its reply: at once, not in 5 s)."""
        self._stopped.set()
        with self._lock:
            self._dirty = True
            send, self._token_sent = self._waiting, True
        if send:
            self._write_token()

    # -- the thread ---------------------------------------------------------------

    def _run(self) -> None:
        pubsub, requested, backoff = None, set(), 0.5
        while not self._stopped.is_set():
            try:
                if pubsub is None:
                    pubsub, requested = self.client.pubsub(), set()
                with self._lock:
                    new = self._wanted - requested
                if new:
                    pubsub.subscribe(*(self.prefix + key for key in sorted(new)))
                    requested |= new
                message = pubsub.get_message(timeout=0.25)
                if message is not None:
                    self._heard(message)
                backoff = 0.5
            except Exception as exc:   # the connection was lost (a Redis restart): nothing is heard meanwhile
                with self._lock:
                    self._subscribed.clear()
                self._notify()
                logger.debug("celery-dlq: keyspace notifications lost (%s: %s); subscribing again",
                             type(exc).__name__, exc)
                pubsub = self._close(pubsub)
                self._stopped.wait(backoff)
                backoff = min(backoff * 2, 5.0)
        self._close(pubsub)

    def _heard(self, message: dict) -> None:
        channel = message.get("channel")
        key = channel.decode("utf-8", "surrogateescape") if isinstance(channel, bytes) else str(channel)
        key = key[len(self.prefix):]
        if message.get("type") == "subscribe":
            with self._lock:
                self._subscribed.add(key)
            self._notify()   # pushed before the subscription took: look once
        elif message.get("type") == "message" and message.get("data") in PUSH_EVENTS:
            self._notify()

    def _notify(self) -> None:
        with self._lock:
            self._dirty = True
            send = self._waiting and not self._token_sent
            self._token_sent = self._token_sent or send
        if send:
            self._write_token()

    def _write_token(self) -> None:
        try:
            self.client.pipeline(transaction=False).zadd(self.wake_key, {"w": 0}) \
                .pexpire(self.wake_key, TOKEN_TTL_MS).execute()
        except redis.RedisError:   # the wait ends at its timeout instead
            logger.debug("celery-dlq: could not wake an idle fetch", exc_info=True)

    @staticmethod
    def _close(pubsub: Any) -> None:
        if pubsub is not None:
            try:
                pubsub.close()
            except Exception:
                logger.debug("celery-dlq: error closing a pub/sub connection", exc_info=True)
        return None
