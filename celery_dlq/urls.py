"""Redis Sentinel URLs: ``sentinel://`` as kombu writes them, parsed once, shown without secrets.

kombu's Redis Sentinel broker URL is a ``;``-separated list of sentinels
(``sentinel://:pw@10.0.0.1:26379;sentinel://:pw@10.0.0.2:26379/0``) with the
master's name and the sentinels' own password in ``broker_transport_options``
(``master_name``, ``sentinel_kwargs``). celery-dlq's store URL carries them in
its query (``?master_name=mymaster``), so one string names a Sentinel-managed
Redis wherever a URL is passed; :func:`canonical` builds it from either form.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from kombu.utils.url import maybe_sanitize_url

from celery_dlq.errors import ConfigurationError

SCHEME = "sentinel://"
DEFAULT_PORT = 26379


def is_sentinel(url: Any) -> bool:
    return isinstance(url, str) and url.strip().startswith(SCHEME)


@dataclass(frozen=True)
class SentinelSpec:
    """Where the sentinels are and which master they watch."""

    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None            # the master's (and replicas') password
    sentinel_password: str | None = None   # the sentinels' own, when they have one

    def url(self) -> str:
        """The one-string form: every sentinel, the db, ``master_name`` (and ``sentinel_password``) in the query."""
        auth = ""
        if self.password is not None:
            auth = f"{quote(self.username or '', safe='')}:{quote(self.password, safe='')}@"
        parts = [f"{SCHEME}{auth}{host}:{port}" for host, port in self.sentinels]
        query = {"master_name": self.master_name}
        if self.sentinel_password is not None:
            query["sentinel_password"] = self.sentinel_password
        parts[-1] += f"/{self.db}?{urlencode(query)}"
        return ";".join(parts)


def parse(url: str, options: Mapping[str, Any] | None = None) -> SentinelSpec:
    """A ``sentinel://`` URL (``;``-separated sentinels) and kombu's transport options, as a :class:`SentinelSpec`.

    ``master_name`` and ``sentinel_password`` in the URL's query win over
    ``options["master_name"]`` and ``options["sentinel_kwargs"]["password"]``.
    """
    options = options or {}
    sentinels: list[tuple[str, int]] = []
    db, username, password = 0, None, None
    query: dict[str, str] = {}
    for part in (p.strip() for p in url.split(";")):
        if not part:
            continue
        if not part.startswith(SCHEME):
            raise ConfigurationError(f"every part of a Sentinel URL must be sentinel://, got {sanitize(part)!r}")
        split = urlsplit(part)
        try:
            port = split.port or DEFAULT_PORT
        except ValueError:
            raise ConfigurationError(f"bad port in Sentinel URL {sanitize(part)!r}") from None
        if not split.hostname:
            raise ConfigurationError(f"no host in Sentinel URL {sanitize(part)!r}")
        sentinels.append((split.hostname, port))
        if split.password is not None and password is None:
            username, password = (unquote(split.username) if split.username else None), unquote(split.password)
        if split.path.strip("/"):
            try:
                db = int(split.path.strip("/"))
            except ValueError:
                raise ConfigurationError(f"bad database number in Sentinel URL {sanitize(part)!r}") from None
        query.update(parse_qsl(split.query))
    if not sentinels:
        raise ConfigurationError("a Sentinel URL names no sentinel")
    master_name = query.get("master_name") or options.get("master_name")
    if not master_name:
        raise ConfigurationError(f"{sanitize(url)!r} needs master_name (in broker_transport_options, "
                                 "or ?master_name= in the URL)")
    sentinel_password = query.get("sentinel_password") or (options.get("sentinel_kwargs") or {}).get("password")
    return SentinelSpec(tuple(sentinels), str(master_name), db, username, password, sentinel_password)


def canonical(url: str, options: Mapping[str, Any] | None = None) -> str:
    """The one-string form of a Sentinel URL with kombu's transport options folded in."""
    return parse(url, options).url()


_SECRET_QUERY = re.compile(r"(sentinel_password=)[^&;]*")


def sanitize(url: Any) -> str:
    """Any Redis or Sentinel URL with its passwords masked, each ``;``-separated part alike."""
    if not isinstance(url, str):
        return str(url)
    parts = [maybe_sanitize_url(part.strip()) for part in url.split(";")]
    return _SECRET_QUERY.sub(r"\1**", ";".join(parts))
