"""The one lease: every lease of celery-dlq, taken, renewed and given up here (and in ``lua/lib.lua``'s ``lease_*``).

A lease has one owner until it expires. It is kept in one of two forms:

- **on its own key** (:class:`Lease`): a STRING holding the owner's id, its
  time to live what the lease has left. Acquire is ``SET NX PX`` (one
  command: NX is its owner check, it never takes a lease another holds, and
  a worker without the leader's lease beats with it, so it stays the
  cheapest command there is); renew and release are one script,
  ``lua/lease.lua`` (one command each), which acts only on the owner's own
  lease.
- **in an index** (:class:`LeaseIndex`): a ZSET of many leases, one member
  each, scored with the lease's expiry (or its start: an in-flight beat).
  Scripts that take, check or end such a lease inside a larger atomic step
  (a claim and its ack, a job's takeover, a give-back) call ``lib.lua``'s
  ``lease_hold``, ``lease_live``, ``lease_lapsed``, ``lease_end`` (owner-
  checked by a fencing token: the expiry its holder got) and ``lease_drop``;
  Python reads and beats through :class:`LeaseIndex`.

:data:`LEASES` lists every lease user; ``tests/unit/test_lease.py`` holds the
code to it. Public times are seconds; Redis holds milliseconds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from celery_dlq.storage.scripts import Scripts


@dataclass(frozen=True)
class LeaseUse:
    """One user of the lease: its name, the key (a :class:`~celery_dlq.storage.keys.Keys` attribute), its form
    (``"key"``: :class:`Lease`; ``"index"``: :class:`LeaseIndex` and ``lib.lua``), who owns it, who takes it."""

    name: str
    key: str
    form: str
    owner: str
    taken_in: tuple[str, ...]


#: Every lease celery-dlq takes (one place; a test holds the code to it).
LEASES: tuple[LeaseUse, ...] = (
    LeaseUse("leader", "mover_lease", "key", "a worker process: the one that runs the leader's duties",
             ("worker/leader/lease.py", "worker/park/mover.py")),
    LeaseUse("breaker release", "breaker_release", "key", "a thread pushing back what the fetch held of one task",
             ("worker/features/breaker.py",)),
    LeaseUse("claims", "leases", "index", "the mover that claimed the entry (its claim is the lease)",
             ("lua/claim_due.lua", "lua/move_due.lua", "lua/ack.lua", "lua/release.lua")),
    LeaseUse("jobs", "job_leases", "index", "the process running the job (``owner`` in its record)",
             ("lua/job_create.lua", "lua/job_claim.lua", "lua/job_state.lua", "storage/jobs.py")),
    LeaseUse("in-flight beats", "consumers", "index", "the worker process that fetched the messages",
             ("lua/fetch.lua", "lua/give_back.lua", "storage/inflight.py")),
)


class Lease:
    """A lease on its own key (``key``) for ``owner``, ``ttl_ms`` long from each acquire or renew."""

    def __init__(self, client: Any, key: str, owner: str, ttl_ms: int, scripts: Scripts | None = None) -> None:
        self.client, self.key, self.owner, self.ttl_ms = client, key, owner, int(ttl_ms)
        self._scripts = scripts if scripts is not None else Scripts(client)

    def _run(self, op: str) -> bool:
        return int(self._scripts.run("lease", [self.key], [op, self.owner, self.ttl_ms])) == 1

    def acquire(self) -> bool:
        """Take the lease if it is free; whether this owner took it (False while anyone holds it, this owner too:
        a holder renews)."""
        return bool(self.client.set(self.key, self.owner, nx=True, px=self.ttl_ms))

    def renew(self) -> bool:
        """Renew this owner's lease for ``ttl_ms`` more; False (nothing done) when another holds it or none does."""
        return self._run("renew")

    def release(self) -> bool:
        """Give this owner's lease up; False (nothing done) when another holds it or none does."""
        return self._run("release")


class LeaseIndex:
    """Many leases in one ZSET (``key``): member -> ms (an expiry, or for beats the lease's start)."""

    def __init__(self, client: Any, key: str) -> None:
        self.client, self.key = client, key

    def hold(self, member: str, at_ms: int) -> None:
        """``member``'s lease, scored ``at_ms`` (one command)."""
        self.client.zadd(self.key, {member: at_ms})

    def first(self) -> tuple[str, int] | None:
        """The member scored lowest (the first lease to run out), and its score; None when there is none."""
        first = self.client.zrange(self.key, 0, 0, withscores=True)
        return (_text(first[0][0]), int(first[0][1])) if first else None

    def members(self) -> list[tuple[str, int]]:
        """Every member and its score."""
        return [(_text(name), int(score)) for name, score in self.client.zrange(self.key, 0, -1, withscores=True)]

    def lapsed(self, upto_ms: int, limit: int, *, inclusive: bool = True) -> list[str]:
        """Up to ``limit`` members scored at most ``upto_ms`` (below it where not ``inclusive``), lowest first."""
        bound = upto_ms if inclusive else f"({upto_ms}"
        return [_text(name) for name in self.client.zrangebyscore(self.key, "-inf", bound, start=0, num=limit)]


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
