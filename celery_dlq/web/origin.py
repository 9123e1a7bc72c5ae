"""Where a request comes from: its ``Host`` checked against the allowed hosts, its client and scheme behind proxies.

:class:`OriginMiddleware` is the outermost layer of the dashboard:

- **Allowed hosts.** A request whose ``Host`` header is not allowed is
  refused (400) before anything else, login or not: a DNS-rebinding page
  (``evil.example`` re-pointed at 127.0.0.1) sends ``Host: evil.example``
  and never reaches a page, so it can read neither data nor a CSRF token.
  An allowed host ``name`` matches any port, ``name:port`` that port only;
  ``*`` turns the check off, for a dashboard mounted in a site that checks
  ``Host`` itself (Django's ``ALLOWED_HOSTS``), never with ``no_auth``.
- **Trusted proxies.** Only when the direct peer is one of the proxies
  named (addresses or networks) are ``X-Forwarded-For`` and
  ``X-Forwarded-Proto`` believed: the client becomes the right-most address
  of ``X-Forwarded-For`` that is not itself a trusted proxy, the scheme the
  proxy's (so a cookie is ``Secure`` behind a TLS proxy). From any other
  peer they are ignored, and the request is marked
  (``request.state.untrusted_forwarding``): ``no_auth`` refuses it, since a
  proxy nobody named makes every client look local. A trusted proxy that
  sends no ``X-Forwarded-For`` marks the request too
  (``request.state.unforwarded``): ``no_auth`` refuses it, since its client
  would be the proxy itself (on the same host, a loopback address).
"""
from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable
from typing import Any

logger = logging.getLogger(__name__)

#: What ``create_app`` allows when not told: the loopback names, any port.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
FORWARDED = (b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host", b"forwarded", b"x-real-ip")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def split_host(host: str) -> tuple[str, str]:
    """``"Name:8080"`` -> ``("name", "8080")``; ``"[::1]:80"`` -> ``("[::1]", "80")``; no port -> ``""``."""
    host = host.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        name, rest = (host[:end + 1], host[end + 1:]) if end > 0 else (host, "")
        return name, rest[1:] if rest.startswith(":") else ""
    name, sep, port = host.rpartition(":")
    return (name, port) if sep and port.isdigit() and ":" not in name else (host, "")


def bind_hosts(bind: str, port: int) -> list[str]:
    """The hosts ``celery dlq web --bind BIND --port PORT`` allows by default: the bound address and loopback."""
    try:
        address = ipaddress.ip_address(bind)
        own = [] if address.is_unspecified else [f"[{bind}]" if address.version == 6 else bind]
    except ValueError:
        own = [bind]
    return [f"{name}:{port}" for name in dict.fromkeys([*own, *LOOPBACK_HOSTS])]


def parse_proxies(proxies: Iterable[str]) -> tuple[Network, ...]:
    """Addresses (``10.0.0.5``) or networks (``10.0.0.0/24``); anything else is a ``ValueError`` naming it."""
    out = []
    for proxy in proxies:
        try:
            out.append(ipaddress.ip_network(proxy.strip(), strict=False))
        except ValueError:
            raise ValueError(f"--trusted-proxy takes an IP address or network, not {proxy!r}") from None
    return tuple(out)


class Origin:
    """The allowed hosts and trusted proxies of one dashboard (pure: no ASGI)."""

    def __init__(self, allowed_hosts: Iterable[str] = LOOPBACK_HOSTS, trusted_proxies: Iterable[str] = ()) -> None:
        self.hosts = {split_host(h) for h in allowed_hosts}
        self.proxies = parse_proxies(trusted_proxies)

    @property
    def any_host(self) -> bool:
        return ("*", "") in self.hosts

    def host_allowed(self, host: str | None) -> bool:
        if self.any_host:
            return True
        if not host:
            return False
        name, port = split_host(host)
        return (name, port) in self.hosts or (name, "") in self.hosts

    def trusted(self, address: str | None) -> bool:
        try:
            ip = ipaddress.ip_address(address or "")
        except ValueError:
            return False
        return any(ip in network for network in self.proxies)

    def client(self, forwarded_for: list[str], peer: str) -> str:
        """The right-most address of ``X-Forwarded-For`` not itself a trusted proxy (the proxy's own peer if none)."""
        hops = [hop.strip() for value in forwarded_for for hop in value.split(",") if hop.strip()]
        for hop in reversed(hops):
            if not self.trusted(hop):
                return hop
        return hops[0] if hops else peer


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> list[str]:
    return [value.decode("latin-1") for key, value in headers if key.lower() == name]


class OriginMiddleware:
    """Pure ASGI: refuses a foreign ``Host`` (400), puts the real client and scheme in the scope, and adds
    :data:`SECURITY_HEADERS` to every response (pages, errors, static files, this 400)."""

    def __init__(self, app: Any, origin: Origin) -> None:
        self.app, self.origin = app, origin

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                present = {key.lower() for key, _ in message.get("headers") or []}
                message = dict(message, headers=[*(message.get("headers") or []),
                                                 *((k, v) for k, v in HEADERS_RAW if k not in present)])
            await send(message)

        headers = scope.get("headers") or []
        hosts = _header(headers, b"host")
        if len(hosts) != 1 or not self.origin.host_allowed(hosts[0]):
            logger.warning("celery-dlq web: refused %s %s: Host %r is not an allowed host", scope.get("method"),
                           scope.get("path"), ", ".join(hosts)[:200])
            await _refuse(send_with_headers)
            return
        await self.app(self._resolved(scope, headers), receive, send_with_headers)

    def _resolved(self, scope: dict, headers: list[tuple[bytes, bytes]]) -> dict:
        """The scope with the client and scheme a trusted proxy forwarded, or marked if another peer forwarded."""
        scope = dict(scope, state=dict(scope.get("state") or {}))
        peer = (scope.get("client") or ("", 0))[0]
        if self.origin.trusted(peer):
            forwarded_for = _header(headers, b"x-forwarded-for")
            if not any(hop.strip() for value in forwarded_for for hop in value.split(",")):
                scope["state"]["unforwarded"] = True    # the proxy's own address: no_auth refuses it
            scope["client"] = (self.origin.client(forwarded_for, peer), 0)
            proto = [p.strip().lower() for v in _header(headers, b"x-forwarded-proto") for p in v.split(",")]
            if proto and proto[-1] in ("http", "https"):
                scope["scheme"] = proto[-1]
        elif any(key.lower() in FORWARDED for key, _ in headers):
            scope["state"]["untrusted_forwarding"] = True
        return scope


async def _refuse(send: Any) -> None:
    body = b"400 Bad Request: the dashboard does not serve this host name (see --allowed-host)"
    await send({"type": "http.response.start", "status": 400,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


#: Sent with every response. No inline script or style anywhere (the one script is /static/refresh.js).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
HEADERS_RAW = [(k.lower().encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
