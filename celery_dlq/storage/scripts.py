"""Every Lua script of celery-dlq (``redis/lua/<name>.lua``), registered once per client.

Each script opens with a table of the keys it takes (all through ``KEYS``,
so Redis Cluster can route it) and its arguments. Nothing else reads a
``.lua`` file.
"""
from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

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
    "fetch",
    "reject_invalid",
    "release_quarantine",
    "move_due",
    "dead_letter",
    "replay_batch",
    "remove_letters",
    "find_letter",
    "trend",
    "lease",
    "give_back",
    "mark_queues",
    "append_events",
    "chord_hold",
    "chord_dying",
    "chord_settle",
    "chord_park_unlock",
    "job_create",
    "job_state",
    "job_claim",
    "release_held",
    "login_take",
    "login_succeeded",
)
#: Prepended to every script: the parked payload formats and the failure-group index (``lua/lib.lua``).
PRELUDE = "lib"


@cache
def script_body(name: str) -> str:
    """The text of ``lua/<name>.lua`` alone, read from the package once per process."""
    if name not in SCRIPT_NAMES and name != PRELUDE:
        raise KeyError(f"no Lua script named {name!r}")
    return resources.files("celery_dlq.storage").joinpath("lua").joinpath(f"{name}.lua").read_text("utf-8")


def script_source(name: str) -> str:
    """What runs in Redis for script ``name``: the prelude (``lua/lib.lua``), then ``lua/<name>.lua``."""
    if name not in SCRIPT_NAMES:
        raise KeyError(f"no Lua script named {name!r}")
    return script_body(PRELUDE) + script_body(name)


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
