"""Which HTTP requests the broker's port serves at all: the Host rule against DNS rebinding.

A browser page on ``evil.example`` whose name its owner points at 127.0.0.1 can reach a
broker on loopback, and its requests then carry ``Host: evil.example:8765`` (and a
matching ``Origin``, which passes a same-origin check). What such a page cannot do is
send the name of the broker's own host. So the ``Host`` header is held to a list:

- IP literals (``127.0.0.1:8765``, ``[::1]``): a name is what rebinding needs;
- loopback names: ``localhost`` and any ``*.localhost`` (RFC 6761 keeps them local);
- the operator's ``--allowed-host`` names (``*`` allows any, ``.example.com`` a
  domain and its subdomains).

A broker bound to a non-loopback address with no allow-list accepts any Host (its
operator reaches it by names the broker cannot know); there, ``--allowed-host`` turns
the check on. Pure functions: no I/O.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

__all__ = ["host_allowed", "host_name", "is_loopback"]


def is_loopback(host: str) -> bool:
    """Whether a bind address or a host name is loopback-only."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name in a ``Host`` header, lower-cased, without its port or brackets."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    if header.count(":") == 1:
        return header.split(":", 1)[0]
    return header  # no port, or a bare IPv6 literal


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _listed(name: str, allowed: Sequence[str]) -> bool:
    for entry in allowed:
        entry = entry.lower()
        if entry == "*" or entry == name:
            return True
        if entry.startswith(".") and (name == entry[1:] or name.endswith(entry)):
            return True
    return False


def host_allowed(header: str | None, *, bind_host: str, allowed: Sequence[str]) -> bool:
    """Whether a request with this ``Host`` header may be served (see the module doc)."""
    if header is None:
        return False  # HTTP/1.1 requires it; a request without one is not a browser's
    name = host_name(header)
    if not name:
        return False
    if _is_ip(name) or is_loopback(name) or _listed(name, allowed):
        return True
    return not allowed and not is_loopback(bind_host)
