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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
    def delayed(self) -> str:
        """ZSET entry_id -> due time (ms): the parked entries, waiting to be due (``delayed`` in Python, in
        the Lua scripts and in Redis: one name)."""
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

    def job(self, job_id: str) -> str:
        """HASH: one redrive job (its fields: ``storage/jobs.py``); kept a week after it ends."""
        return f"{self.base}:job:{job_id}"

    @property
    def jobs(self) -> str:
        """ZSET job id -> when it was created (s): every job kept, newest last (``celery dlq jobs``)."""
        return self.base + ":jobs"

    @property
    def job_leases(self) -> str:
        """ZSET job id -> its owner's lease expiry (ms), running jobs only: one in the past is an orphan."""
        return self.base + ":jobs:leases"

    def job_lock(self, dlq: str) -> str:
        """STRING: the id of the one unfinished job on ``dlq`` (one job per DLQ unless forced)."""
        return f"{self.base}:jobs:dlq:{dlq}"

    @property
    def operator_log(self) -> str:
        """STREAM, capped: the audit trail of operator actions (``storage/audit.py``)."""
        return self.base + ":oplog"

    @property
    def operator_log_privileged(self) -> str:
        """STREAM, capped on its own: the audit records of privileged operator actions (purges, deletes, session
        revokes, pauses, resumes: ``storage/audit.py``), so a flood of cheap actions cannot evict them."""
        return self.base + ":oplog:privileged"

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

    @property
    def breaker_holds(self) -> str:
        """HASH ``<queue>\x1f<task>`` -> until when (ms) ``fetch.lua`` holds that task's deliveries in Redis
        (written with the breaker, ``storage/breakers.py``; ``*`` as the queue: every queue)."""
        return self.base + ":breaker:holds"

    @property
    def breaker_held_raw(self) -> str:
        """ZSET, every score 0: ``<queue>\x1f<task>\x1f<list element>`` for each delivery ``fetch.lua`` held
        without handing it to a worker; read by prefix (``ZRANGEBYLEX``) and pushed back when the breaker closes."""
        return self.base + ":breaker:held:raw"

    @property
    def breaker_kept_total(self) -> str:
        """HASH ``<queue>\x1f<task>`` -> how many deliveries the fetch scripts ever kept for an open breaker: with
        the workers' parks, the exporter's ``breaker_held_total`` (``storage/totals.py``)."""
        return self.base + ":breaker:kept"

    def breaker_release(self, queue: str, task: str) -> str:
        """STRING, with a TTL: the process pushing back what the fetch held of ``task`` on ``queue`` (one at a time)."""
        return f"{self.base}:breaker:release:{queue}:{task}"

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
        """ZSET with at most one member: written by ``park.lua`` (and the redeliver scripts) for an entry due
        before the moving worker's wait ends (:attr:`due_wake_until`), so that worker, blocked on it, wakes
        (``BZPOPMIN``)."""
        return self.base + ":wake"

    @property
    def due_wake_until(self) -> str:
        """STRING, expiring: the earliest due time (ms) the moving worker read at its last look; ``park.lua``
        writes :attr:`due_wake` for an entry due sooner (without it: for an entry that becomes the earliest)."""
        return self.base + ":wake:until"

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

    def chord_outcomes(self, group_id: str) -> str:
        """HASH: chord member id -> what its slot holds once its letter settled it (JSON: state, value), so a
        polling ``chord_unlock`` joins what the ledger decided, whatever order two writes land in."""
        return f"{self.base}:chord:outcomes:{group_id}"

    def chord_unlock(self, group_id: str) -> str:
        """STRING (JSON): Celery's ``celery.chord_unlock`` call for a chord that waits, parked instead of
        polling every ``result_chord_retry_interval``; sent again when its last waiting member is settled."""
        return f"{self.base}:chord:unlock:{group_id}"

    def store_keys(self) -> tuple[str, str, str, str, str]:
        """The keys of the parked store, in the order the store scripts take them."""
        return (self.delayed, self.leases, self.payloads, self.queues, self.parked)

    def move_keys(self) -> tuple[str, ...]:
        """The keys a move of due entries takes (``move_due.lua``, and ``fetch.lua`` when it moves), in order."""
        return (*self.store_keys(), self.stats, self.events, self.expiries)


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

    def lowest(self, queue: str) -> str:
        """The list of ``queue`` a fetch takes last (its lowest priority): where held deliveries go back."""
        return self.key(queue, 9)

    def groups(self, dlq: str) -> str:
        """HASH: the failure groups of DLQ ``dlq`` (``redis/groups.py`` lists its fields), next to its lists on the
        broker, so the Lua script that pushes or removes a dead letter counts it in the same step."""
        return f"{self.global_keyprefix}{GROUPS_PREFIX}{dlq}"

    def queue_of(self, key: str) -> str:
        key = key[len(self.global_keyprefix):] if key.startswith(self.global_keyprefix) else key
        return key.rsplit(self.sep, 1)[0]
