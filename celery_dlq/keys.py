"""Every Redis key name and every Lua script of the extension, in one place.

Nothing else in the package builds a key or reads a ``.lua`` file, so the
layout of the data in Redis can be read from this module alone, and a change
of layout is a change of this module only.

All keys share the hash tag ``{<prefix>}``: on Redis Cluster they land on one
slot, which is what lets one Lua script touch several of them. Every key a
script uses is passed through ``KEYS``; no script builds a key name.
"""
from __future__ import annotations

import math
from functools import lru_cache
from importlib import resources
from typing import Any

from celery_dlq.errors import ConfigurationError

#: One script per operation; each is ``lua/<name>.lua``.
SCRIPT_NAMES = (
    "park",
    "claim_due",
    "ack",
    "release",
    "remove",
    "redeliver_one",
    "redeliver_all",
    "inspect",
    "page",
    "count",
    "next_due",
    "count_delivery",
    "replay_move",
)


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
        """ZSET entry_id -> due time (ms): parked entries waiting to be due."""
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
    def parked(self) -> str:
        """HASH queue -> number of entries parked or leased for that queue."""
        return self.base + ":parked"

    @property
    def stats(self) -> str:
        """HASH counter name -> integer (``dropped``, ``dead_lettered``, ...)."""
        return self.base + ":stats"

    @property
    def events(self) -> str:
        """STREAM, capped: the dead-letter archive (park, redelivery, dead letter, ...; ``events.py``)."""
        return self.base + ":events"

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

    def store_keys(self) -> tuple[str, str, str, str, str]:
        """The keys of the delayed store, in the order the store scripts take them."""
        return (self.delayed, self.leases, self.payloads, self.queues, self.parked)


@lru_cache(maxsize=None)
def script_source(name: str) -> str:
    """The text of ``lua/<name>.lua``, read from the package once per process."""
    if name not in SCRIPT_NAMES:
        raise KeyError(f"no Lua script named {name!r}")
    return resources.files("celery_dlq").joinpath("lua", f"{name}.lua").read_text("utf-8")


class Scripts:
    """The Lua scripts registered on one Redis client.

    ``client.register_script`` gives an object that runs EVALSHA and loads the
    script on NOSCRIPT, so a restarted or failed-over server costs one retry,
    not an error. Registration is cached here, per client: build one
    ``Scripts`` per client and keep it.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self._registered: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        script = self._registered.get(name)
        if script is None:
            script = self.client.register_script(script_source(name))
            self._registered[name] = script
        return script

    def run(self, name: str, keys: list[str] | tuple[str, ...], args: list[Any]) -> Any:
        """Run script ``name``; ``keys`` are every key it touches."""
        return self.get(name)(keys=list(keys), args=list(args))

    def count_delivery(self, key: str, floor: int, ttl_s: float) -> int:
        """Count a repeated delivery of one message instance and return its delivery number.

        For messages kombu marks ``redelivered`` only (see ``lua/count_delivery.lua``):
        a missing counter means the instance was delivered once, unrecorded,
        so this is ``floor + 1``. ``floor`` is the delivery number the
        message's own header claims: the count never drops below it, so a lost
        key never grants a message extra attempts.
        """
        if int(floor) < 1:
            raise ValueError(f"floor must be >= 1, got {floor!r}")
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s!r}")
        ttl = max(1, math.ceil(ttl_s))  # EXPIRE takes whole seconds
        return int(self.run("count_delivery", [key], [int(floor), ttl]))
