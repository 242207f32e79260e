"""The plain-HTTP side of the broker's port, and the gate every WebSocket handshake passes.

``route`` answers ``/healthz``, ``/metrics`` and the dashboard's files, and refuses a
handshake to ``/ws`` that must not become a socket (docs/protocol.md §1): a repeated
header, a ``Host`` that is not allowed (``admission``), a foreign ``Origin``, an unknown
bearer token, a full broker. ``None`` lets the handshake go on.
"""

from __future__ import annotations

import logging
from collections.abc import Sized
from http import HTTPStatus
from typing import Protocol

from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from ..sdk._wire import HEALTHZ_PATH, METRICS_PATH, WS_PATH, Role, encode
from . import __version__
from .admission import host_allowed
from .auth import bearer
from .config import Config
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import Metrics
from .static import StaticFiles
from .transport import Socket

__all__ = ["Site", "address", "route"]

log = logging.getLogger("conveyor")

# Headers whose meaning is one value: a second copy (a request smuggled past a proxy, or
# a probe) is refused rather than guessed at.
_SINGLE_HEADERS = ("Host", "Origin", "Authorization")

# The dashboard loads only its own files and talks only to its own broker.
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


class Site(Protocol):
    """What the HTTP side reads of the broker."""

    config: Config
    closing: bool
    metrics: Metrics
    static: StaticFiles
    per_address: dict[str, int]

    @property
    def connections(self) -> Sized: ...


def address(ws: Socket) -> str:
    """The peer's IP address (the per-address limit's key)."""
    peer = ws.remote_address
    return str(peer[0]) if isinstance(peer, tuple) and peer else str(peer)


def route(site: Site, connection: Socket, request: Request) -> Response | None:
    """The transport's router (``broker/transport.py``): an HTTP answer, or ``None`` to go
    on with the handshake."""
    path = request.path.split("?", 1)[0]
    config = site.config
    for name in _SINGLE_HEADERS:
        if len(request.headers.get_all(name)) > 1:
            repeated = f"{name}: the header must not repeat\n".encode()
            return _response(HTTPStatus.BAD_REQUEST, repeated, "text/plain")
    if not host_allowed(
        request.headers.get("Host"), bind_host=config.host, allowed=config.allowed_hosts
    ):
        log.info("refused a request for host %r", request.headers.get("Host", "")[:200])
        return _response(HTTPStatus.FORBIDDEN, b"host not allowed\n", "text/plain")
    if path == HEALTHZ_PATH:
        status = HTTPStatus.SERVICE_UNAVAILABLE if site.closing else HTTPStatus.OK
        body = {"status": "draining" if site.closing else "ok", "version": __version__}
        return _response(status, encode(body), "application/json")
    if path == METRICS_PATH:
        return _metrics_refusal(config, request.headers) or _response(
            HTTPStatus.OK, site.metrics.render(), METRICS_CONTENT_TYPE
        )
    if path != WS_PATH:
        found = site.static.get(path)
        if found is None:
            return _response(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8")
        content, content_type = found
        return _response(HTTPStatus.OK, content, content_type, static=True)
    return _handshake_refusal(site, connection, request.headers)


def _handshake_refusal(site: Site, connection: Socket, headers: Headers) -> Response | None:
    config = site.config
    if site.closing:
        return _response(HTTPStatus.SERVICE_UNAVAILABLE, b"shutting down\n", "text/plain")
    if "upgrade" not in ",".join(headers.get_all("Connection")).lower():
        return _response(
            HTTPStatus.UPGRADE_REQUIRED, b"this endpoint speaks WebSocket\n", "text/plain"
        )
    crowded = _connection_refusal(site, connection)
    if crowded is not None:
        return crowded
    origin = headers.get("Origin")
    if origin is not None and not _origin_allowed(config, origin, headers):
        log.info("refused a handshake from origin %r", origin[:200])
        return _response(HTTPStatus.FORBIDDEN, b"origin not allowed\n", "text/plain")
    token = bearer(headers)
    if token is not None and config.tokens and config.roles_for(token) is None:
        return _response(HTTPStatus.UNAUTHORIZED, b"unknown token\n", "text/plain")
    return None


def _metrics_refusal(config: Config, headers: Headers) -> Response | None:
    """With tokens set, a scrape needs a bearer token with the read role (or admin)."""
    if not config.tokens:
        return None
    token = bearer(headers)
    roles = config.roles_for(token) if token else None
    if not roles:
        response = _response(
            HTTPStatus.UNAUTHORIZED,
            b"a bearer token with the read role is required\n",
            "text/plain",
        )
        response.headers["WWW-Authenticate"] = 'Bearer realm="conveyor"'
        return response
    if Role.READ not in roles and Role.ADMIN not in roles:
        return _response(HTTPStatus.FORBIDDEN, b"this token lacks the read role\n", "text/plain")
    return None


def _connection_refusal(site: Site, connection: Socket) -> Response | None:
    """503 once the broker, or this peer's address, holds its most connections."""
    config = site.config
    if len(site.connections) >= config.max_connections:
        reason = f"at most {config.max_connections} connections\n"
    elif site.per_address.get(address(connection), 0) >= config.max_connections_per_address:
        reason = f"at most {config.max_connections_per_address} connections per address\n"
    else:
        return None
    log.info("refused a connection: %s", reason.strip())
    response = _response(HTTPStatus.SERVICE_UNAVAILABLE, reason.encode(), "text/plain")
    response.headers["Retry-After"] = "5"
    return response


def _origin_allowed(config: Config, origin: str, headers: Headers) -> bool:
    if origin in config.origins:
        return True
    host = headers.get("Host")
    scheme = "https" if config.secure else "http"
    return host is not None and origin == f"{scheme}://{host}"


def _response(
    status: HTTPStatus, body: bytes, content_type: str, *, static: bool = False
) -> Response:
    headers = Headers(
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            # Dashboard files revalidate on every load (an upgrade shows at once); the rest
            # is live data, never cached.
            ("Cache-Control", "no-cache" if static else "no-store"),
            ("X-Content-Type-Options", "nosniff"),
        ]
    )
    if static:
        headers["Content-Security-Policy"] = _CSP
        headers["X-Frame-Options"] = "DENY"
    return Response(status.value, status.phrase, headers, body)
