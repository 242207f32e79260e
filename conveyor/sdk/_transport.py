"""The SDK's WebSocket connection: an asyncio protocol in front of websockets' sans-I/O
client (``websockets.client.ClientProtocol``, see websockets' "sans-I/O" how-to).

websockets' protocol object parses and builds every frame, answers pings and close
frames, and enforces ``max_size``; this module owns the socket around it, for what the
SDK needs and websockets' own asyncio connection does otherwise:

- Each data message goes to a callback (``attach``) in the same event-loop callback
  that received its bytes: no assembler queue and no reader task, a future and a task
  switch per message fewer.
- A batch of frames leaves in one ``transport.write`` (``write_texts``): websockets'
  connection writes every frame on its own, a system call apiece.
- Keepalive pings, the close handshake's timeout and the write buffer's back pressure
  are timers and futures on the loop, not tasks.

Only documented public names of websockets are used; no class of it is subclassed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from collections.abc import Callable, Mapping
from typing import cast

from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed, ConnectionClosedError, InvalidMessage
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import USER_AGENT, Response
from websockets.protocol import State
from websockets.uri import parse_uri

__all__ = ["Socket", "connect"]

# Enum members as module names: reading one off its class (``State.OPEN``) is an attribute
# lookup on the enum class, and these are read for every frame.
_OPEN, _CLOSED = State.OPEN, State.CLOSED
_CONT, _TEXT, _BINARY, _PONG = Opcode.CONT, Opcode.TEXT, Opcode.BINARY, Opcode.PONG

# The write buffer's high-water mark, websockets' own default (``write_limit``): past it
# the socket is not ``writable`` and ``send_texts`` waits for it to drain.
_WRITE_LIMIT = 2**15


async def connect(
    url: str,
    *,
    headers: Mapping[str, str],
    open_timeout: float | None,
    max_size: int | None,
    ping_interval: float | None = 20.0,
    ping_timeout: float | None = 20.0,
    close_timeout: float = 10.0,
) -> Socket:
    """An open WebSocket connection to ``url`` (``ws://`` over TCP, ``wss://`` over TLS
    with the system's trusted certificates), its opening handshake done.

    ``headers`` go with the handshake request. Incoming messages may be up to
    ``max_size`` bytes (larger: websockets closes with 1009). Every ``ping_interval``
    seconds a ping goes out; no pong within ``ping_timeout`` fails the connection
    (1011). ``close_timeout`` bounds the wait for the broker's side of a closing.

    Raises ``TimeoutError`` past ``open_timeout`` seconds, ``OSError`` when the socket
    cannot connect, ``websockets.exceptions.InvalidStatus`` when the server answers the
    handshake with another HTTP status than 101 (``exc.response.status_code``), another
    ``InvalidHandshake`` for any other failed handshake, ``InvalidURI`` for a bad URL.
    Cancelled, it leaves no socket open.
    """
    uri = parse_uri(url)
    loop = asyncio.get_running_loop()
    protocol = ClientProtocol(uri, max_size=max_size)
    sock: Socket | None = None
    try:
        async with asyncio.timeout(open_timeout):
            _, sock = await loop.create_connection(
                lambda: Socket(protocol, ping_interval, ping_timeout, close_timeout),
                uri.host,
                uri.port,
                ssl=True if uri.secure else None,
            )
            await sock.handshake(headers)
    except BaseException:
        if sock is not None:
            sock.abort()
        raise
    return sock


class Socket(asyncio.Protocol):
    """One client WebSocket connection: made by ``connect``, then used by one session.

    Reading: every complete data message (text as ``str``, checked as UTF-8; binary as
    ``bytes``) goes to the handler given to ``attach``. Messages that arrive before a
    handler is attached wait, in order, until it is; those after it is detached
    (``attach(None)``) are dropped. Wait for the end with ``wait_closed()``.

    Writing: ``write_texts`` while ``writable``; ``send_texts`` waits for the write
    buffer to drain after writing. Both take UTF-8 text (``encode`` makes it so).
    """

    def __init__(
        self,
        protocol: ClientProtocol,
        ping_interval: float | None,
        ping_timeout: float | None,
        close_timeout: float,
    ) -> None:
        self._protocol = protocol
        self._ping_interval = ping_interval
        self._ping_timeout = ping_timeout
        self._close_timeout = close_timeout
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._opened: asyncio.Future[None] = loop.create_future()  # a response, or lost
        self._lost: asyncio.Future[None] = loop.create_future()
        self._paused = False  # the write buffer is over its high-water mark
        self._drained: asyncio.Future[None] | None = None  # set when it is not any more
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
        self._close_timer: asyncio.TimerHandle | None = None

    # -- opening ----------------------------------------------------------------------

    async def handshake(self, headers: Mapping[str, str]) -> None:
        """Send the opening handshake's request with ``headers``; return once the
        response accepted it. Raises what ``connect`` raises for a refused handshake."""
        protocol = self._protocol
        request = protocol.connect()
        for name, value in headers.items():
            request.headers[name] = value
        request.headers.setdefault("User-Agent", USER_AGENT)
        protocol.send_request(request)
        self._flush()
        await asyncio.shield(self._opened)
        if protocol.handshake_exc is not None:
            raise protocol.handshake_exc
        if protocol.state is not _OPEN:  # lost before a response could be parsed
            raise InvalidMessage("the connection closed during the opening handshake")
        self._schedule_ping(self._loop.time())

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (a cast, not an isinstance check: uvloop's transports do not subclass asyncio's)
        self._transport = cast(asyncio.Transport, transport)
        self._transport.set_write_buffer_limits(high=_WRITE_LIMIT)

    def data_received(self, data: bytes) -> None:
        protocol = self._protocol
        protocol.receive_data(data)
        events = protocol.events_received()
        self._flush()  # pongs, the echo of a close frame, a failure's close frame
        if self._close_timer is None and protocol.close_expected():
            self._expect_close()
        for event in events:
            if isinstance(event, Frame):
                if event.fin and (event.opcode is _TEXT or event.opcode is _BINARY):
                    if not self._deliver(event.data, event.opcode is _TEXT):
                        return  # closing (bad UTF-8): nothing after it is handed over
                elif not self._frame(event):
                    return
            elif isinstance(event, Response) and not self._opened.done():
                self._opened.set_result(None)

    def eof_received(self) -> None:
        self._protocol.receive_eof()
        self._flush()
        # (returning None closes the transport: after the broker's end of the stream a
        # WebSocket has nothing left to write)

    def connection_lost(self, exc: Exception | None) -> None:
        self._protocol.receive_eof()  # idempotent: the state is CLOSED from here on
        self._protocol.data_to_send()  # nowhere to write it any more
        for timer in (self._ping_timer, self._close_timer):
            if timer is not None:
                timer.cancel()
        self._ping_timer = self._close_timer = None
        if not self._opened.done():
            self._opened.set_result(None)
        if not self._lost.done():
            self._lost.set_result(None)
        self._resume()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._resume()

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
                self._protocol.fail(CloseCode.INVALID_DATA, f"{exc.reason} at position {exc.start}")
                self._flush()
                if self._close_timer is None:
                    self._expect_close()
                return False
        else:
            message = bytes(data)
        if self._detached:
            return True  # the session is done with this socket
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

    @property
    def writable(self) -> bool:
        """Whether a write now goes straight out: open, and the buffer not over its mark."""
        return not self._paused and self._protocol.state is _OPEN

    def write_texts(self, texts: list[bytes]) -> None:
        """Write ``texts`` as text frames, in one write with whatever websockets queued
        before them (a pong), in order. Call only while the connection is open."""
        send = self._protocol.send_text
        for text in texts:
            send(text)
        self._flush()

    async def send_texts(self, texts: list[bytes]) -> None:
        """``write_texts``, then wait while the write buffer is over its mark.

        Raises ``ConnectionClosed`` when the connection is not open, or closes while
        waiting; nothing is written then.
        """
        if self._protocol.state is not _OPEN:
            raise self._closed()
        self.write_texts(texts)
        while self._paused:
            if self._drained is None:
                self._drained = self._loop.create_future()
            await asyncio.shield(self._drained)
        if self._lost.done():
            raise self._closed()

    def _flush(self) -> None:
        """Write what the protocol has to send: a batch of frames in one write."""
        chunks = self._protocol.data_to_send()
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
                transport.close()

    def _resume(self) -> None:
        self._paused = False
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def _closed(self) -> ConnectionClosed:
        """The error for a write on a connection that is not open."""
        protocol = self._protocol
        if protocol.state is _CLOSED:
            return protocol.close_exc
        return ConnectionClosedError(protocol.close_rcvd, protocol.close_sent)

    # -- keepalive ----------------------------------------------------------------------

    def _schedule_ping(self, after: float) -> None:
        """The next keepalive ping, ``ping_interval`` after the loop time ``after``."""
        if self._ping_interval is not None and not self._lost.done():
            self._ping_timer = self._loop.call_at(after + self._ping_interval, self._ping)

    def _ping(self) -> None:
        """Send a keepalive ping; without its pong in ``ping_timeout``, fail (1011)."""
        self._ping_timer = None
        if self._protocol.state is not _OPEN:
            return
        self._ping_data = os.urandom(4)
        self._ping_sent = self._loop.time()
        self._protocol.send_ping(self._ping_data)
        self._flush()
        if self._ping_timeout is not None:
            self._ping_timer = self._loop.call_later(self._ping_timeout, self._ping_lost)

    def _pong(self) -> None:
        """The keepalive ping's pong: the next ping an interval after this one went."""
        self._ping_data = None
        if self._ping_timer is not None:
            self._ping_timer.cancel()
        self._schedule_ping(self._ping_sent)

    def _ping_lost(self) -> None:
        self._ping_timer = None
        if self._protocol.state is _OPEN:
            self._protocol.fail(CloseCode.INTERNAL_ERROR, "keepalive ping timeout")
            self._flush()
            if self._close_timer is None:
                self._expect_close()

    # -- closing ------------------------------------------------------------------------

    @property
    def close_code(self) -> int | None:
        """The close code the broker sent (1006 for none), once the connection is closed;
        ``None`` before."""
        return self._protocol.close_code

    @property
    def close_reason(self) -> str | None:
        """The close reason the broker sent, once the connection is closed."""
        return self._protocol.close_reason

    async def close(self, code: int = CloseCode.NORMAL_CLOSURE, reason: str = "") -> None:
        """Close: send a close frame, wait for the broker to finish the closing handshake
        and drop the TCP connection, at most ``close_timeout`` seconds, then drop it
        ourselves. Idempotent; returns once the connection is closed."""
        protocol = self._protocol
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
        """The broker should close the TCP connection now; past ``close_timeout``, drop
        it ourselves (RFC 6455 §7.1.1: the server closes first, the client waits)."""
        self._close_timer = self._loop.call_later(self._close_timeout, self.abort)
