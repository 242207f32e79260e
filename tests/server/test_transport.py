"""The broker's WebSocket transport (``broker/transport.py``) over a transport of the test's.

Each test opens one ``Socket`` as ``loop.create_server`` would (``connection_made``), sends
it a handshake request and then client frames laid out byte by byte, and reads what it
wrote. What matters of the transport is checked here: every data message reaches the
handler in order (waiting until one is attached, dropped once it is detached), a batch of
text frames is one write after what websockets queued first, keepalive pings and their
timeout, the closing handshake and its timeout, websockets' 1009 for an oversized frame,
and back pressure both ways.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import shutil
import ssl
import subprocess
from collections import deque
from collections.abc import Awaitable
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from conveyor.broker.config import Config
from conveyor.broker.server import running_broker
from conveyor.broker.transport import Server, Socket

from .conftest import WAIT
from .test_bad_input import masked_frame as masked

_KEY = base64.b64encode(b"0123456789abcdef").decode()
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
REQUEST = (
    "GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    f"Sec-WebSocket-Key: {_KEY}\r\nSec-WebSocket-Version: 13\r\n\r\n"
).encode()


def frames(data: bytes) -> list[tuple[int, bytes]]:
    """The server's (unmasked) frames in ``data``: (opcode, payload) each."""
    found = []
    pos = 0
    while pos < len(data):
        opcode, n = data[pos] & 0x0F, data[pos + 1] & 0x7F
        pos += 2
        if n == 126:
            n, pos = int.from_bytes(data[pos : pos + 2], "big"), pos + 2
        elif n == 127:
            n, pos = int.from_bytes(data[pos : pos + 8], "big"), pos + 8
        found.append((opcode, data[pos : pos + n]))
        pos += n
    return found


class Wire(asyncio.Transport):
    """A transport that keeps what is written, one entry per ``write``."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.eof = False
        self.closing = False
        self.aborted = False
        self.reading = True
        self.buffered = 0
        self.protocol: Socket | None = None
        self.written = asyncio.Event()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))
        self.written.set()

    async def next_write(self) -> None:
        """Wait until something is written (at once if something is, not yet read)."""
        if not self.writes:
            self.written.clear()
            await asyncio.wait_for(self.written.wait(), WAIT)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def is_closing(self) -> bool:
        return self.closing

    def _lose(self) -> None:
        if not self.closing:
            self.closing = True
            assert self.protocol is not None
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def close(self) -> None:
        self._lose()

    def abort(self) -> None:
        self.aborted = True
        self._lose()

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def frames(self) -> list[tuple[int, bytes]]:
        """Every frame written since the handshake's response, and forget them."""
        data = b"".join(self.writes)
        self.writes.clear()
        return frames(data)


class Opened:
    """A socket past its handshake, its wire, and what its handler got."""

    def __init__(self, **settings: Any) -> None:
        self.got: list[str | bytes] = []
        self.handled: asyncio.Future[Socket] = asyncio.get_running_loop().create_future()
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        options: dict[str, Any] = {
            "max_size": 1000,
            "ping_interval": None,
            "ping_timeout": None,
            "open_timeout": None,
            "close_timeout": 10.0,
            "server_header": "test",
        }
        options.update(settings)
        self.server = Server(self._handler, self._router, **options)
        self.sock = Socket(self.server)
        self.wire = Wire()
        self.wire.protocol = self.sock
        self.sock.connection_made(self.wire)
        self.response: Response | None = None

    def _router(self, sock: Socket, request: Request) -> Response | None:
        return None

    def _handler(self, sock: Socket) -> Awaitable[None]:
        self.handled.set_result(sock)
        return self.done

    def open(self) -> None:
        self.sock.data_received(REQUEST)
        head = self.wire.writes.pop(0)
        assert head.startswith(b"HTTP/1.1 101 ")
        accept = base64.b64encode(hashlib.sha1(_KEY.encode() + _GUID).digest())
        assert b"Sec-WebSocket-Accept: " + accept in head and b"Server: test" in head

    async def end(self) -> None:
        if not self.done.done():
            self.done.set_result(None)
        self.wire.abort()
        await asyncio.wait_for(self.sock.wait_closed(), WAIT)
        if self.server.handler_tasks:
            await asyncio.wait_for(asyncio.wait(set(self.server.handler_tasks)), WAIT)


@pytest.fixture
async def opened() -> Any:
    made: list[Opened] = []

    def make(**settings: Any) -> Opened:
        one = Opened(**settings)
        one.open()
        made.append(one)
        return one

    yield make
    for one in made:
        await one.end()


async def test_messages_of_every_kind_in_one_read_reach_the_handler_in_order(opened: Any) -> None:
    o = opened(max_size=100_000)
    text = '{"frag": "é"}'.encode()
    o.sock.data_received(
        b"".join(
            [
                masked(0x1, b"a"),  # before a handler is attached: it waits
                masked(0x9, b"are you there"),  # a ping: websockets answers it
                masked(0x1, b"b" * 300),  # a 16-bit length
                masked(0x1, text[:11], fin=False),  # "é" is cut between fragments
                masked(0xA, b"unasked pong"),
                masked(0x0, text[11:]),
                masked(0x2, b"binary"),
                masked(0x1, b"c" * 70_000),  # a 64-bit length
            ]
        )
    )
    assert o.wire.frames() == [(0xA, b"are you there")]
    assert o.got == []
    o.sock.attach(o.got.append)
    assert o.got == ["a", "b" * 300, '{"frag": "é"}', b"binary", "c" * 70_000]
    cut = masked(0x1, b"d" * 200)
    for piece in (cut[:1], cut[1:3], cut[3:9], cut[9:]):  # a frame over four reads
        o.sock.data_received(piece)
    assert o.got[-1] == "d" * 200
    o.sock.attach(None)  # the handler is done: later messages are dropped
    o.sock.data_received(masked(0x1, b"after"))
    assert o.got[-1] == "d" * 200 and not o.sock._waiting


async def test_invalid_utf8_closes_1007_and_nothing_after_it_is_handed_over(
    opened: Any,
) -> None:
    o = opened()
    o.sock.attach(o.got.append)
    o.sock.data_received(masked(0x1, b"ok") + masked(0x1, b"\xc3(") + masked(0x1, b"after"))
    assert o.got == ["ok"]
    [(opcode, payload)] = o.wire.frames()
    assert (opcode, int.from_bytes(payload[:2], "big")) == (0x8, 1007)
    assert o.wire.eof  # a server ends the TCP stream after failing


async def test_a_frame_over_max_size_closes_1009(opened: Any) -> None:
    o = opened(max_size=1000)
    o.sock.attach(o.got.append)
    o.sock.data_received(masked(0x1, b"x" * 1000) + masked(0x1, b"y" * 1001))
    assert o.got == ["x" * 1000]
    [(opcode, payload)] = o.wire.frames()
    assert (opcode, int.from_bytes(payload[:2], "big")) == (0x8, 1009)


async def test_a_batch_of_text_frames_is_one_write_after_what_websockets_queued(
    opened: Any,
) -> None:
    o = opened()
    o.sock.hold()  # (reading stops: the pong is what websockets queued, not yet written)
    o.sock.protocol.send_pong(b"queued first")
    outbox = deque([b'{"a":1}', b'{"b":2}', b"x" * 300, b'{"c":3}'])
    taken = o.sock.write_text_frames(outbox, 310)  # stops once 310 bytes are taken
    assert taken == 7 + 7 + 300 and list(outbox) == [b'{"c":3}']
    [one] = o.wire.writes
    assert frames(one) == [
        (0xA, b"queued first"),
        (1, b'{"a":1}'),
        (1, b'{"b":2}'),
        (1, b"x" * 300),
    ]
    o.wire.writes.clear()
    assert o.sock.write_text_frames(outbox, 310) == 7 and frames(o.wire.writes[0]) == [
        (1, b'{"c":3}')
    ]


async def test_keepalive_pings_each_interval_and_fails_1011_without_a_pong(opened: Any) -> None:
    o = opened(ping_interval=0.01, ping_timeout=0.05)
    loop = asyncio.get_running_loop()
    await o.wire.next_write()
    [(opcode, data)] = o.wire.frames()
    assert opcode == 0x9
    o.sock.data_received(masked(0xA, data))  # answered: another ping follows
    await o.wire.next_write()
    [(opcode, again)] = o.wire.frames()
    assert opcode == 0x9 and again != data
    started = loop.time()
    await o.wire.next_write()  # that one goes unanswered
    assert loop.time() - started >= 0.04
    [(opcode, payload)] = o.wire.frames()
    assert (opcode, int.from_bytes(payload[:2], "big")) == (0x8, 1011)
    assert b"keepalive ping timeout" in payload and o.wire.eof


async def test_close_waits_for_the_peers_close_frame_and_keeps_its_code(opened: Any) -> None:
    o = opened()
    closing = asyncio.ensure_future(o.sock.close(1001, "bye"))
    await asyncio.sleep(0)
    [(opcode, payload)] = o.wire.frames()
    assert (opcode, payload) == (0x8, (1001).to_bytes(2, "big") + b"bye")
    assert not closing.done() and not o.wire.eof
    o.sock.data_received(masked(0x8, (1001).to_bytes(2, "big") + b"bye"))
    assert o.wire.eof  # the server ends the TCP stream once both close frames passed
    o.wire.close()  # the peer's end
    await asyncio.wait_for(closing, WAIT)
    assert o.sock.close_code == 1001 and not o.wire.aborted


async def test_close_drops_a_silent_peer_after_the_close_timeout(opened: Any) -> None:
    o = opened(close_timeout=0.05)
    await asyncio.wait_for(o.sock.close(), WAIT)
    assert o.wire.aborted and o.sock.close_code == 1006  # no close frame came back


async def test_back_pressure_both_ways(opened: Any) -> None:
    o = opened()
    o.sock.attach(o.got.append)
    # Writing: past the high-water mark the socket is not writable and drain waits.
    o.sock.pause_writing()
    assert o.sock.paused and not o.sock.writable
    draining = asyncio.ensure_future(o.sock.drain())
    await asyncio.sleep(0.01)
    assert not draining.done()
    o.sock.resume_writing()
    await asyncio.wait_for(draining, WAIT)
    assert o.sock.writable
    # Reading: hold pauses the transport and keeps what was read; release hands it over.
    o.sock.hold()
    assert not o.wire.reading and o.sock.holding
    o.sock.data_received(masked(0x1, b"one") + masked(0x1, b"two"))
    assert o.got == []
    o.sock.release()
    assert o.got == ["one", "two"] and o.wire.reading


async def test_a_router_answer_is_sent_and_the_stream_ended() -> None:
    refusal = Response(403, "Forbidden", Headers([("Content-Length", "3")]), b"no\n")
    o = Opened()
    o._router = lambda sock, request: refusal  # type: ignore[method-assign]
    o.server.router = o._router
    o.sock.data_received(REQUEST)
    [head] = o.wire.writes
    assert head.startswith(b"HTTP/1.1 403 Forbidden\r\n") and head.endswith(b"\r\n\r\nno\n")
    assert b"Server: test" in head and o.wire.eof and not o.handled.done()
    await o.end()


async def test_shutdown_refuses_a_handshake_under_way_and_waits_for_it(config: Config) -> None:
    async with contextlib.AsyncExitStack() as stack:
        broker = await stack.enter_async_context(running_broker(config))
        assert broker.server is not None
        host, port = broker.server.sockets[0].getsockname()[:2]
        reader, writer = await asyncio.open_connection(host, port)
        request = REQUEST.replace(b"Host: 127.0.0.1", f"Host: {host}:{port}".encode())
        writer.write(request[:20])  # the request's start: the handshake is under way
        for _ in range(500):  # until the broker has accepted the TCP connection
            if broker.server.all_sockets:
                break
            await asyncio.sleep(0.01)
        stopping = asyncio.ensure_future(stack.aclose())
        await asyncio.sleep(0.05)
        assert not stopping.done()  # it waits for the handshake to end
        writer.write(request[20:])
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
        assert head.startswith(b"HTTP/1.1 503 ")
        writer.close()
        await asyncio.wait_for(stopping, WAIT)


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 and its key (made by the openssl command)."""
    if shutil.which("openssl") is None:
        pytest.skip("the TLS test makes its certificate with the openssl command")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return str(cert), str(key)


async def test_tls_carries_frames_the_http_side_and_the_shutdown_close(
    config: Config, tls_files: tuple[str, str]
) -> None:
    cert, key = tls_files
    trusted = ssl.create_default_context(cafile=cert)
    async with running_broker(replace(config, tls_cert=cert, tls_key=key)) as broker:
        assert broker.url.startswith("wss://127.0.0.1:")
        ws = await connect(broker.url, ssl=trusted)
        await ws.send(orjson.dumps({"op": "ping", "rid": 1}).decode())
        assert orjson.loads(await asyncio.wait_for(ws.recv(), WAIT))["ok"] is True
        port = int(broker.url.rsplit(":", 1)[1].split("/")[0])
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=trusted)
        writer.write(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        writer.close()
    # The broker closed the open connection on its way out (TLS has no half-close: the
    # transport is closed after the closing handshake).
    await asyncio.wait_for(ws.wait_closed(), WAIT)
    assert ws.close_code == 1001
