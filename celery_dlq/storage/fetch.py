"""The worker's fetch on the broker's Redis: ``lua/fetch.lua`` composed from declared sections, and its waits.

``fetch.lua`` takes a few sections of keys and arguments, most of them
optional (the wake markers with a fetch listener, the breaker holds where the
broker is the store, the parked store's keys where a busy fetch moves due
retries). Each is declared once here (:data:`SECTIONS`, in the order the Lua
reads them) and :func:`compose` builds ``KEYS`` and ``ARGV`` from the
sections present, with every offset computed in one place and passed to the
script in a header, ``ARGV[1]``: for each section its first key and its first
argument, then one past the last of each (so a section's counts are the next
one's firsts minus its own; an absent section counts 0). The header is binary
(16-bit big-endian numbers): the Lua reads it with one ``string.byte``, not a
``tonumber`` per number, which would add a few microseconds to every fetch.
:class:`FetchLayout` composes each shape once and fills in a fetch's values.

:class:`FetchCommands` sends what a worker's channel sends while it fetches:
kombu reads the reply on its event loop, so each send goes out on the
channel's connection and :meth:`FetchCommands.read` parses its reply later.
"""
from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import redis

from celery_dlq.storage.keys import Keys
from celery_dlq.storage.scripts import script_source

#: fetch.lua's sections, in the order of its header (its ``local CLOCK, LISTS, ...`` line says the same):
#: ``clock``: no keys, ARGV now (ms);
#: ``lists``: the queue lists in kombu's BRPOP order;
#: ``quarantines``: list i's quarantine at position i;
#: ``inflight``: this consumer's in-flight hash and the consumers ZSET, ARGV the consumer whose beat to write
#: ("": none);
#: ``markers``: one wake marker per queue, ARGV each marker's queue (a fetch listener; absent without one);
#: ``listener``: the fetch queues ZSET and the listening SET, ARGV "1" to register the queues again (with markers);
#: ``holds``: the breaker holds, held deliveries and kept totals, ARGV each list's queue (the broker is the store);
#: ``moves``: the parked store's keys as ``move_due.lua`` takes them, ARGV ``FetchMoves.args`` (present while busy).
SECTIONS = ("clock", "lists", "quarantines", "inflight", "markers", "listener", "holds", "moves")
#: The moves section's arguments (``FetchMoves.args``).
MOVES_ARGS = 4


@dataclass(frozen=True)
class Section:
    """One section of a script's KEYS and ARGV: its keys (full names) and its arguments."""

    name: str
    keys: tuple[str, ...] = ()
    args: tuple[Any, ...] = ()


def compose(sections: Sequence[Section], order: Sequence[str] = SECTIONS) -> tuple[list[str], list[Any]]:
    """``KEYS`` and ``ARGV`` of ``sections`` (each named once, in ``order``; any may be absent): ARGV[1] is the header
    (each section's first key and first argument, 1-based, then one past the last of each), the arguments follow."""
    given = {section.name: section for section in sections}
    unknown = set(given) - set(order)
    if unknown or len(given) != len(sections):
        raise ValueError(f"sections {sorted(unknown) or [s.name for s in sections]} not declared once in {order}")
    keys: list[str] = []
    args: list[Any] = []
    firsts: list[int] = []
    for name in order:
        section = given.get(name)
        firsts += [len(keys) + 1, len(args) + 2]   # ARGV[1] is the header
        if section is not None:
            keys += section.keys
            args += section.args
    firsts += [len(keys) + 1, len(args) + 2]
    if max(firsts) > 0xFFFF:
        raise ValueError(f"a fetch of {len(keys)} keys and {len(args)} arguments is past the header's 16 bits")
    return keys, [struct.pack(f">{len(firsts)}H", *firsts), *args]


def header_of(args: Sequence[Any], order: Sequence[str] = SECTIONS) -> Mapping[str, tuple[int, int, int, int]]:
    """The header of a composed ARGV, per section: (first key, key count, first argument, argument count)."""
    firsts = struct.unpack(f">{2 * len(order) + 2}H", args[0])
    return {name: (firsts[2 * i], firsts[2 * i + 2] - firsts[2 * i], firsts[2 * i + 1],
                   firsts[2 * i + 3] - firsts[2 * i + 1]) for i, name in enumerate(order)}


@dataclass(frozen=True)
class FetchLayout:
    """The keys of one channel's fetch over one set of queues (built once per queue set, then reused).

    ``lists``: the queue lists (full names) in kombu's order; ``queues``: each list's queue;
    ``markers``: the wake markers' queues (empty: no listener); ``holds``: breakers hold in Redis;
    ``moves``: the parked store's keys a busy fetch moves from (empty: it never moves).
    """

    keys: Keys
    consumer: str
    lists: tuple[str, ...]
    queues: tuple[str, ...]
    markers: tuple[str, ...] = ()
    holds: bool = False
    moves: tuple[str, ...] = ()

    @cached_property
    def _fixed(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """The sections' keys, named once per layout: quarantines, in flight, markers, listener, holds."""
        k = self.keys
        return (tuple(k.quarantine(queue) for queue in self.queues), (k.inflight(self.consumer), k.consumers),
                tuple(k.fetch_marker(queue) for queue in self.markers), (k.fetch_queues, k.fetch_listening),
                (k.breaker_holds, k.breaker_held_raw, k.breaker_kept_total))

    def sections(self, *, now_ms: int, beat: bool, register: bool, moves: Sequence[Any] = ()) -> list[Section]:
        """The sections of one fetch at ``now_ms``: ``beat``: write this consumer's beat if it takes a message;
        ``register``: register the markers' queues again; ``moves``: the moves' arguments (none: no moves)."""
        quarantines, inflight, markers, listener, holds = self._fixed
        sections = [Section("clock", (), (now_ms,)), Section("lists", self.lists),
                    Section("quarantines", quarantines),
                    Section("inflight", inflight, (self.consumer if beat else "",))]
        if self.markers:
            sections += [Section("markers", markers, self.markers),
                         Section("listener", listener, ("1" if register else "",))]
        if self.holds:
            sections.append(Section("holds", holds, self.queues))
        if self.moves and moves:
            sections.append(Section("moves", self.moves, tuple(moves)))
        return sections

    @cached_property
    def _shapes(self) -> dict[bool, tuple[list[str], list[Any], dict[str, int]]]:
        """Per shape (with moves or without): the KEYS, an ARGV whose per-call values are placeholders, and where
        each of those values goes. A fetch's KEYS and header only change with the shape: composed once each."""
        shapes = {}
        for moving in (False, True):
            sections = self.sections(now_ms=0, beat=False, register=False, moves=(0,) * MOVES_ARGS if moving else ())
            keys, args = compose(sections)
            header = header_of(args)
            at = {name: header[name][2] - 1 for name in ("clock", "inflight", "listener", "moves")}
            shapes[moving] = (keys, args, at)
        return shapes

    def compose(self, *, now_ms: int, beat: bool, register: bool, moves: Sequence[Any] = ()) -> tuple[list[str],
                                                                                                     list[Any]]:
        """``KEYS`` and ``ARGV`` of one fetch (as ``compose(self.sections(...))``, from the shape's template)."""
        keys, template, at = self._shapes[bool(self.moves and moves)]
        args = list(template)
        args[at["clock"]] = now_ms
        args[at["inflight"]] = self.consumer if beat else ""
        if self.markers:
            args[at["listener"]] = "1" if register else ""
        if self.moves and moves:
            if len(moves) != MOVES_ARGS:
                raise ValueError(f"a fetch's moves take {MOVES_ARGS} arguments, not {len(moves)}")
            args[at["moves"]:at["moves"] + MOVES_ARGS] = moves
        return keys, args


class FetchCommands:
    """What a worker's channel sends to fetch and wait, on ``client`` (the channel's pool, no key prefixing:
    every key is a full name). Loads ``fetch.lua`` when built."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.sha = self.load()

    def load(self) -> str:
        """Load ``fetch.lua`` (again, after a restarted server forgot it); its SHA."""
        self.sha = self.client.script_load(script_source("fetch"))
        return self.sha

    def send_fetch(self, connection: Any, layout: FetchLayout, **call: Any) -> None:
        """Send one fetch (``EVALSHA``; :meth:`FetchLayout.sections`' arguments); :meth:`read` reads its reply."""
        keys, args = layout.compose(**call)
        connection.send_command("EVALSHA", self.sha, len(keys), *keys, *args)

    @staticmethod
    def send_marker_wait(connection: Any, wake_key: str, markers: Sequence[str], timeout: float) -> None:
        """Block on this channel's wake token and its queues' markers (``BZPOPMIN``)."""
        connection.send_command("BZPOPMIN", wake_key, *markers, timeout)

    @staticmethod
    def send_list_wait(connection: Any, key: str, timeout: float) -> None:
        """Block until ``key`` holds a message (``BLMOVE key key RIGHT RIGHT``: a no-op move that wakes)."""
        connection.send_command("BLMOVE", key, key, "RIGHT", "RIGHT", timeout)

    def read(self, client: Any, command: str, **options: Any) -> Any:
        """The reply of what was sent last on ``client``'s connection; a fetch that found the script gone loads
        it again and raises :class:`redis.exceptions.NoScriptError` (the next fetch runs it)."""
        try:
            return client.parse_response(client.connection, command, **options)
        except redis.exceptions.NoScriptError:
            self.load()
            raise

    def settle_pipeline(self, inflight_key: str, tag: str) -> Any:
        """A pipeline with an in-flight message's acknowledgement queued (its tag out of this process's hash):
        kombu's ack executes it."""
        return self.client.pipeline(transaction=False).hdel(inflight_key, tag)

    def end_wait(self, wake_key: str, ttl_ms: int) -> None:
        """Wake this channel's own marker wait (its token, living ``ttl_ms``), in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zadd(wake_key, {"w": 0})
        pipe.pexpire(wake_key, ttl_ms)
        pipe.execute()


def run_fetch(scripts: Any, layout: FetchLayout, **call: Any) -> Any:
    """One fetch through ``scripts`` (:class:`~celery_dlq.storage.scripts.Scripts`), waiting for its reply: as
    a channel's fetch, for tests and tools."""
    keys, args = layout.compose(**call)
    return scripts.run("fetch", keys, args)
