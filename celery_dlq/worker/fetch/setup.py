"""Which transport a worker's broker connections use (celery-dlq's fetch on a Redis broker), and what its channels get.

The :class:`~celery_dlq.worker.steps.FetchTransport` bootstep calls
:func:`use_in_worker` before the consumer connects; the transport classes
are named here by their dotted paths, as Celery's ``broker_transport`` takes them.

kombu makes the channels itself, from ``broker_transport`` and the
connection's transport options, so those options are the one way in. They
are also what a worker reports: Celery's ``inspect stats`` replies with the
broker connection's ``info()``, transport options included, encoded by the
control serializer (JSON by default). So the options carry only a name,
under :data:`OPTION_FETCH`: :func:`use_in_worker` registers the worker's
:class:`FetchContext` under a name of its app (:func:`hand_over`), and a
channel looks it up (:func:`context_of`). The registry lives only in the
worker's processes (prefork children are forked, never sent a pickled app);
a process that finds a name it does not know (a copy of a worker's
configuration elsewhere) gets the defaults.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from celery_dlq.policy import RedeliveryPolicy
from celery_dlq.worker.config import Config
from celery_dlq.worker.fetch.moves import FetchMoves, MoveTally, fetch_moves

if TYPE_CHECKING:
    from celery_dlq.worker.connections import Connections

logger = logging.getLogger(__name__)

#: The ``broker_transport_options`` key under which ``use_in_worker()`` names the channels' context (a string).
OPTION_FETCH = "celery_dlq_fetch"
#: ``broker_transport`` values that select this transport (TCP or TLS; a Unix socket).
TRANSPORT = "celery_dlq.worker.fetch.transport:Transport"
SOCKET_TRANSPORT = "celery_dlq.worker.fetch.transport:SocketTransport"
SENTINEL_TRANSPORT = "celery_dlq.worker.fetch.sentinel:SentinelTransport"
_REDIS_SCHEMES = ("redis://", "rediss://", "redis+socket://", "sentinel://")


@dataclass(frozen=True)
class FetchContext:
    """What a worker's fetch channels need of their app; a channel made without one (outside a worker) gets the
    defaults: no moves of due entries, invalid messages to ``DLQ.<queue>``, uncounted."""

    key_prefix: str = "celery_dlq"
    wait: float = 1.0                  #: ``dlq_fetch_wait``
    listener: bool = True              #: ``dlq_fetch_listener``
    inflight_lease: float = 10.0       #: ``dlq_inflight_lease``
    moves: FetchMoves | None = None    #: where a fetch moves due entries first (``worker/fetch/moves.py``)
    moved: MoveTally = field(default_factory=MoveTally, repr=False)   #: what they moved, until flushed
    config: Config | None = field(default=None, repr=False)
    #: This process's connections: where an invalid message's dead letter is counted.
    redis: Callable[[], Connections] | None = field(default=None, repr=False)
    #: Whether a fetch holds in Redis what an open circuit breaker holds (the broker is the store: ``Config.direct``).
    holds: bool = False

    @classmethod
    def of(cls, config: Config, redis: Callable[[], Connections], moved: MoveTally) -> FetchContext:
        settings = config.settings
        return cls(settings.key_prefix, settings.fetch_wait, settings.fetch_listener, settings.inflight_lease,
                   fetch_moves(settings, config.direct), moved, config, redis, config.direct and config.breakers)

    def policy(self, queue: str) -> RedeliveryPolicy:
        """The policy of ``queue`` for a message that names no task (an invalid one): where it is dead-lettered."""
        return RedeliveryPolicy() if self.config is None else self.config.settings.policy_for("", queue)


#: The contexts handed over, by name: one per app, replaced when the app hands over another.
_CONTEXTS: dict[str, FetchContext] = {}


def hand_over(context: FetchContext, owner: object) -> str:
    """Register ``context`` for ``owner`` (a worker's app); returns the name to put under :data:`OPTION_FETCH`,
    a string: what Celery's ``inspect stats`` and a dump of the configuration show."""
    name = f"{type(owner).__name__}@{id(owner):x}"
    _CONTEXTS[name] = context
    return name


def context_of(transport_options: Mapping[str, Any]) -> FetchContext:
    """The context of a channel with these transport options: the one handed over under their name, else the
    defaults (a channel made outside a worker)."""
    name = transport_options.get(OPTION_FETCH)
    if name is None:
        return FetchContext()
    context = _CONTEXTS.get(name) if isinstance(name, str) else None
    if context is None:
        logger.warning("celery-dlq: no fetch context named %r in this process (a copy of a worker's broker "
                       "transport options?): this channel fetches with the defaults", name)
        return FetchContext()
    return context


def use_in_worker(app: Any, context: FetchContext, enabled: bool = True) -> bool:
    """Make the worker's broker connections use this transport, when the broker is Redis; returns whether it does.

    Called by the consumer bootstep, in the worker only, when the app's
    configuration is final. Off with ``dlq_fetch_transport = False``
    (``enabled``); left alone when the app chose a ``broker_transport`` of
    its own. A ``redis+socket://`` URL is given to kombu as ``socket://``,
    which kombu's Redis transport reads the same way (a scheme with ``+``
    would select kombu's own transport by name).
    """
    conf = app.conf
    if not enabled or conf.broker_transport not in (None, "", "redis", "rediss", "sentinel"):
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
    conf.broker_transport_options = {**(conf.broker_transport_options or {}), OPTION_FETCH: hand_over(context, app)}
    logger.info("celery-dlq: the worker fetches with %s (validated, atomic fetch)", conf.broker_transport)
    return True


def uses_fetch(app: Any) -> bool:
    """Whether this worker's broker connections use celery-dlq's fetch (:func:`use_in_worker` chose it)."""
    return app.conf.broker_transport in (TRANSPORT, SOCKET_TRANSPORT, SENTINEL_TRANSPORT)
