"""What a ``Client`` says when it cannot do what it was asked: nothing listening, no
broker at the URL, a refused token, a token without the role.

Real servers on port 0: the broker, and for the HTTP refusals a plain HTTP server that
answers the WebSocket handshake with the status under test.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from conveyor.broker.server import Broker
from conveyor.sdk import Client, ConnectionFailed, Forbidden, SyncClient, Unauthorized
from conveyor.sdk._wire import Role

from .conftest import WAIT, free_port, free_ports, with_config


@contextlib.asynccontextmanager
async def http_server(status: str, body: bytes) -> AsyncIterator[str]:
    """A plain HTTP server answering every request with ``status`` and ``body``; yields
    its ``ws://`` URL."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n"
            writer.write(f"{head}Content-Type: text/plain\r\n\r\n".encode() + body)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/ws"
    finally:
        server.close()
        await server.wait_closed()


async def test_a_404_is_no_broker_at_the_url_not_unauthorized() -> None:
    async with http_server("404 Not Found", b"not found\n") as url:
        started = time.monotonic()
        with pytest.raises(ConnectionFailed) as caught:
            async with Client(url, connect_timeout=30):
                pass
        assert time.monotonic() - started < 10  # at once, not after the timeout
    message = caught.value.message
    assert f"{url}: no Conveyor broker at this URL (HTTP 404: not found)" in message
    assert "/ws" in message
    assert "unauthorized" not in message.lower() and "refused" not in message


async def test_a_401_is_unauthorized_naming_the_token_and_the_brokers_reason() -> None:
    async with http_server("401 Unauthorized", b"unknown token\n") as url:
        with pytest.raises(Unauthorized) as caught:
            async with Client(url, token="t", connect_timeout=30):
                pass
    assert caught.value.message == f"{url}: the broker refused the token (HTTP 401: unknown token)"
    assert caught.value.code == "unauthorized"


async def test_a_403_is_unauthorized_with_the_brokers_reason() -> None:
    async with http_server("403 Forbidden", b"origin not allowed\n") as url:
        with pytest.raises(Unauthorized) as caught:
            async with Client(url, connect_timeout=30):
                pass
    assert "(HTTP 403: origin not allowed)" in caught.value.message


async def test_fail_fast_reports_a_refused_connection_at_once() -> None:
    url = f"ws://127.0.0.1:{free_port()}/ws"
    started = time.monotonic()
    with pytest.raises(ConnectionFailed) as caught:
        async with Client(url, connect_timeout=30, fail_fast=True):
            pass
    assert time.monotonic() - started < 10  # not the 30 s connect timeout
    assert caught.value.message == f"cannot reach the broker at {url}: connection refused"


async def test_fail_fast_names_each_url_and_why() -> None:
    first, second = (f"ws://127.0.0.1:{port}/ws" for port in free_ports(2))
    with pytest.raises(ConnectionFailed) as caught:
        async with Client([first, second], connect_timeout=30, fail_fast=True):
            pass
    message = caught.value.message
    assert message.startswith("cannot reach any of the brokers: ")
    assert f"{first}: connection refused" in message
    assert f"{second}: connection refused" in message


async def test_fail_fast_still_fails_over_to_the_next_url(broker: Broker) -> None:
    dead = f"ws://127.0.0.1:{free_port()}/ws"
    async with Client(
        [dead, broker.url], connect_timeout=WAIT, fail_fast=True, shuffle_urls=False
    ) as client:
        assert client.url == broker.url
        assert await client.stats() == {}


async def test_without_fail_fast_a_refused_connection_is_retried_until_the_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(ConnectionFailed):
        async with Client(f"ws://127.0.0.1:{free_port()}", connect_timeout=0.5):
            pass
    assert time.monotonic() - started >= 0.5  # the documented wait, for a broker starting


def test_sync_client_takes_fail_fast_too() -> None:
    with pytest.raises(ConnectionFailed, match="connection refused"):
        with SyncClient(f"ws://127.0.0.1:{free_port()}", connect_timeout=30, fail_fast=True):
            pass


TOKENS = {"reader": frozenset({Role.READ}), "pub": frozenset({Role.PUBLISH})}


@with_config(tokens=TOKENS)
async def test_forbidden_names_the_call_made_and_the_role_it_needs(broker: Broker) -> None:
    async with Client(broker.url, token="reader", connect_timeout=WAIT) as reader:
        with pytest.raises(Forbidden) as caught:
            await reader.enqueue("q", {})  # sent as enqueue_each
        assert caught.value.message == (
            "enqueue: this token may not call enqueue; it needs the publish role"
        )
        with pytest.raises(Forbidden) as caught:
            await reader.enqueue("q", "x" * 70_000)  # large: sent as plain enqueue
        assert caught.value.message.startswith("enqueue: this token may not call enqueue;")
        with pytest.raises(Forbidden) as caught:
            await reader.enqueue_many("q", [1, 2])  # sent as enqueue_batch
        assert caught.value.message == (
            "enqueue_many: this token may not call enqueue_many; it needs the publish role"
        )
    async with Client(broker.url, token="pub", connect_timeout=WAIT) as publisher:
        with pytest.raises(Forbidden) as caught:
            await publisher.pause("q")
        assert (
            caught.value.message == "pause: this token may not call pause; it needs the admin role"
        )
