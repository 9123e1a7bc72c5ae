"""Redis connections: ours (``dlq_redis_url``) and the broker's, where DLQs are kombu lists."""
from __future__ import annotations

from typing import Any

import redis
from kombu.utils.url import maybe_sanitize_url

from celery_dlq.errors import BrokerNotSupported
from celery_dlq.settings import REDIS_SCHEMES, client_url


def connect(url: str) -> redis.Redis:
    """A bytes client that fails fast: an operator wants an error, not a hang."""
    return redis.Redis.from_url(client_url(url), socket_connect_timeout=5, socket_timeout=30)


def worker_client(url: str) -> redis.Redis:
    """A bytes client for a worker: checks its connection when idle, waits as long as Redis takes."""
    return redis.Redis.from_url(client_url(url), health_check_interval=30)


def broker_url(conf: Any) -> str:
    """The broker URL of an app's ``conf``, when it is Redis; else :class:`BrokerNotSupported`."""
    url = conf.broker_write_url or conf.broker_url
    if isinstance(url, (list, tuple)):
        url = url[0] if url else None
    url = client_url(url) if isinstance(url, str) else url
    if not (isinstance(url, str) and url.startswith(REDIS_SCHEMES)):
        shown = maybe_sanitize_url(url) if isinstance(url, str) else "amqp:// (Celery's default)"
        raise BrokerNotSupported(f"dead letters can only be managed on a Redis broker; the broker is {shown}")
    return url


def broker_client(conf: Any, client: Any, redis_url: str) -> Any:
    """A client on the broker's Redis: ``client`` itself when it is ``redis_url``'s and that is the broker."""
    url = broker_url(conf)
    return client if url == redis_url else connect(url)
