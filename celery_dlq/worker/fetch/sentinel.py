"""celery-dlq's worker transport on a ``sentinel://`` broker: kombu's Sentinel pool, celery-dlq's fetch.

kombu's ``SentinelChannel`` asks the sentinels for the master whenever it
connects, so after a failover the worker's next connection goes to the new
master; the channel of :mod:`celery_dlq.worker.fetch.transport` gives the fetch
(one Lua script, messages never only in memory) and the recovery of fetched
messages on reconnect.
"""
from __future__ import annotations

from kombu.transport import redis as kombu_redis

from celery_dlq.worker.fetch.transport import Channel


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """celery-dlq's fetch on the master that Redis Sentinel names."""


class SentinelTransport(kombu_redis.SentinelTransport):
    """kombu's Sentinel transport with celery-dlq's channel (``broker_transport`` for a ``sentinel://`` broker)."""

    Channel = SentinelChannel
