"""The only reader of ``app.conf`` ``dlq_*`` settings: defaults, validation, policy resolution.

Every error names the setting (and the pattern and field where there is one),
and happens when :func:`celery_dlq.install` runs or the worker starts, never
at the first failure. Unknown ``dlq_*`` names are errors too: a typo in a
setting name would otherwise silently fall back to a default.
"""
from __future__ import annotations

import difflib
import math
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

from celery_dlq.errors import ConfigurationError
from celery_dlq.matching import PatternMap, merge_fields
from celery_dlq.policy import FIELD_PATHS, RedeliveryPolicy, validate_fields
from celery_dlq.tasklevel import TASK_POLICY, Level, is_task_level
from celery_dlq.urls import canonical, is_sentinel, sanitize

#: The origin ``celery dlq policy`` names for a field no level sets.
BUILT_IN = "built-in default"

DAY = 86400.0

#: setting name -> default. Times are seconds.
DEFAULTS: dict[str, Any] = {
    "dlq_default_policy": None,
    "dlq_task_policies": None,
    "dlq_queue_policies": None,
    "dlq_redis_url": None,          # None: the broker URL when the broker is Redis
    "dlq_key_prefix": "celery_dlq",
    "dlq_mover_interval": 0.2,      # the moving worker's longest wait where it cannot block (several shards)
    "dlq_mover_lease": 10.0,        # one worker moves; another takes over at most this long after it dies
    "dlq_heartbeat_interval": None,  # every worker beats (takes a free mover lease) this often: lease/4, <= 2.5
    "dlq_mover_batch_size": 100,    # entries claimed per Redis round trip
    "dlq_inflight_lease": 10.0,     # a worker that has not beaten this long is gone: its fetched messages go back
    "dlq_claim_lease": 30.0,        # a claimed entry becomes due again if not published by then
    "dlq_delivery_count_ttl": 7 * DAY,  # a delivery counter outlives the last delivery this long
    "dlq_audit_ttl": 7 * DAY,       # how long "this delivery was dead-lettered" is remembered
    "dlq_events_max_length": 100_000,  # events kept in the archive stream (XADD MAXLEN ~); 0: no archive
    "dlq_fetch_transport": True,    # on a Redis broker, the worker fetches with celery-dlq's transport
    "dlq_fetch_wait": 1.0,          # idle: longest blocking wait before the fetch looks at every list again;
                                    # kept below kombu's health check of a blocked fetch (internals.kombu_redis)
    "dlq_fetch_listener": True,     # one worker hears pushes and wakes one idle fetch per message (Redis broker)
    "dlq_fetch_moves_due": True,    # a fetch first moves due parked retries of its own queues (Redis broker)
    "dlq_web_token": None,          # the web dashboard's token (celery dlq web); CELERY_DLQ_WEB_TOKEN wins
    "dlq_redis_cluster": False,     # dlq_redis_url names a node of a Redis Cluster (redis-py's RedisCluster)
    "dlq_store_shards": 1,          # the store split over N hash tags ({prefix:0} ...): spread over a Redis Cluster
    "dlq_store_min_replicas": 0,    # WAIT for this many replicas after parks and moves (0: never)
    "dlq_store_replica_timeout": 1.0,  # the longest WAIT, seconds
    "dlq_jobs_poll": 5.0,           # a worker looks this often for redrive jobs nobody runs (0: it runs none)
    "dlq_breaker_refresh": 1.0,     # a worker reads the breakers' index at most this often (tasks with a breaker)
}

#: Settings that no longer have an effect -> why. Each gives a DeprecationWarning; the next release refuses them.
REMOVED: dict[str, str] = {
    "dlq_fetch_notifications": "the fetch listener needs no keyspace notifications",
}

REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "redis+socket://")


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{name} must be a number of seconds > 0, got {value!r}")
    return float(value)


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name} must be an integer >= 1, got {value!r}")
    return value


def _count_or_zero(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True or False, got {value!r}")
    return value


def _policy_fields(value: Any, where: str) -> dict[str, Any]:
    return {} if value is None else validate_fields(value, where)


@dataclass
class DLQSettings:
    """Validated ``dlq_*`` settings of one app. Build with :meth:`from_conf`."""

    #: The store's URL; None when the broker is not Redis and ``dlq_redis_url`` is unset (see :attr:`redis_url`).
    store_url: str | None
    key_prefix: str
    global_keyprefix: str
    mover_interval: float
    mover_lease: float
    heartbeat_interval: float
    mover_batch_size: int
    claim_lease: float
    inflight_lease: float
    delivery_count_ttl: float
    audit_ttl: float
    events_max_length: int
    fetch_transport: bool
    fetch_wait: float
    fetch_listener: bool
    fetch_moves_due: bool
    redis_cluster: bool
    store_shards: int
    store_min_replicas: int
    store_replica_timeout: float
    jobs_poll: float
    breaker_refresh: float
    default_policy: dict[str, Any]
    task_policies: PatternMap
    queue_policies: PatternMap
    _broker_shown: Any = field(default=None, repr=False)
    _cache: dict = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any]) -> DLQSettings:
        check_unknown(conf)
        get = lambda name: conf.get(name, DEFAULTS[name])  # noqa: E731
        prefix = get("dlq_key_prefix")
        if not isinstance(prefix, str) or not prefix or any(c in prefix for c in "{}"):
            raise ConfigurationError(
                f"dlq_key_prefix must be a non-empty string without braces, got {prefix!r}")
        mover_lease = _positive("dlq_mover_lease", get("dlq_mover_lease"))
        heartbeat = get("dlq_heartbeat_interval")
        heartbeat = min(2.5, mover_lease / 4) if heartbeat is None else _positive("dlq_heartbeat_interval", heartbeat)
        if heartbeat * 3 > mover_lease:
            raise ConfigurationError(f"dlq_heartbeat_interval ({heartbeat:g}) must be at most a third of "
                                     f"dlq_mover_lease ({mover_lease:g}): the holder renews the lease at each beat")
        inflight_lease = _positive("dlq_inflight_lease", get("dlq_inflight_lease"))
        if heartbeat * 3 > inflight_lease:
            raise ConfigurationError(f"dlq_heartbeat_interval ({heartbeat:g}) must be at most a third of "
                                     f"dlq_inflight_lease ({inflight_lease:g}): a worker holding messages beats "
                                     f"at each interval")
        return cls(
            store_url=_redis_url(conf),
            key_prefix=prefix,
            global_keyprefix=_global_keyprefix(conf),
            mover_interval=_positive("dlq_mover_interval", get("dlq_mover_interval")),
            mover_lease=mover_lease,
            heartbeat_interval=heartbeat,
            mover_batch_size=_count("dlq_mover_batch_size", get("dlq_mover_batch_size")),
            claim_lease=_positive("dlq_claim_lease", get("dlq_claim_lease")),
            inflight_lease=inflight_lease,
            delivery_count_ttl=_positive("dlq_delivery_count_ttl", get("dlq_delivery_count_ttl")),
            audit_ttl=_positive("dlq_audit_ttl", get("dlq_audit_ttl")),
            events_max_length=_count_or_zero("dlq_events_max_length", get("dlq_events_max_length")),
            fetch_transport=_flag("dlq_fetch_transport", get("dlq_fetch_transport")),
            fetch_wait=_positive("dlq_fetch_wait", get("dlq_fetch_wait")),
            fetch_listener=_flag("dlq_fetch_listener", get("dlq_fetch_listener")),
            fetch_moves_due=_flag("dlq_fetch_moves_due", get("dlq_fetch_moves_due")),
            redis_cluster=_cluster(conf, _flag("dlq_redis_cluster", get("dlq_redis_cluster"))),
            store_shards=_count("dlq_store_shards", get("dlq_store_shards")),
            store_min_replicas=_count_or_zero("dlq_store_min_replicas", get("dlq_store_min_replicas")),
            store_replica_timeout=_positive("dlq_store_replica_timeout", get("dlq_store_replica_timeout")),
            jobs_poll=0.0 if get("dlq_jobs_poll") == 0 else _positive("dlq_jobs_poll", get("dlq_jobs_poll")),
            breaker_refresh=_positive("dlq_breaker_refresh", get("dlq_breaker_refresh")),
            default_policy=_policy_fields(get("dlq_default_policy"), "dlq_default_policy"),
            task_policies=PatternMap.from_mapping(get("dlq_task_policies"), "dlq_task_policies", _policy_fields),
            queue_policies=PatternMap.from_mapping(get("dlq_queue_policies"), "dlq_queue_policies", _policy_fields),
            _broker_shown=_shown_broker(conf),
        )

    @property
    def redis_url(self) -> str:
        """The store's Redis URL: needed by a worker and the operator tools, not by ``install()``.

        An app whose broker is not Redis (``memory://`` in its unit tests,
        with ``task_always_eager``) installs celery-dlq without one; whatever
        then needs Redis raises :class:`ConfigurationError` naming ``dlq_redis_url``.
        """
        if self.store_url is None:
            raise ConfigurationError(
                f"dlq_redis_url is required when the broker is not Redis (broker_url is {self._broker_shown!r})")
        return self.store_url

    @property
    def safe_redis_url(self) -> str:
        """The Redis URL with any password masked, for logs and errors."""
        return sanitize(self.store_url) if self.store_url else "(no dlq_redis_url)"

    def levels(self, task_name: str, queue: str | None,
               task_levels: Iterable[Level] | Mapping[str, Any] = ()) -> list[Level]:
        """Every level that may give ``task_name`` on ``queue`` a field, highest first, each ``(origin, fields)``.

        The task's own levels (:func:`celery_dlq.tasklevel.task_levels`; a
        plain mapping is taken as its ``redelivery_policy``), then
        ``dlq_task_policies`` (by task name, most specific pattern first),
        then ``dlq_queue_policies`` (by queue), then ``dlq_default_policy``.
        """
        if isinstance(task_levels, Mapping):
            task_levels = [(TASK_POLICY, task_levels)]
        levels = list(task_levels)
        levels += [(f"dlq_task_policies[{pattern.text!r}]", fields)
                   for pattern, fields in self.task_policies.matching_items(task_name)]
        if queue is not None:
            levels += [(f"dlq_queue_policies[{pattern.text!r}]", fields)
                       for pattern, fields in self.queue_policies.matching_items(queue)]
        levels.append(("dlq_default_policy", self.default_policy))
        return levels

    def policy_for(self, task_name: str, queue: str | None,
                   task_levels: Callable[[], Iterable[Level] | Mapping[str, Any]] = list) -> RedeliveryPolicy:
        """The effective policy for a (task, queue) pair, computed once and cached.

        Merged field by field, the highest level that sets a field winning
        (:meth:`levels`), then the field defaults.
        """
        key = (task_name, queue)
        policy = self._cache.get(key)
        if policy is None:
            policy, _ = self.explain(task_name, queue, task_levels())
            with self._lock:
                self._cache[key] = policy
        return policy

    def explain(self, task_name: str, queue: str | None,
                task_levels: Iterable[Level] | Mapping[str, Any] = ()) -> tuple[RedeliveryPolicy, dict[str, str]]:
        """The effective policy and, for every field, the level it came from (``celery dlq policy``).

        The origins are keyed by :data:`celery_dlq.policy.FIELD_PATHS`: ``breaker.window`` and so on for
        the nested breaker, whose options merge one by one.
        """
        levels = self.levels(task_name, queue, task_levels)
        merged = merge_fields(fields for _, fields in levels)
        where = f"policy for task {task_name!r} on queue {queue!r}"
        try:
            policy = RedeliveryPolicy(**merged)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{where}: {exc}") from None
        origins: dict[str, str] = {}    # by field path: "breaker.window" for an option of the nested breaker
        for origin, fields in levels:
            for name, value in fields.items():
                for path in ([f"{name}.{key}" for key in value] if isinstance(value, Mapping) else [name]):
                    origins.setdefault(path, origin)
        for path in FIELD_PATHS:
            origins.setdefault(path, BUILT_IN)
        if "max_redelivery_delay" not in merged:
            origins["max_redelivery_delay"] = f"{BUILT_IN} (10 x redelivery_delay)"
        return policy, origins

    def capped_delays(self, task_name: str, queue: str | None, task_levels: Iterable[Level]) -> list[str]:
        """Warnings for a task whose own ``redelivery_delay`` is cut by a ``max_redelivery_delay`` it did not set."""
        levels = list(task_levels)
        if not levels:
            return []
        policy, origins = self.explain(task_name, queue, levels)
        delay_origin, cap_origin = origins["redelivery_delay"], origins["max_redelivery_delay"]
        cap = policy.max_redelivery_delay   # never None once built (10 x redelivery_delay by default)
        if not is_task_level(delay_origin) or is_task_level(cap_origin) or cap is None \
                or not cap < policy.redelivery_delay:
            return []
        return [f"task {task_name!r} on queue {queue!r}: redelivery_delay={policy.redelivery_delay:g} "
                f"({delay_origin}) is capped to {cap:g} s by max_redelivery_delay "
                f"from {cap_origin}; set max_redelivery_delay on the task to keep its delay"]


def check_unknown(conf: Mapping[str, Any]) -> None:
    """Refuse ``dlq_*`` names we do not know, suggesting the closest one; warn of :data:`REMOVED` ones."""
    for name in list(conf.keys()):
        if name in REMOVED:
            warnings.warn(f"{name} has no effect ({REMOVED[name]}) and will be an error in the next release: "
                          f"remove it", DeprecationWarning, stacklevel=3)
        elif isinstance(name, str) and name.startswith("dlq_") and name not in DEFAULTS:
            close = difflib.get_close_matches(name, list(DEFAULTS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigurationError(f"unknown setting {name!r}{hint}")


def _global_keyprefix(conf: Mapping[str, Any]) -> str:
    options = conf.get("broker_transport_options") or {}
    return options.get("global_keyprefix") or ""


def client_url(url: str) -> str:
    """One URL redis-py can open, from any Redis URL kombu accepts.

    kombu takes a ``;``-separated failover list (the first is where it
    connects) and ``redis+socket://`` for a Unix socket; redis-py takes one
    URL and calls that scheme ``unix://``.
    """
    if is_sentinel(url):
        return url.strip()   # every sentinel counts: see celery_dlq.urls
    url = url.split(";")[0].strip()
    if url.startswith("redis+socket://"):
        url = "unix://" + url[len("redis+socket://"):].replace("virtual_host=", "db=")
    return url


def _redis_url(conf: Mapping[str, Any]) -> str | None:
    """``dlq_redis_url`` (validated), else the broker's URL when it is Redis or Sentinel, else None.

    A ``sentinel://`` URL comes back in its one-string form, with the
    ``master_name`` (and sentinel password) of ``broker_transport_options``
    folded in (:mod:`celery_dlq.urls`), so the store follows the master
    through failovers.
    """
    options = conf.get("broker_transport_options") or {}
    url = conf.get("dlq_redis_url")
    if url is not None:
        if is_sentinel(url):
            return canonical(url, options)
        if not isinstance(url, str) or not client_url(url).startswith(REDIS_SCHEMES):
            shown = sanitize(client_url(str(url)))
            raise ConfigurationError(
                f"dlq_redis_url must be a redis://, rediss://, unix:// or sentinel:// URL, got {shown!r}")
        return client_url(url)
    broker = _broker(conf)
    if is_sentinel(broker):
        return canonical(broker, options)
    if isinstance(broker, str) and client_url(broker).startswith(REDIS_SCHEMES):
        return client_url(broker)
    return None


def _cluster(conf: Mapping[str, Any], on: bool) -> bool:
    """``dlq_redis_cluster`` needs a store of its own: a ``redis://`` or ``rediss://`` ``dlq_redis_url``."""
    url = conf.get("dlq_redis_url")
    if on and not (isinstance(url, str) and url.startswith(("redis://", "rediss://"))):
        raise ConfigurationError("dlq_redis_cluster = True needs dlq_redis_url naming a node of the cluster "
                                 "(redis:// or rediss://); kombu's broker cannot be a Redis Cluster")
    return on


def _broker(conf: Mapping[str, Any]) -> Any:
    broker = conf.get("broker_url")
    if isinstance(broker, (list, tuple)):
        broker = broker[0] if broker else None
    return broker


def _shown_broker(conf: Mapping[str, Any]) -> Any:
    broker = _broker(conf)
    return sanitize(client_url(broker)) if isinstance(broker, str) else broker


def web_token(conf: Mapping[str, Any]) -> str | None:
    """The dashboard's token (``dlq_web_token``): a non-empty string, or None."""
    token = conf.get("dlq_web_token")
    if token is not None and not (isinstance(token, str) and token):
        raise ConfigurationError("dlq_web_token must be a non-empty string (or None)")
    return token
