"""Broker URLs: one broker, or several to fail over between.

Every SDK entry point that takes a broker URL (``Client``, ``SyncClient``, ``Worker``, the
CLI's ``--url`` and ``CONVEYOR_URL``) takes several: a sequence of URLs, or one string of
comma-separated URLs (``"ws://a:8765,ws://b:8765"``). ``parse_urls`` checks each and
refuses a bad one with ``InvalidArgument`` (field ``url``) naming it; ``connection_order``
is the order a session tries them in (docs: README, "Several brokers").
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from urllib.parse import urlsplit, urlunsplit

from ._errors import InvalidArgument

__all__ = [
    "DEFAULT_URL",
    "URL_HELP",
    "Urls",
    "brokers",
    "connection_order",
    "normalize_url",
    "parse_urls",
    "url_argument",
]

DEFAULT_URL = "ws://127.0.0.1:8765/ws"

#: What the SDK takes as its broker URL(s): one URL, comma-separated URLs, or a sequence.
Urls = str | Sequence[str]

#: The help of the commands' ``--url``.
URL_HELP = (
    "broker URL, or several comma-separated (ws://a:8765,ws://b:8765) of brokers sharing "
    "one job table: one is used, the next tried at once when it cannot be reached"
)


def normalize_url(url: str) -> str:
    """``url`` checked; ``ws://host:port`` means the broker's endpoint, ``ws://host:port/ws``.

    Raises ``InvalidArgument`` (field ``url``) naming ``url`` when it is not a ``ws://`` or
    ``wss://`` URL with a host (and, if any, a valid port).
    """
    problem = _problem(url)
    if problem is not None:
        raise InvalidArgument(f"url: {problem}, got {url!r}", field="url")
    parts = urlsplit(url.strip())
    path = parts.path if parts.path not in ("", "/") else "/ws"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def _problem(url: str) -> str | None:
    """What is wrong with ``url`` as a broker URL, or ``None``."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port  # (raises ValueError for one that is not a number in range)
    except ValueError:
        return "must be a ws:// or wss:// URL with a valid host and port"
    if parts.scheme not in ("ws", "wss"):
        return "must start with ws:// or wss://"
    if not parts.hostname:
        return "must name the broker's host"
    if port == 0:
        return "port must be 1 to 65535"
    return None


def parse_urls(urls: Urls) -> tuple[str, ...]:
    """The broker URLs in ``urls``, each normalized (``normalize_url``), in the order given,
    each once.

    ``urls`` is one URL, a string of comma-separated URLs (spaces around them are
    ignored), or a sequence of URLs (each item one URL). Raises ``InvalidArgument`` (field
    ``url``) for no URL at all, an empty entry, or a bad URL: the message names it, and
    its place in the list when there are several.
    """
    if isinstance(urls, str):
        entries = urls.split(",")
    elif isinstance(urls, Sequence) and all(isinstance(u, str) for u in urls):
        entries = list(urls)
    else:
        raise InvalidArgument(
            "url: must be a URL, comma-separated URLs or a sequence of URLs, "
            f"got {type(urls).__name__}",
            field="url",
        )
    if not any(entry.strip() for entry in entries):
        raise InvalidArgument(f"url: no broker URL given, got {urls!r}", field="url")
    found: list[str] = []
    for place, entry in enumerate(entries, 1):
        where = f" (entry {place} of {len(entries)})" if len(entries) > 1 else ""
        if not entry.strip():
            raise InvalidArgument(f"url: entry {place} of {urls!r} is empty", field="url")
        problem = _problem(entry)
        if problem is not None:
            raise InvalidArgument(f"url: {problem}, got {entry!r}{where}", field="url")
        url = normalize_url(entry)
        if url not in found:
            found.append(url)
    return tuple(found)


def connection_order(
    urls: Sequence[str], *, shuffle: bool, rng: random.Random | None = None
) -> tuple[str, ...]:
    """The order a session tries ``urls`` in, round after round: the order given, or with
    ``shuffle`` a random one picked once per session, so that many workers given the same
    list spread over the brokers, and those of a broker that dies spread over the others
    (not all onto the next one in the list)."""
    order = list(urls)
    if shuffle:
        (rng or random).shuffle(order)
    return tuple(order)


def brokers(urls: Sequence[str]) -> str:
    """``urls`` for a message: "the broker at URL", or "any of the brokers at A, B"."""
    if len(urls) == 1:
        return f"the broker at {urls[0]}"
    return f"any of the brokers at {', '.join(urls)}"


def url_argument(value: str) -> tuple[str, ...]:
    """``--url``'s value (or ``CONVEYOR_URL``'s) as the URLs it lists, for argparse: a bad
    one is a bad argument (exit 2) naming it."""
    try:
        return parse_urls(value)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(exc.message) from None
