"""Redis connections: ours (``dlq_redis_url``) and the broker's, where DLQs are kombu lists.

A ``sentinel://`` URL (:mod:`celery_dlq.urls`) gives a client on the master
the sentinels name: redis-py's Sentinel pool asks them again after a
connection error, so a client finds the new master after a failover without
a restart.
"""
from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry
from redis.sentinel import Sentinel

from celery_dlq.errors import BrokerNotSupported
from celery_dlq.settings import REDIS_SCHEMES, client_url
from celery_dlq.storage.scripts import Scripts
from celery_dlq.urls import canonical, is_sentinel, parse, sanitize


def open_client(url: str, cluster: bool = False, **kwargs: Any) -> Any:
    """A bytes client on ``url`` (Redis, the master a Sentinel URL names, or with ``cluster`` a Redis Cluster).

    A Redis Cluster client routes each command and script by its keys' slot:
    every key of the store shares one hash tag, so each script runs on one node.
    """
    if cluster:
        kwargs.pop("health_check_interval", None)
        return RedisCluster.from_url(client_url(url), **kwargs)
    if not is_sentinel(url):
        return redis.Redis.from_url(client_url(url), **kwargs)
    spec = parse(url)
    sentinel_kwargs = {"socket_connect_timeout": kwargs.get("socket_connect_timeout", 5),
                       "socket_timeout": 5}
    if spec.sentinel_password is not None:
        sentinel_kwargs["password"] = spec.sentinel_password
    sentinel = Sentinel(list(spec.sentinels), sentinel_kwargs=sentinel_kwargs)
    return sentinel.master_for(spec.master_name, db=spec.db, username=spec.username, password=spec.password,
                               **kwargs)


def connect(url: str, cluster: bool = False) -> Any:
    """A bytes client that fails fast: an operator wants an error, not a hang."""
    return open_client(url, cluster, socket_connect_timeout=5, socket_timeout=30)


def worker_client(url: str, cluster: bool = False) -> Any:
    """A bytes client for a worker: checks its connection when idle, waits as long as Redis takes."""
    return open_client(url, cluster, health_check_interval=30)


def blocking_client(url: str, wait: float, cluster: bool = False) -> Any:
    """A worker's client for blocking waits of up to ``wait`` seconds (redis-py 8's socket timeout, 5 s by
    default, would cut them short); a reply later than that by 5 s is a dead connection."""
    return open_client(url, cluster, health_check_interval=30, socket_timeout=wait + 5)


def broker_url(conf: Any) -> str:
    """The broker URL of an app's ``conf``, when it is Redis (or Sentinel); else :class:`BrokerNotSupported`."""
    url = conf.broker_write_url or conf.broker_url
    if isinstance(url, (list, tuple)):
        url = url[0] if url else None
    if is_sentinel(url):
        return canonical(url, conf.broker_transport_options or {})
    url = client_url(url) if isinstance(url, str) else url
    if not (isinstance(url, str) and url.startswith(REDIS_SCHEMES)):
        shown = sanitize(url) if isinstance(url, str) else "amqp:// (Celery's default)"
        raise BrokerNotSupported(f"dead letters can only be managed on a Redis broker; the broker is {shown}")
    return url


def broker_client(conf: Any, client: Any, redis_url: str) -> Any:
    """A client on the broker's Redis: ``client`` itself when it is ``redis_url``'s and that is the broker."""
    url = broker_url(conf)
    return client if url == redis_url else connect(url)


def listener_client(url: str) -> Any:
    """A client on the broker for the fetch listener: RESP2, whose pub/sub connection receives key
    invalidations as messages (redis-py 8 speaks RESP3 by default, where they arrive as pushes only its own
    cache handles), and no retries, so that no connection comes back silently without its tracking."""
    return open_client(url, socket_connect_timeout=5, socket_timeout=30, protocol=2, retry=Retry(NoBackoff(), 0))


class BrokerLink:
    """The broker's Redis (where DLQs are lists) and the scripts on it, connected on first use unless given.

    ``client`` is the store's (``redis_url``'s): it serves as the broker's when they are one server.
    :class:`BrokerNotSupported` on first use when the broker is not Redis.
    """

    def __init__(self, conf: Any, client: Any, redis_url: str, broker: Any = None) -> None:
        self._conf, self._client, self._redis_url, self._broker = conf, client, redis_url, broker
        self._scripts: Scripts | None = None
        self._on_redis: bool | None = True if broker is not None else None

    @property
    def client(self) -> Any:
        if self._broker is None:
            self._broker = broker_client(self._conf, self._client, self._redis_url)
        return self._broker

    def on_redis(self) -> bool:
        """Whether the broker is Redis (connects on first call; remembers a :class:`BrokerNotSupported`)."""
        if self._on_redis is None:
            try:
                _ = self.client
                self._on_redis = True
            except BrokerNotSupported:
                self._on_redis = False
        return self._on_redis

    @property
    def scripts(self) -> Scripts:
        if self._scripts is None:
            self._scripts = Scripts(self.client)
        return self._scripts
