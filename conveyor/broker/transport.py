"""The broker's WebSocket transport: its own asyncio protocol in front of websockets'
sans-I/O server (``websockets.server.ServerProtocol``, see websockets' "sans-I/O" how-to).

websockets' protocol object parses the handshake request and every frame, builds every
frame and the handshake's response, answers pings and close frames, and enforces
``max_size`` (1009); this module owns the listening socket and each connection's socket
around it, for what the broker needs (the SDK's end is built the same way:
``sdk/_transport.py``):

- The handshake request goes to a router (``broker/http.py``) in the callback that read
  it: it answers plain HTTP paths and refusals, or lets the upgrade go on; the handler of
  an accepted connection is called in that same callback too, so the broker counts the
  connection before the next handshake is looked at.
- Each data message goes to a callback (``Socket.attach``) in the same event-loop
  callback that received its bytes: no assembler queue and no reader task.
- A batch of text frames leaves in one ``transport.write`` (``Socket.write_text_frames``).
- Keepalive pings, the opening and closing handshakes' timeouts and the write buffer's
  back pressure are timers and futures on the loop, not tasks.

Only documented public names of websockets are used; no class of it is subclassed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from ssl import SSLContext
from typing import Any, cast

from websockets.exceptions import ConnectionClosed, ConnectionClosedError
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.server import ServerProtocol

__all__ = ["Handler", "Router", "Server", "Socket", "serve"]

log = logging.getLogger("conveyor")

# Enum members as module names: reading one off its class (``State.OPEN``) is an attribute
# lookup on the enum class, and these are read for every frame.
_OPEN, _CLOSED = State.OPEN, State.CLOSED
_CONT, _TEXT, _BINARY, _PONG = Opcode.CONT, Opcode.TEXT, Opcode.BINARY, Opcode.PONG

# The write buffer's high-water mark, websockets' own default (``write_limit``): past it
# the socket is ``paused`` and writers wait for it to drain (``drain``).
_WRITE_LIMIT = 2**15

# What websockets' own server answers when the router fails, or when a handshake would be
# accepted while the server is closing: the same bodies, so peers see no difference.
_ROUTER_FAILED = "Failed to open a WebSocket connection.\nSee server log for more information.\n"
_SHUTTING_DOWN = "Server is shutting down.\n"

Router = Callable[["Socket", Request], Response | None]
"""Answers a handshake request with an HTTP response, or ``None`` to accept the upgrade."""
Handler = Callable[["Socket"], Awaitable[None]]
"""Called (synchronously) once a connection is open; the connection lasts until the
awaitable it returns ends, then it is closed (1000, or 1011 if it raised)."""


async def serve(
    handler: Handler,
    host: str | None,
    port: int,
    *,
    router: Router,
    ssl: SSLContext | None,
    max_size: int | None,
    ping_interval: float | None,
    ping_timeout: float | None,
    open_timeout: float | None,
    close_timeout: float = 10.0,
    server_header: str | None = None,
) -> Server:
    """Listen on ``host``:``port`` (TLS with ``ssl``) and serve WebSocket connections.

    Each connection's handshake request goes to ``router``; accepted, the connection goes
    to ``handler``. Incoming messages may be up to ``max_size`` bytes (larger: websockets
    closes with 1009). Every ``ping_interval`` seconds a ping goes out; no pong within
    ``ping_timeout`` fails the connection (1011). A handshake not done in ``open_timeout``
    seconds, or a closing not done in ``close_timeout``, drops the TCP connection.
    ``server_header`` goes in every response's ``Server`` header.
    """
    server = Server(
        handler,
        router,
        max_size=max_size,
        ping_interval=ping_interval,
        ping_timeout=ping_timeout,
        open_timeout=open_timeout,
        close_timeout=close_timeout,
        server_header=server_header,
    )
    loop = asyncio.get_running_loop()
    server.listener = await loop.create_server(lambda: Socket(server), host, port, ssl=ssl)
    return server


class Server:
    """The listening socket and its connections, made by ``serve``."""

    def __init__(
        self,
        handler: Handler,
        router: Router,
        *,
        max_size: int | None,
        ping_interval: float | None,
        ping_timeout: float | None,
        open_timeout: float | None,
        close_timeout: float,
        server_header: str | None,
    ) -> None:
        self.handler = handler
        self.router = router
        self.max_size = max_size
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.open_timeout = open_timeout
        self.close_timeout = close_timeout
        self.server_header = server_header
        self.listener: asyncio.Server | None = None
        self.all_sockets: set[Socket] = set()  # every TCP connection, until it is lost
        self.handler_tasks: set[asyncio.Task[None]] = set()
        self._serving = True
        self._emptied: asyncio.Future[None] | None = None  # set once all_sockets empties

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        """The listening sockets."""
        return tuple(self.listener.sockets) if self.listener is not None else ()

    @property
    def connections(self) -> set[Socket]:
        """The connections whose opening handshake is done and closing not started."""
        return {s for s in self.all_sockets if s.protocol.state is _OPEN}

    def is_serving(self) -> bool:
        """Whether new connections are accepted (until ``close``)."""
        return self._serving

    async def close(self, code: int = CloseCode.GOING_AWAY, reason: str = "") -> None:
        """Stop listening, close every open connection with ``code`` and ``reason`` (each
        bounded by the close timeout), and return once every TCP connection is gone and
        every handler has returned.

        As with websockets' own server, a handshake still under way is refused from now on
        (503) once its request comes, and dropped at the open timeout if none does.
        """
        self._serving = False
        if self.listener is not None:
            self.listener.close()
        closing = [
            asyncio.ensure_future(sock.close(code, reason))
            for sock in self.all_sockets
            if sock.protocol.state is _OPEN and sock.response is not None
        ]
        if closing:
            await asyncio.wait(closing)
        if self.listener is not None:
            await self.listener.wait_closed()
        if self.all_sockets:
            self._emptied = asyncio.get_running_loop().create_future()
            await self._emptied
        if self.handler_tasks:
            await asyncio.wait(set(self.handler_tasks))

    def _forget(self, sock: Socket) -> None:
        """``sock``'s TCP connection is gone."""
        self.all_sockets.discard(sock)
        if not self.all_sockets and self._emptied is not None and not self._emptied.done():
            self._emptied.set_result(None)

    def _start_handler(self, sock: Socket) -> None:
        try:
            handling = self.handler(sock)
        except Exception:
            log.error("connection handler failed", exc_info=True)
            sock.fail(CloseCode.INTERNAL_ERROR)
            return
        task = asyncio.ensure_future(_handle(handling, sock))
        self.handler_tasks.add(task)
        task.add_done_callback(self.handler_tasks.discard)


async def _handle(handling: Awaitable[None], sock: Socket) -> None:
    """Run one connection's handler, then close the connection (1011 if it failed)."""
    code: int = CloseCode.NORMAL_CLOSURE
    try:
        await handling
    except Exception:
        log.error("connection handler failed", exc_info=True)
        code = CloseCode.INTERNAL_ERROR
    finally:
        await sock.close(code)


class Socket(asyncio.Protocol):
    """One server WebSocket connection, made by the ``Server`` for each TCP connection.

    Opening: the handshake request goes to the server's router; its answer, or the
    upgrade's 101, is sent, and an accepted connection goes to the server's handler.

    Reading: every complete data message (text as ``str``, checked as UTF-8; binary as
    ``bytes``) goes to the handler given to ``attach``. Messages that arrive before a
    handler is attached wait, in order, until it is; those after it is detached
    (``attach(None)``) are dropped. ``hold``/``release`` pause reading. Wait for the end
    with ``wait_closed()``.

    Writing: ``write_text_frames`` while ``writable``; ``drain`` waits for the write buffer
    to go under its mark. ``close`` runs the closing handshake.
    """

    def __init__(self, server: Server) -> None:
        self._server = server
        self.protocol = ServerProtocol(max_size=server.max_size)
        self.request: Request | None = None  # the handshake request, once read
        self.response: Response | None = None  # the answer to it, once sent
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._lost: asyncio.Future[None] = loop.create_future()
        self._paused = False  # the write buffer is over its high-water mark
        self._drained: asyncio.Future[None] | None = None  # set when it is not any more
        self._accepted = False  # the 101 went out: frames are data from here on
        self._sink: Callable[[str | bytes], None] | None = None
        # Messages read but not handed over yet: no handler yet, or it holds (``hold``).
        self._waiting: deque[str | bytes] = deque()
        self._holding = False
        self._detached = False
        self._parts: bytearray | None = None  # a fragmented message being joined
        self._parts_text = False
        self._ping_data: bytes | None = None  # the keepalive ping awaiting its pong
        self._ping_sent = 0.0
        self._ping_timer: asyncio.TimerHandle | None = None
        self._open_timer: asyncio.TimerHandle | None = None
        self._close_timer: asyncio.TimerHandle | None = None

    # -- what the broker reads ----------------------------------------------------------

    @property
    def transport(self) -> asyncio.Transport:
        """The TCP (or TLS) transport; set from the moment the connection is made."""
        assert self._transport is not None
        return self._transport

    @property
    def remote_address(self) -> Any:
        """The peer's address, as the socket's ``getpeername`` gives it."""
        return self.transport.get_extra_info("peername")

    @property
    def paused(self) -> bool:
        """Whether the write buffer is over its high-water mark (see ``drain``)."""
        return self._paused

    @property
    def state(self) -> State:
        """The WebSocket connection's state (websockets' ``State``)."""
        return self.protocol.state

    @property
    def open(self) -> bool:
        """Whether frames may be written: the handshake done, the closing not begun."""
        transport = self._transport
        return self.protocol.state is _OPEN and transport is not None and not transport.is_closing()

    @property
    def writable(self) -> bool:
        """Whether a write now goes straight out: open, and the buffer not over its mark."""
        return not self._paused and self.open

    @property
    def write_buffer_size(self) -> int:
        """Bytes handed to the transport and not yet taken by the kernel."""
        return self._transport.get_write_buffer_size() if self._transport is not None else 0

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (a cast, not an isinstance check: uvloop's transports do not subclass asyncio's)
        self._transport = cast(asyncio.Transport, transport)
        self._transport.set_write_buffer_limits(high=_WRITE_LIMIT)
        self._server.all_sockets.add(self)
        if self._server.open_timeout is not None:
            self._open_timer = self._loop.call_later(self._server.open_timeout, self.abort)

    def data_received(self, data: bytes) -> None:
        protocol = self.protocol
        protocol.receive_data(data)
        events = protocol.events_received()
        self._flush()  # pongs, the echo of a close frame, a failure's close frame
        if self._close_timer is None and protocol.close_expected():
            self._expect_close()
        for event in events:
            if isinstance(event, Frame):
                if not self._accepted:
                    continue  # (a peer that did not wait for the 101, refused)
                if event.fin and (event.opcode is _TEXT or event.opcode is _BINARY):
                    if not self._deliver(event.data, event.opcode is _TEXT):
                        return  # closing (bad UTF-8): nothing after it is handed over
                elif not self._frame(event):
                    return
            elif isinstance(event, Request) and self.request is None:
                self._handshake(event)

    def eof_received(self) -> None:
        self.protocol.receive_eof()
        self._flush()
        # (returning None closes the transport: after the peer's end of the stream a
        # WebSocket has nothing left to write)

    def connection_lost(self, exc: Exception | None) -> None:
        self.protocol.receive_eof()  # idempotent: the state is CLOSED from here on
        self.protocol.data_to_send()  # nowhere to write it any more
        for timer in (self._ping_timer, self._open_timer, self._close_timer):
            if timer is not None:
                timer.cancel()
        self._ping_timer = self._open_timer = self._close_timer = None
        self._server._forget(self)
        if not self._lost.done():
            self._lost.set_result(None)
        self._resume()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._resume()

    # -- opening ------------------------------------------------------------------------

    def _handshake(self, request: Request) -> None:
        """Answer the handshake request as the router says (as websockets' ``serve`` with
        ``process_request`` does); an accepted connection goes to the handler."""
        protocol = self.protocol
        server = self._server
        self.request = request
        try:
            response = server.router(self, request)
        except Exception as exc:
            protocol.handshake_exc = exc
            log.error("process_request failed", exc_info=True)
            response = protocol.reject(HTTPStatus.INTERNAL_SERVER_ERROR, _ROUTER_FAILED)
        if response is None:
            response = protocol.accept(request)
        if server.server_header is not None:
            response.headers["Server"] = server.server_header
        if response.status_code == HTTPStatus.SWITCHING_PROTOCOLS and not server.is_serving():
            response = protocol.reject(HTTPStatus.SERVICE_UNAVAILABLE, _SHUTTING_DOWN)
        self.response = response
        protocol.send_response(response)
        self._flush()
        if protocol.state is not _OPEN:  # refused: websockets sent the end of the stream
            if self._close_timer is None:
                self._expect_close()
            return
        self._accepted = True
        if self._open_timer is not None:
            self._open_timer.cancel()
            self._open_timer = None
        self._schedule_ping(self._loop.time())
        server._start_handler(self)

    # -- reading ------------------------------------------------------------------------

    def _frame(self, frame: Frame) -> bool:
        """A frame other than a whole data message; False once the connection fails."""
        opcode = frame.opcode
        if opcode is _TEXT or opcode is _BINARY:  # the first of a fragmented message
            self._parts = bytearray(frame.data)
            self._parts_text = opcode is _TEXT
        elif opcode is _CONT:
            if self._parts is None:  # websockets lets none through outside a message
                return True
            self._parts += frame.data
            if frame.fin:
                data, self._parts = self._parts, None
                return self._deliver(data, self._parts_text)
        elif opcode is _PONG and self._ping_data is not None:
            if frame.data == self._ping_data:
                self._pong()
        return True  # (ping and close: websockets answered them already)

    def _deliver(self, data: bytes | bytearray | memoryview, text: bool) -> bool:
        """One whole data message: to the handler, kept, or dropped. False when it is
        not valid UTF-8 text: the connection then fails with 1007, as websockets' own
        reader does."""
        message: str | bytes
        if text:
            try:
                message = str(data, "utf-8")
            except UnicodeDecodeError as exc:
                self.fail(CloseCode.INVALID_DATA, f"{exc.reason} at position {exc.start}")
                return False
        else:
            message = bytes(data)
        if self._detached:
            return True  # a peer still sending after its connection was handled to the end
        if self._sink is None or self._holding:
            self._waiting.append(message)
        else:
            self._sink(message)
        return True

    def attach(self, sink: Callable[[str | bytes], None] | None) -> None:
        """Hand every data message, from now on and those already waiting, to ``sink``;
        ``None``: the handler is done, and later messages are dropped, not kept."""
        self._sink = sink
        self._detached = sink is None
        if sink is None:
            self._waiting.clear()
        else:
            self._hand_over()

    @property
    def holding(self) -> bool:
        """Whether the handler asked for no more messages for now (``hold``)."""
        return self._holding

    def hold(self) -> None:
        """Stop reading, and keep the messages already read but not yet handed over
        until ``release()``: the handler wants no more now."""
        if not self._holding and self._transport is not None:
            self._holding = True
            self._transport.pause_reading()

    def release(self) -> None:
        """Hand over the messages kept by ``hold()``, then read again; if the handler
        holds again meanwhile, the rest stays kept. Nothing to do when not holding."""
        if self._holding and self._transport is not None:
            self._holding = False
            self._hand_over()
            if not self._holding and not self._transport.is_closing():
                self._transport.resume_reading()

    def _hand_over(self) -> None:
        """The waiting messages to the handler, in order, until it holds again."""
        waiting = self._waiting
        while waiting and not self._holding and self._sink is not None:
            self._sink(waiting.popleft())

    # -- writing ------------------------------------------------------------------------

    def write_text_frames(self, outbox: deque[bytes], limit: int) -> int:
        """Frame UTF-8 texts from the left of ``outbox`` (about ``limit`` bytes of them,
        at least one) and write them in one piece, after whatever websockets queued
        before them (a pong), in order; return the bytes of text taken. Call only while
        the connection is open."""
        send = self.protocol.send_text
        popleft = outbox.popleft
        size = 0
        while outbox and size < limit:
            data = popleft()
            send(data)
            size += len(data)
        self._flush()
        return size

    async def drain(self) -> None:
        """Wait while the write buffer is over its high-water mark; returns at once when
        it is not, or once the connection is lost."""
        while self._paused and not self._lost.done():
            if self._drained is None:
                self._drained = self._loop.create_future()
            await asyncio.shield(self._drained)

    def closed_error(self) -> ConnectionClosed:
        """The error for a write on a connection that is not open."""
        protocol = self.protocol
        if protocol.state is _CLOSED:
            return protocol.close_exc
        return ConnectionClosedError(protocol.close_rcvd, protocol.close_sent)

    def _flush(self) -> None:
        """Write what the protocol has to send: a batch of frames in one write."""
        chunks = self.protocol.data_to_send()
        transport = self._transport
        if not chunks or transport is None:
            return
        if all(chunks):
            transport.write(chunks[0] if len(chunks) == 1 else b"".join(chunks))
            return
        for chunk in chunks:  # an empty chunk is the end of our stream (websockets' EOF)
            if chunk:
                transport.write(chunk)
            elif transport.can_write_eof():
                # (uvloop raises RuntimeError, asyncio OSError, on a socket already gone:
                # either way the stream is over, which is all a half-close asks)
                with contextlib.suppress(Exception):
                    transport.write_eof()
            else:
                transport.close()  # TLS: no half-close

    def _resume(self) -> None:
        self._paused = False
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    # -- keepalive ----------------------------------------------------------------------

    def _schedule_ping(self, after: float) -> None:
        """The next keepalive ping, ``ping_interval`` after the loop time ``after``."""
        interval = self._server.ping_interval
        if interval is not None and not self._lost.done():
            self._ping_timer = self._loop.call_at(after + interval, self._ping)

    def _ping(self) -> None:
        """Send a keepalive ping; without its pong in ``ping_timeout``, fail (1011)."""
        self._ping_timer = None
        if self.protocol.state is not _OPEN:
            return
        self._ping_data = os.urandom(4)
        self._ping_sent = self._loop.time()
        self.protocol.send_ping(self._ping_data)
        self._flush()
        timeout = self._server.ping_timeout
        if timeout is not None:
            self._ping_timer = self._loop.call_later(timeout, self._ping_lost)

    def _pong(self) -> None:
        """The keepalive ping's pong: the next ping an interval after this one went."""
        self._ping_data = None
        if self._ping_timer is not None:
            self._ping_timer.cancel()
        self._schedule_ping(self._ping_sent)

    def _ping_lost(self) -> None:
        self._ping_timer = None
        if self.protocol.state is _OPEN:
            self.fail(CloseCode.INTERNAL_ERROR, "keepalive ping timeout")

    def fail(self, code: int, reason: str = "") -> None:
        """Fail the connection (RFC 6455 §7.1.7): a close frame with ``code``, the end of
        our stream, and the TCP connection dropped past the close timeout."""
        self.protocol.fail(code, reason)
        self._flush()
        if self._close_timer is None and not self._lost.done():
            self._expect_close()

    # -- closing ------------------------------------------------------------------------

    @property
    def close_code(self) -> int | None:
        """The close code the peer sent (1006 for none), once closed; ``None`` before."""
        return self.protocol.close_code

    async def close(self, code: int = CloseCode.NORMAL_CLOSURE, reason: str = "") -> None:
        """Close: send a close frame, wait for the peer's and for the TCP connection to
        end, at most the close timeout, then drop it. Idempotent; returns once the
        connection is closed."""
        protocol = self.protocol
        if protocol.state is _OPEN:
            protocol.send_close(code, reason)
            self._flush()
        if self._close_timer is None and not self._lost.done():
            self._expect_close()
        await self.wait_closed()

    async def wait_closed(self) -> None:
        """Wait until the connection is closed (the TCP connection gone)."""
        await asyncio.shield(self._lost)

    def abort(self) -> None:
        """Drop the TCP connection at once, without a closing handshake."""
        if self._transport is not None:
            self._transport.abort()

    def _expect_close(self) -> None:
        """The TCP connection should end now; past the close timeout, drop it."""
        self._close_timer = self._loop.call_later(self._server.close_timeout, self.abort)
