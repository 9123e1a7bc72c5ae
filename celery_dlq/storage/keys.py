"""Every Redis key name celery-dlq reads or writes, and every field of its ``stats`` hash, in one place.

Two families of keys:

* **ours** (:class:`Keys`): the parked store, counters, audit markers, the
  archive stream. They share the hash tag ``{<prefix>}``: on Redis Cluster
  they land on one slot, which is what lets one Lua script touch several of
  them. Every key a script uses is passed through ``KEYS``. With
  ``dlq_store_shards = N > 1`` (:class:`Shards`) the store is N such key
  sets, ``{<prefix>:0}`` ... ``{<prefix>:N-1}``, a task's keys in the one
  its id picks; ``{<prefix>}`` itself (the home set) keeps what belongs to
  no task (quarantines, fetch sets, operator counters).
* **kombu's** (:class:`QueueLists`): a queue, a DLQ among them, is where
  kombu's Redis transport puts it, one LIST per priority step, kombu's
  ``global_keyprefix`` in front.

Nothing else in the package builds a key name, so the layout of the data in
Redis can be read from this module alone.
"""
from __future__ import annotations

from bisect import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from zlib import crc32

from redis.crc import REDIS_CLUSTER_HASH_SLOTS as SLOTS
from redis.crc import key_slot

from celery_dlq.errors import ConfigurationError

#: Stands for a message's task id where it has none: in entry ids, audit keys, and to pick their shard.
UNKNOWN_TASK_ID = "unknown"
#: kombu's Redis transport: priority sub-lists are ``name + SEP + step``.
SEP = "\x06\x16"
PRIORITY_STEPS = (0, 3, 6, 9)
#: A DLQ's failure-group index is ``_celery_dlq.groups:<dlq>`` on the broker (kombu's ``_kombu.`` style).
GROUPS_PREFIX = "_celery_dlq.groups:"


class Stat:
    """The counters of the ``stats`` hash (:attr:`Keys.stats`): field names, written by the code that does the work."""

    PARKED = "parked"                                  # park.lua
    REDELIVERED = "redelivered"                        # the mover's ack
    DEAD_LETTERED = "dead_lettered"
    DROPPED = "dropped"
    EXPIRED = "expired"                                # dead-lettered or dropped because Celery's expires passed
    DUPLICATES = "dead_letter_duplicates_suppressed"
    TRIMMED = "dead_letters_trimmed"                   # retention
    REPLAYED = "replayed"                              # operator tools
    PURGED = "purged"


class Keys:
    """Every Redis key name of the extension.

    Keys share the hash tag ``{<prefix>}`` so that they land on one Redis
    Cluster slot; kombu's ``global_keyprefix`` goes in front, so one Redis can
    serve several apps that kombu already keeps apart.
    """

    def __init__(self, prefix: str = "celery_dlq", global_keyprefix: str = "") -> None:
        if not prefix or "{" in prefix or "}" in prefix:
            # A brace would end the hash tag early and scatter keys over slots.
            raise ConfigurationError(
                f"dlq key prefix must be non-empty and without braces: {prefix!r}")
        self.prefix = prefix
        self.global_keyprefix = global_keyprefix or ""

    def __repr__(self) -> str:
        return f"Keys(base={self.base!r})"

    @property
    def base(self) -> str:
        return f"{self.global_keyprefix}{{{self.prefix}}}"

    @property
    def schedule(self) -> str:
        """ZSET entry_id -> due time (ms): parked entries waiting to be due.

        The Redis key keeps its first name, ``:delayed``, so an upgrade finds what was parked before it."""
        return self.base + ":delayed"

    @property
    def leases(self) -> str:
        """ZSET entry_id -> lease expiry (ms): entries a mover has claimed."""
        return self.base + ":leases"

    @property
    def payloads(self) -> str:
        """HASH entry_id -> payload bytes (opaque to the store)."""
        return self.base + ":payloads"

    @property
    def queues(self) -> str:
        """HASH entry_id -> name of the queue the message goes back to."""
        return self.base + ":queues"

    @property
    def expiries(self) -> str:
        """HASH entry_id -> when the parked message expires (ms); only entries whose message has ``expires``."""
        return self.base + ":expiries"

    @property
    def parked(self) -> str:
        """HASH queue -> number of entries parked or leased for that queue."""
        return self.base + ":parked"

    @property
    def layout(self) -> str:
        """SET of the hash tags of every shard written under (``dlq_store_shards`` > 1), so readers and movers
        also serve the shards of an earlier shard count until they are empty."""
        return self.base + ":layout"

    @property
    def stats(self) -> str:
        """HASH counter name -> integer (``dropped``, ``dead_lettered``, ...)."""
        return self.base + ":stats"

    @property
    def metrics(self) -> str:
        """HASH ``metric{label="value",...}`` -> integer: the exporter's ``_total`` counters (``storage/totals.py``)."""
        return self.base + ":metrics"

    @property
    def trends(self) -> str:
        """HASH ``<kind>|<queue or reason>|<name>|<m or h><slot>`` -> ``"<minute or hour>:<count>"``: dead-lettered,
        parked and redelivered per minute (the last hour) and per hour (the last week), rings of fixed size
        (``redis/trends.py``)."""
        return self.base + ":trends"

    @property
    def events(self) -> str:
        """STREAM, capped: the dead-letter archive (park, redelivery, dead letter, ...; ``events.py``)."""
        return self.base + ":events"

    def web_session(self, digest: str) -> str:
        """HASH, expiring: one dashboard login (``user``, ``created``, ``expires``, ``address``, ``tag``);
        ``digest`` is the SHA-256 of the session cookie, so what Redis holds cannot be replayed as a cookie
        (``web/sessions.py``)."""
        return f"{self.base}:web:session:{digest}"

    @property
    def web_sessions(self) -> str:
        """ZSET session digest -> expiry (s): every dashboard login, to list and revoke them by user."""
        return self.base + ":web:sessions"

    def web_login_failures(self, scope: str, who: str) -> str:
        """STRING counter, expiring at the end of its window: failed dashboard logins of one client address
        (``scope`` ``addr``) or one user name (``user``), shared by every dashboard process (``web/throttle.py``)."""
        return f"{self.base}:web:failures:{scope}:{who}"

    def breaker(self, queue: str, group: str) -> str:
        """HASH: the circuit breaker of failure ``group`` on ``queue`` (``storage/breaker_state.py``): ``state``
        (closed, open, half_open), ``opened_at``, ``cooldown``, the window's counts, ``probe_id``, ``paused_by``...
        A redrive reads ``state`` to stop when the breaker opens again."""
        return f"{self.base}:breaker:{queue}:{group}"

    @property
    def breakers(self) -> str:
        """HASH ``<queue>\\x1f<group>`` -> JSON summary (state, task, probe due, paused): the index of every breaker,
        written in the same transaction as the breaker; what a worker reads to know which tasks are held."""
        return self.base + ":breakers"

    def breaker_held(self, queue: str, group: str) -> str:
        """ZSET parked entry id -> when it was held: deliveries the open breaker parked, released when it closes."""
        return f"{self.base}:breaker:held:{queue}:{group}"

    def delivery_count(self, task_id: str) -> str:
        """STRING counter: how many times the task's message was delivered."""
        return f"{self.base}:count:{task_id}"

    def audit(self, task_id: str, delivery: int, tag: str | None = None) -> str:
        """Marker of one dead-lettering, so a redelivery does not audit twice.

        ``tag`` is the broker's delivery tag of the message instance where it
        has a stable one (kombu's Redis transport keeps it across restores):
        the same message restored after a crash meets its own marker, while a
        dead letter that someone republishes is a new instance and is never
        mistaken for a duplicate.
        """
        suffix = f":{tag}" if tag else ""
        return f"{self.base}:audit:{task_id}:{int(delivery)}{suffix}"

    def quarantine(self, queue: str) -> str:
        """LIST: raw elements popped from ``queue`` that were not kombu messages (fetch.lua), byte for byte."""
        return f"{self.base}:quarantine:{queue}"

    def inflight(self, consumer: str) -> str:
        """HASH, on the broker: delivery tag -> the list it came from and its element, for every message one
        worker process fetched and has not settled (``fetch.lua``); given back when that process is gone
        (``redis/inflight.py``)."""
        return f"{self.base}:inflight:{consumer}"

    @property
    def consumers(self) -> str:
        """ZSET, on the broker: consumer process -> its last heartbeat (ms) while it holds messages."""
        return self.base + ":consumers"

    def fetch_wake(self, consumer: str) -> str:
        """ZSET, on the broker's Redis: written when one channel closes, to end its own idle wait at once."""
        return f"{self.base}:fetchwake:{consumer}"

    def fetch_marker(self, queue: str) -> str:
        """ZSET with at most one member, on the broker's Redis: written by the fetch listener when ``queue``'s
        lists hold a message (``mark_queues.lua``); an idle fetch blocks on it (``BZPOPMIN``), so one
        message wakes one worker, and deleted by a fetch that finds the queue empty."""
        return f"{self.base}:marker:{queue}"

    @property
    def fetch_queues(self) -> str:
        """ZSET queue -> when a fetch last found it empty (ms), on the broker: the queues the listener hears."""
        return self.base + ":fetch:queues"

    @property
    def fetch_listening(self) -> str:
        """SET, expiring, on the broker: the queues a live fetch listener hears; a fetch blocks on their
        markers only when all of its queues are here."""
        return self.base + ":fetch:listening"

    @property
    def due_wake(self) -> str:
        """ZSET with at most one member: written by ``park.lua`` (and the redeliver scripts) when an entry
        becomes the earliest due, so the moving worker, blocked on it, wakes (``BZPOPMIN``)."""
        return self.base + ":wake"

    @property
    def mover_lease(self) -> str:
        """STRING, expiring: the id of the one worker that moves due entries and runs the fetch listener
        (home set only; ``redis/lease.py``)."""
        return self.base + ":mover"

    def chord_member(self, task_id: str) -> str:
        """HASH: a dead-lettered chord member's ledger entry (``state``: waiting, released, failed, continued;
        ``rule``, ``dlq``, ``group``, ``context`` (JSON), ``at``); never expires while ``waiting`` (redis/chords.py)."""
        return f"{self.base}:chord:member:{task_id}"

    def chord_waiting(self, group_id: str) -> str:
        """SET: task ids of one chord's members waiting in a DLQ (its keys are kept from expiring meanwhile)."""
        return f"{self.base}:chord:group:{group_id}"

    def chord_waiting_in(self, dlq: str) -> str:
        """SET: task ids of waiting chord members dead-lettered to ``dlq`` (a purge fails their chords)."""
        return f"{self.base}:chord:dlq:{dlq}"

    def chord_unlock(self, group_id: str) -> str:
        """STRING (JSON): Celery's ``celery.chord_unlock`` call for a chord that waits, parked instead of
        polling every ``result_chord_retry_interval``; sent again when its last waiting member is settled."""
        return f"{self.base}:chord:unlock:{group_id}"

    def store_keys(self) -> tuple[str, str, str, str, str]:
        """The keys of the parked store, in the order the store scripts take them."""
        return (self.schedule, self.leases, self.payloads, self.queues, self.parked)

    def move_keys(self) -> tuple[str, ...]:
        """The keys a move of due entries takes (``move_due.lua``, and ``fetch.lua`` when it moves), in order."""
        return (*self.store_keys(), self.stats, self.events, self.expiries)



@lru_cache(maxsize=4096)
def shard_tag(prefix: str, index: int, count: int) -> str:
    """The hash tag of shard ``index`` of ``count``: its slot lies in the ``index``-th of ``count`` equal slot ranges.

    ``<prefix>:<index>`` when its slot falls there, else ``<prefix>:<index>:<j>``
    with the smallest ``j`` whose does. A Redis Cluster whose masters own
    equal contiguous slot ranges (what ``redis-cli --cluster create`` makes)
    then holds the same number of shards on each master, where plain
    ``{prefix:i}`` tags would leave one of three masters without any of six
    shards one time in four. Pure and deterministic: every process agrees.
    """
    low, high = index * SLOTS // count, (index + 1) * SLOTS // count
    for j in range(64 * SLOTS):
        tag = f"{prefix}:{index}" if j == 0 else f"{prefix}:{index}:{j}"
        if low <= key_slot(tag.encode("utf-8")) < high:
            return tag
    raise ConfigurationError(f"no hash tag for shard {index} of {count}")  # unreachable for count <= SLOTS


def shard_index(task_id: str | None, shards: int) -> int:
    """The shard (0 .. ``shards`` - 1) of a task id: CRC-32 of its UTF-8, modulo the count (stable everywhere)."""
    return crc32((task_id or "").encode("utf-8", "surrogatepass")) % shards if shards > 1 else 0


#: At most one shard per 16 cluster slots: more would only cost the movers round trips.
MAX_SHARDS = 1024


class Shards:
    """The store's key sets: the home set ``{<prefix>}`` and, with ``count > 1``, ``{<prefix>:0}`` ... .

    Shard ``i``'s hash tag is ``<prefix>:<i>`` or, to spread the shards
    evenly over a cluster's slots, ``<prefix>:<i>:<j>`` (:func:`shard_tag`).
    ``count == 1`` is the unsharded layout, exactly the home set, so a
    deployment that never sets ``dlq_store_shards`` keeps its keys. With
    more, a task's entries, counters, audit markers and archive events go to
    the shard its id picks (:func:`shard_index`); readers read :attr:`all`,
    the home set included, where entries parked before sharding was turned
    on stay until the movers drain them.
    """

    def __init__(self, prefix: str = "celery_dlq", global_keyprefix: str = "", count: int = 1,
                 earlier: Iterable[str] = ()) -> None:
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_SHARDS:
            raise ConfigurationError(f"dlq_store_shards must be an integer from 1 to {MAX_SHARDS}, got {count!r}")
        self.prefix, self.global_keyprefix = prefix, global_keyprefix
        self.home = Keys(prefix, global_keyprefix)
        self.shards: tuple[Keys, ...] = (self.home,) if count == 1 else tuple(
            Keys(shard_tag(prefix, i, count), global_keyprefix) for i in range(count))
        current = {keys.prefix for keys in (self.home, *self.shards)}
        #: Shards of an earlier shard count (``Keys.layout``): read and drained, never written to.
        self.earlier: tuple[Keys, ...] = tuple(Keys(tag, global_keyprefix) for tag in sorted(set(earlier) - current))

    def __repr__(self) -> str:
        return f"Shards(home={self.home.base!r}, count={len(self.shards)}, earlier={len(self.earlier)})"

    def __len__(self) -> int:
        return len(self.shards)

    def with_earlier(self, tags: Iterable[str]) -> Shards:
        """These shards, plus the shards of ``tags`` (an earlier layout's) to read and drain.

        Only tags of this prefix (``<prefix>:...``, no braces) count: the
        layout set is data in Redis, and a stray member must not stop a reader.
        """
        ours = [tag for tag in tags if tag.startswith(self.prefix + ":") and not set(tag) & set("{}")]
        return Shards(self.prefix, self.global_keyprefix, len(self.shards), ours)

    @property
    def tags(self) -> list[str]:
        """The hash tags of this layout's shards, as :attr:`Keys.layout` records them (none when unsharded)."""
        return [keys.prefix for keys in self.shards] if len(self.shards) > 1 else []

    @property
    def all(self) -> tuple[Keys, ...]:
        """Every key set readers read: the home set first, the shards, then an earlier layout's shards."""
        current = self.shards if self.shards[0] is self.home else (self.home, *self.shards)
        return current + self.earlier

    def index(self, task_id: str | None) -> int:
        return shard_index(task_id, len(self.shards))

    def of(self, task_id: str | None) -> Keys:
        """The key set of ``task_id``'s entries, counters and events."""
        return self.shards[self.index(task_id)]


@dataclass(frozen=True)
class QueueLists:
    """Where kombu's Redis transport keeps a queue: a LIST per priority step."""

    global_keyprefix: str = ""
    steps: tuple[int, ...] = PRIORITY_STEPS
    sep: str = SEP

    @classmethod
    def of(cls, transport_options: Mapping[str, Any] | None) -> QueueLists:
        """The lists of a broker with these ``broker_transport_options``
        (``global_keyprefix``, ``priority_steps``, ``sep``)."""
        options = transport_options or {}
        return cls(options.get("global_keyprefix") or "", tuple(options.get("priority_steps") or PRIORITY_STEPS),
                   options.get("sep") or SEP)

    def keys(self, queue: str) -> list[str]:
        """Every list of ``queue``, priority 0 first; ``LLEN`` of the first alone undercounts."""
        return [self.key(queue, step) for step in self.steps]

    def key(self, queue: str, priority: Any = 0) -> str:
        """The list kombu pushes a message of ``priority`` onto (as ``Channel._q_for_pri``; the contract suite
        compares the two, tests/contract/test_kombu_formats.py)."""
        try:
            priority = min(max(int(priority), 0), 9)
        except (TypeError, ValueError):
            priority = 0
        # kombu's Channel.priority, index -1 included: below the first step (steps without 0) is the last step
        step = self.steps[bisect(self.steps, priority) - 1]
        return self.global_keyprefix + (f"{queue}{self.sep}{step}" if step else queue)

    def groups(self, dlq: str) -> str:
        """HASH: the failure groups of DLQ ``dlq`` (``redis/groups.py`` lists its fields), next to its lists on the
        broker, so the Lua script that pushes or removes a dead letter counts it in the same step."""
        return f"{self.global_keyprefix}{GROUPS_PREFIX}{dlq}"

    def queue_of(self, key: str) -> str:
        key = key[len(self.global_keyprefix):] if key.startswith(self.global_keyprefix) else key
        return key.rsplit(self.sep, 1)[0]
