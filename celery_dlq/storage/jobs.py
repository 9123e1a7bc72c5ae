"""Redrive jobs kept in Redis: their records, their states, and who runs each (a lease).

A job is a HASH (``Keys.job``) with these fields, all text:

- what: ``id``, ``kind`` (replay, purge, redrive), ``dlq``, ``selection`` (JSON, ``ops/jobs.py``),
  ``to``, ``limit``, ``who``, ``why``, ``created``;
- its pace: ``rate`` (messages/s now; '' for no cap), ``cap``, ``interval``, ``rate_at`` (when ``rate`` last
  changed), ``rising`` ("1": doubles each interval while its letters succeed);
- its state: ``state`` (:data:`STATES`), ``reason`` (why it ended: stopped, failed), ``finished``;
- its progress: ``matched``, ``done``, ``missing``, ``failed``, ``not_found`` (counts), ``ids_left`` (JSON);
- who runs it: ``owner`` (a process) and ``lease_until`` (ms), ``takeovers``; the lease is also in
  ``Keys.job_leases`` (the one lease's index form, :class:`~celery_dlq.storage.lease.LeaseIndex`), which
  ``job_claim.lua`` checks and holds through ``lib.lua``'s ``lease_*``.

Any process changes its state (:data:`TRANSITIONS`, one script that checks the state it moves from);
the owner renews its lease and counts its progress in one script (``job_claim.lua``), and a job whose
lease expired is taken by the next process that claims it. One unfinished job per DLQ (``Keys.job_lock``)
unless forced. Nothing here moves a letter: ``ops/jobs.py`` runs a job through ``ops/queue.py``.
"""
from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from celery_dlq.errors import DLQError
from celery_dlq.message import as_text
from celery_dlq.storage.keys import Keys
from celery_dlq.storage.lease import LeaseIndex
from celery_dlq.storage.scripts import Scripts

RUNNING, PAUSED, CANCELLED, DONE, FAILED, STOPPED = "running", "paused", "cancelled", "done", "failed", "stopped"
STATES = (RUNNING, PAUSED, CANCELLED, DONE, FAILED, STOPPED)
#: States a job never leaves.
ENDED = frozenset({CANCELLED, DONE, FAILED, STOPPED})
#: action -> (the states it applies to, the state it leads to).
TRANSITIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "pause": ((RUNNING,), PAUSED),
    "resume": ((PAUSED,), RUNNING),
    "cancel": ((RUNNING, PAUSED), CANCELLED),
    "finish": ((RUNNING,), DONE),
    "fail": ((RUNNING, PAUSED), FAILED),
    "stop": ((RUNNING,), STOPPED),
}
#: Progress counters of a job record.
COUNTS = ("matched", "done", "missing", "failed", "not_found")
#: Seconds an ended job's record is kept; jobs the index keeps.
KEEP_SECONDS, KEEP_JOBS = 7 * 86400, 500


class JobStateError(DLQError):
    """An action that does not apply to the job's state (resume a running job, pause a finished one)."""


class DLQBusy(DLQError):
    """Another unfinished job works the DLQ; ``holder`` is its id. Pass ``force`` to run both."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


def next_state(state: str, action: str) -> str:
    """The state ``action`` leads a job in ``state`` to; :class:`JobStateError` when it does not apply (pure)."""
    if action not in TRANSITIONS:
        raise JobStateError(f"unknown job action {action!r} (actions: {', '.join(TRANSITIONS)})")
    sources, target = TRANSITIONS[action]
    if state not in sources:
        raise JobStateError(f"cannot {action} a job that is {state or 'gone'} (only one that is "
                            f"{' or '.join(sources)})")
    return target


def new_job_id() -> str:
    return secrets.token_hex(8)


class JobStore:
    """The jobs of one key set (the home set): create, read, change state, claim and renew."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self.client, self.keys = client, keys
        self.leases = LeaseIndex(client, keys.job_leases)
        self.scripts = Scripts(client)

    def create(self, job_id: str, dlq: str, record: Mapping[str, Any], *, created: float, force: bool) -> None:
        """Record a new running job on ``dlq``; :class:`DLQBusy` when another unfinished job holds it (no ``force``)."""
        fields: list[Any] = []
        for name, value in {**record, "id": job_id, "dlq": dlq, "state": RUNNING, "created": created,
                            "owner": "", "lease_until": 0}.items():
            fields += [name, "" if value is None else value]
        lock = self.keys.job_lock(dlq)
        for _ in range(10):   # the lock changed between the read and the script: read it again
            holder = as_text(self.client.get(lock) or b"")
            keys = [self.keys.job(job_id), lock, self.keys.jobs, self.keys.job_leases,
                    self.keys.job(holder or job_id)]
            ok, who = self.scripts.run("job_create", keys, [job_id, "force" if force else "", created, KEEP_JOBS,
                                                            holder, *fields])
            if int(ok) == 1:
                return
            if int(ok) == 0:
                holder = as_text(who)
                raise DLQBusy(f"job {holder} is working {dlq} already: pause or cancel it, or force a second job",
                              holder)
        raise DLQError(f"could not take {dlq}'s job lock: it keeps changing")

    def get(self, job_id: str) -> dict[str, str] | None:
        raw = self.client.hgetall(self.keys.job(job_id))
        return {as_text(k): as_text(v) for k, v in raw.items()} if raw else None

    def recent(self, limit: int = 50) -> list[dict[str, str]]:
        """The newest ``limit`` jobs still kept, newest first."""
        ids = [as_text(i) for i in self.client.zrevrange(self.keys.jobs, 0, max(0, limit - 1))]
        pipe = self.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hgetall(self.keys.job(job_id))
        return [{as_text(k): as_text(v) for k, v in raw.items()} for raw in pipe.execute() if raw]

    def first_lease(self) -> int | None:
        """When the first lease of an unfinished job runs out (ms; one ``ZRANGE``), None when there is no job."""
        first = self.leases.first()
        return first[1] if first else None

    def orphans(self, now_ms: int, limit: int = 10) -> list[str]:
        """Unfinished jobs whose owner's lease has expired (or which never had one), oldest lease first."""
        return self.leases.lapsed(now_ms, limit)

    def change(self, job_id: str, action: str, fields: Mapping[str, Any] | None = None, *, owner: str = "") -> str:
        """Take ``action`` (:data:`TRANSITIONS`); returns the new state, :class:`JobStateError` when it does not
        apply. ``owner``: only while that process holds the job (a runner ending its own job)."""
        sources, target = TRANSITIONS[action]
        args: list[Any] = [job_id, ",".join(sources), target, "1" if target in ENDED else "0", KEEP_SECONDS, owner]
        for name, value in (fields or {}).items():
            args += [name, "" if value is None else value]
        dlq = (self.get(job_id) or {}).get("dlq", "")
        ok, state = self.scripts.run("job_state", [self.keys.job(job_id), self.keys.job_lock(dlq),
                                                   self.keys.job_leases], args)
        if int(ok) != 1:
            if not as_text(state):
                raise JobStateError(f"no job {job_id}" if not owner else f"job {job_id} is no longer {owner}'s")
            next_state(as_text(state), action)   # raises, saying why
        return as_text(state)

    def set(self, job_id: str, fields: Mapping[str, Any]) -> None:
        """Set record fields (a runner's rate, ids left); the owner's alone to write."""
        if fields:
            self.client.hset(self.keys.job(job_id), mapping={k: "" if v is None else v for k, v in fields.items()})

    def claim(self, job_id: str, owner: str, now_ms: int, lease_ms: int, *, take: bool = True,
              counts: Mapping[str, int] | None = None) -> str | None:
        """Hold the job for ``lease_ms`` more: take it when its lease expired (``take``), else renew one's own,
        counting ``counts`` with it. Returns its state, or None when this process does not hold it."""
        args: list[Any] = [job_id, owner, now_ms, lease_ms, "take" if take else "renew"]
        for name, n in (counts or {}).items():
            if n:
                args += [name, int(n)]
        state = as_text(self.scripts.run("job_claim", [self.keys.job(job_id), self.keys.job_leases], args))
        return state or None
