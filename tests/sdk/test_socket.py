"""The SDK's WebSocket connection (``sdk/_transport.py``) against a scripted broker.

A scripted broker here completes the opening handshake, answers ``hello``, and then
writes frames laid out byte by byte: whole ones, fragmented ones, control frames among
them, frames cut between two reads, and frames the RFC forbids a server to send. The
``Session`` under test hands each push to ``on_push`` in the order sent; what it must
refuse closes the connection with the RFC's code. The socket's own duties follow:
keepalive pings, and a close that waits for the broker only so long.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from websockets.exceptions import InvalidStatus

from conveyor.sdk._session import Session
from conveyor.sdk._transport import connect

from .conftest import WAIT, _read_ws_frame

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def server_frame(opcode: int, payload: bytes, *, fin: bool = True, mask: bool = False) -> bytes:
    """A frame as RFC 6455 lays it out (7-, 16- or 64-bit length); a server's is unmasked."""
    n = len(payload)
    head = bytes([(0x80 if fin else 0) | opcode])
    bit = 0x80 if mask else 0
    if n < 126:
        head += bytes([bit | n])
    elif n < 65536:
        head += bytes([bit | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([bit | 127]) + n.to_bytes(8, "big")
    if mask:
        key = b"\x11\x22\x33\x44"
        return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return head + payload


def push(tag: str, pad: int = 0) -> bytes:
    """A ``cancelled`` push naming ``tag``, made ``pad`` bytes longer with JSON whitespace."""
    return orjson.dumps({"push": "cancelled", "ids": [tag]})[:-1] + b" " * pad + b"}"


async def accept_handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str:
    """Read a client's opening handshake and accept it (101); return the request's head."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    key = next(
        line.split(":", 1)[1].strip()
        for line in head.split("\r\n")
        if line.lower().startswith("sec-websocket-key:")
    )
    accept = base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()
    writer.write(
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        + f"Sec-WebSocket-Accept: {accept}\r\n\r\n".encode()
    )
    return head


class ScriptedBroker:
    """One connection's broker side: the handshake, the ``hello`` reply, then raw bytes."""

    def __init__(self) -> None:
        self.connected: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = (
            asyncio.get_running_loop().create_future()
        )
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        await accept_handshake(reader, writer)
        _, data = await _read_ws_frame(reader)
        hello = orjson.loads(data)
        assert hello["op"] == "hello"
        reply = {"rid": hello["rid"], "ok": True, "max_batch": 1000}
        writer.write(server_frame(0x1, orjson.dumps(reply)))
        if not self.connected.done():
            self.connected.set_result((reader, writer))

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
        await self.server.wait_closed()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"ws://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/ws"


class Pushes:
    """What ``on_push`` got, and an event per tag to wait on."""

    def __init__(self) -> None:
        self.tags: list[str] = []
        self._seen: dict[str, asyncio.Event] = {}

    def __call__(self, frame: dict[str, Any]) -> None:
        tag = frame["ids"][0]
        self.tags.append(tag)
        self._event(tag).set()

    def _event(self, tag: str) -> asyncio.Event:
        return self._seen.setdefault(tag, asyncio.Event())

    async def wait(self, tag: str) -> None:
        await asyncio.wait_for(self._event(tag).wait(), WAIT)


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[ScriptedBroker, Session, Pushes]]:
    fake = ScriptedBroker()
    fake.server = await asyncio.start_server(fake._accept, "127.0.0.1", 0)
    pushes = Pushes()
    session = Session(fake.url, on_push=pushes, backoff_base_s=60.0)
    runner = asyncio.create_task(session.run())
    try:
        await asyncio.wait_for(session.connected.wait(), WAIT)
        yield fake, session, pushes
    finally:
        await fake.close()  # first: it answers no closing handshake, so none is awaited
        await session.close()
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner


async def close_code(reader: asyncio.StreamReader) -> int:
    """Read the client's frames until its close frame; return the code in it."""
    while True:
        raw, data = await asyncio.wait_for(_read_ws_frame(reader), WAIT)
        if raw[0] & 0x0F == 0x8:
            return int.from_bytes(data[:2], "big")


async def test_frames_of_every_kind_in_one_read_reach_on_push_in_order(
    scripted: tuple[ScriptedBroker, Session, Pushes],
) -> None:
    fake, _, pushes = scripted
    reader, writer = await fake.connected
    text = orjson.dumps({"push": "cancelled", "ids": ["frag-é"]})
    writer.write(
        b"".join(
            [
                server_frame(0x1, push("a")),
                server_frame(0x9, b"are you there"),  # a ping: the client answers it
                server_frame(0x1, push("b", 300)),  # a 16-bit length
                server_frame(0x1, text[:25], fin=False),  # "é" is cut between fragments
                server_frame(0xA, b"unasked pong"),
                server_frame(0x0, text[25:]),
                server_frame(0x1, push("c", 70_000)),  # a 64-bit length
                server_frame(0x1, push("d")),
            ]
        )
    )
    await pushes.wait("d")
    assert pushes.tags == ["a", "b", "frag-é", "c", "d"]
    raw, data = await asyncio.wait_for(_read_ws_frame(reader), WAIT)
    assert (raw[0] & 0x0F, data) == (0xA, b"are you there")  # the pong


async def test_a_frame_cut_anywhere_between_two_reads_is_joined(
    scripted: tuple[ScriptedBroker, Session, Pushes],
) -> None:
    # The first piece rides one write with a whole frame; its push shows the client has
    # read that write (so the cut really falls between two reads); then the rest.
    fake, _, pushes = scripted
    _, writer = await fake.connected
    for size in (0, 200, 70_000):  # 7-, 16- and 64-bit lengths
        frame = server_frame(0x1, push(f"r{size}", size))
        header = {0: 2, 200: 4, 70_000: 10}[size]
        for cut in sorted({1, header - 1, header, header + 1, len(frame) - 1}):
            writer.write(server_frame(0x1, push(f"before{size}.{cut}")) + frame[:cut])
            await pushes.wait(f"before{size}.{cut}")
            writer.write(frame[cut:])
            await pushes.wait(f"r{size}")
            assert pushes.tags[-2:] == [f"before{size}.{cut}", f"r{size}"], (size, cut)


async def test_a_masked_frame_from_the_broker_closes_1002(
    scripted: tuple[ScriptedBroker, Session, Pushes], caplog: pytest.LogCaptureFixture
) -> None:
    fake, _, pushes = scripted
    reader, writer = await fake.connected
    with caplog.at_level(logging.INFO, logger="conveyor.sdk"):
        writer.write(server_frame(0x1, push("ok")) + server_frame(0x1, push("masked"), mask=True))
        assert await close_code(reader) == 1002
    assert pushes.tags == ["ok"]
    # Refused as a frame, not read as one: nothing reached the decoder.
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


async def test_invalid_utf8_from_the_broker_closes_1007_and_stops_there(
    scripted: tuple[ScriptedBroker, Session, Pushes],
) -> None:
    fake, _, pushes = scripted
    reader, writer = await fake.connected
    writer.write(
        server_frame(0x1, push("ok"))
        + server_frame(0x1, b'{"push": "cancelled", "ids": ["\xc3("]}')
        + server_frame(0x1, push("after"))
    )
    assert await close_code(reader) == 1007
    assert pushes.tags == ["ok"]


async def test_a_failing_push_handler_is_logged_and_the_next_frame_still_handled(
    scripted: tuple[ScriptedBroker, Session, Pushes], caplog: pytest.LogCaptureFixture
) -> None:
    fake, session, pushes = scripted
    _, writer = await fake.connected
    calls = 0

    def fails_once(frame: dict[str, Any]) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("handler bug")
        pushes(frame)

    session.on_push = fails_once
    with caplog.at_level(logging.ERROR, logger="conveyor.sdk"):
        writer.write(server_frame(0x1, push("lost")) + server_frame(0x1, push("next")))
        await pushes.wait("next")
    assert pushes.tags == ["next"]
    assert any("handling a 'cancelled' push failed" in r.getMessage() for r in caplog.records)


Peer = tuple[asyncio.StreamReader, asyncio.StreamWriter, str]


@contextlib.asynccontextmanager
async def raw_peer() -> AsyncIterator[tuple[str, asyncio.Future[Peer]]]:
    """A one-connection server on port 0 that accepts the handshake and then does nothing
    by itself: the URL, and a future of the accepted connection's streams and head."""
    accepted: asyncio.Future[Peer] = asyncio.get_running_loop().create_future()
    writers: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        head = await accept_handshake(reader, writer)
        accepted.set_result((reader, writer, head))

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/ws", accepted
    finally:
        server.close()
        for writer in writers:
            writer.close()
        await server.wait_closed()


async def test_the_handshake_carries_the_headers_and_client_frames_are_masked() -> None:
    async with raw_peer() as (url, accepted):
        ws = await connect(
            url, headers={"Authorization": "Bearer t0ken"}, open_timeout=WAIT, max_size=None
        )
        reader, _, head = await accepted
        assert "\r\nAuthorization: Bearer t0ken\r\n" in head
        ws.write_texts([b'{"a":1}', b'{"b":2}'])
        for expected in (b'{"a":1}', b'{"b":2}'):
            raw, data = await asyncio.wait_for(_read_ws_frame(reader), WAIT)
            assert (raw[0], raw[1] & 0x80, data) == (0x81, 0x80, expected)  # text, masked
        ws.abort()


async def test_keepalive_pings_each_interval_and_fails_1011_without_a_pong() -> None:
    async with raw_peer() as (url, accepted):
        ws = await connect(
            url, headers={}, open_timeout=WAIT, max_size=None, ping_interval=0.01, ping_timeout=0.05
        )
        reader, writer, _ = await accepted
        raw, data = await asyncio.wait_for(_read_ws_frame(reader), WAIT)
        assert raw[0] == 0x89  # a ping
        writer.write(server_frame(0xA, data))  # answered: another ping follows
        raw, again = await asyncio.wait_for(_read_ws_frame(reader), WAIT)
        assert raw[0] == 0x89 and again != data
        assert await close_code(reader) == 1011  # that one goes unanswered
        writer.close()
        await asyncio.wait_for(ws.wait_closed(), WAIT)


async def test_close_waits_for_the_brokers_close_and_keeps_its_code() -> None:
    async with raw_peer() as (url, accepted):
        ws = await connect(url, headers={}, open_timeout=WAIT, max_size=None)
        reader, writer, _ = await accepted
        closing = asyncio.create_task(ws.close())
        assert await close_code(reader) == 1000
        assert not closing.done()  # the client waits for the broker to end the TCP stream
        writer.write(server_frame(0x8, (1001).to_bytes(2, "big") + b"bye"))
        writer.close()
        await asyncio.wait_for(closing, WAIT)
        assert (ws.close_code, ws.close_reason) == (1001, "bye")


async def test_close_drops_a_silent_broker_after_the_close_timeout() -> None:
    async with raw_peer() as (url, accepted):
        ws = await connect(url, headers={}, open_timeout=WAIT, max_size=None, close_timeout=0.05)
        reader, _, _ = await accepted
        await asyncio.wait_for(ws.close(), WAIT)
        assert ws.close_code == 1006  # no close frame came back
        assert await close_code(reader) == 1000  # though ours was sent


async def test_a_refused_handshake_raises_invalid_status_with_the_code() -> None:
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}/ws"
    try:
        with pytest.raises(InvalidStatus) as refused:
            await connect(url, headers={}, open_timeout=WAIT, max_size=None)
        assert refused.value.response.status_code == 401
    finally:
        server.close()
        await server.wait_closed()
