"""What a report run is asked for: paths, the as-of time, replay predicates, Spark settings.

No pyspark here: the command line builds these before any JVM starts.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone

from celery_dlq.errors import ConfigurationError
from celery_dlq.timespec import parse_duration, parse_moment

#: The report's former name of :func:`celery_dlq.timespec.parse_moment` (``--as-of``).
parse_time = parse_moment


def parse_conf(pairs: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """``k=v`` strings (``--conf``) as pairs, in order."""
    out = []
    for pair in pairs:
        key, sep, value = str(pair).partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"--conf takes key=value, got {pair!r}")
        out.append((key.strip(), value))
    return tuple(out)


@dataclass(frozen=True)
class ReportOptions:
    """One report run. ``as_of`` (default: now) is the end of the trend windows and of ``replay_max_age``.

    Replay predicates all apply (AND); within one, any value matches (OR).
    ``replay_exceptions`` match the full type name or its last part
    (``ValueError`` matches ``myapp.errors.ValueError``); ``replay_tasks`` are
    task names or wildcard patterns (``proj.*``, ``orders.#``).
    """

    in_path: str
    out_dir: str
    as_of: datetime | None = None
    replay_exceptions: tuple[str, ...] = ()
    replay_tasks: tuple[str, ...] = ()
    replay_max_age: float | None = None
    include_poison: bool = False
    poison_min_dead_letters: int = 2
    top: int = 10
    master: str | None = None
    conf: tuple[tuple[str, str], ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.in_path or not self.out_dir:
            raise ConfigurationError("both --in and --out are required")
        if self.poison_min_dead_letters < 2:
            raise ConfigurationError(f"--poison-min must be >= 2, got {self.poison_min_dead_letters!r}")
        if self.top < 1:
            raise ConfigurationError(f"--top must be >= 1, got {self.top!r}")
        object.__setattr__(self, "as_of", parse_moment(self.as_of) or datetime.now(timezone.utc))
        object.__setattr__(self, "replay_max_age", parse_duration(self.replay_max_age))
        object.__setattr__(self, "replay_exceptions", tuple(self.replay_exceptions))
        object.__setattr__(self, "replay_tasks", tuple(self.replay_tasks))

    @property
    def moment(self) -> datetime:
        """``as_of``, which ``__post_init__`` always sets."""
        assert self.as_of is not None
        return self.as_of

    @property
    def as_of_us(self) -> int:
        """``as_of`` in integer microseconds since the epoch."""
        delta = self.moment - datetime(1970, 1, 1, tzinfo=timezone.utc)
        return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds

    def predicates(self) -> dict:
        """The replay predicates as the plan's manifest records them."""
        return {"exception_types": list(self.replay_exceptions), "task_names": list(self.replay_tasks),
                "max_age_seconds": self.replay_max_age, "exclude_poison": not self.include_poison,
                "poison_min_dead_letters": self.poison_min_dead_letters}
