"""Which transport a worker's broker connections use: celery-dlq's fetch on a Redis broker.

The :class:`~celery_dlq.worker.steps.FetchTransport` bootstep calls
:func:`use_in_worker` before the consumer connects; the transport classes
are named here by their dotted paths, as Celery's ``broker_transport`` takes them.
"""
from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

#: ``broker_transport_options`` keys ``use_in_worker()`` sets for the worker's channels.
OPTION_RUNTIME, OPTION_PREFIX, OPTION_WAIT = "celery_dlq_runtime", "celery_dlq_key_prefix", "celery_dlq_fetch_wait"
OPTION_LISTENER, OPTION_INFLIGHT = "celery_dlq_fetch_listener", "celery_dlq_inflight_lease"
#: ``broker_transport`` values that select this transport (TCP or TLS; a Unix socket).
TRANSPORT, SOCKET_TRANSPORT = "celery_dlq.worker.transport:Transport", "celery_dlq.worker.transport:SocketTransport"
SENTINEL_TRANSPORT = "celery_dlq.worker.sentinel:SentinelTransport"
_REDIS_SCHEMES = ("redis://", "rediss://", "redis+socket://", "sentinel://")


def use_in_worker(app: Any, runtime: Any) -> bool:
    """Make the worker's broker connections use this transport, when the broker is Redis; returns whether it does.

    Called by the consumer bootstep, in the worker only, when the app's
    configuration is final. Off with ``dlq_fetch_transport = False``; left
    alone when the app chose a ``broker_transport`` of its own. A
    ``redis+socket://`` URL is given to kombu as ``socket://``, which kombu's
    Redis transport reads the same way (a scheme with ``+`` would select
    kombu's own transport by name).
    """
    conf = app.conf
    if not runtime.settings.fetch_transport or conf.broker_transport not in (None, "", "redis", "rediss",
                                                                              "sentinel"):
        return False
    urls = {name: conf.get(name) for name in ("broker_url", "broker_read_url")}
    if not isinstance(urls["broker_url"], str) or not urls["broker_url"].startswith(_REDIS_SCHEMES):
        return False
    socket_url = urls["broker_url"].startswith("redis+socket://")
    for name, url in urls.items():
        if isinstance(url, str) and url.startswith("redis+socket://"):
            conf[name] = ";".join(part.strip().replace("redis+socket://", "socket://", 1)
                                  for part in url.split(";"))
    sentinel = urls["broker_url"].startswith("sentinel://")
    conf.broker_transport = SENTINEL_TRANSPORT if sentinel else SOCKET_TRANSPORT if socket_url else TRANSPORT
    conf.broker_transport_options = {**(conf.broker_transport_options or {}), OPTION_RUNTIME: runtime.ident,
                                     OPTION_PREFIX: runtime.settings.key_prefix,
                                     OPTION_WAIT: runtime.settings.fetch_wait,
                                     OPTION_LISTENER: runtime.settings.fetch_listener,
                                     OPTION_INFLIGHT: runtime.settings.inflight_lease}
    logger.info("celery-dlq: the worker fetches with %s (validated, atomic fetch)", conf.broker_transport)
    return True


def uses_fetch(app: Any) -> bool:
    """Whether this worker's broker connections use celery-dlq's fetch (:func:`use_in_worker` chose it)."""
    return app.conf.broker_transport in (TRANSPORT, SOCKET_TRANSPORT, SENTINEL_TRANSPORT)
