"""The hot path of the broker's WebSocket connections, on websockets' asyncio connection.

This module subclasses websockets' ``Connection`` and reads its protocol's buffers: the
broker's ``_Socket`` (broker/server.py) still stands on it. The SDK's end no longer does:
it runs on websockets' public sans-I/O client (``sdk/_transport.py``), and the broker is
to move the same way, after which this module goes.

Writing: websockets writes each frame it has queued with its own ``transport.write``,
which is a system call apiece when the socket keeps up. The broker queues many small
frames at once (replies, pushes), so its connection class overrides ``send_data`` with
``write_joined``, which joins the batch into one write.

Reading: ``DirectReader`` hands each data message to a callback in the same event-loop
callback that received its bytes, instead of websockets' queue and reader task.
"""

from __future__ import annotations

import contextlib
import struct
from asyncio import WriteTransport
from collections import deque
from collections.abc import Callable

from websockets.asyncio.connection import Connection
from websockets.frames import CloseCode, Frame, Opcode
from websockets.protocol import Event, Protocol, State
from websockets.utils import apply_mask as _py_apply_mask

try:  # websockets' C masking, when it was built for this platform (as websockets does)
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover
    apply_mask = _py_apply_mask

__all__ = ["DirectReader", "apply_mask", "text_header", "write_joined"]

# Enum members as module names: reading one off its class (``State.OPEN``) is an attribute
# lookup on the enum class, and these are read for every frame.
_OPEN = State.OPEN
_CONT, _TEXT, _BINARY = Opcode.CONT, Opcode.TEXT, Opcode.BINARY

_HEAD7 = struct.Struct("!BB")
_HEAD16 = struct.Struct("!BBH")
_HEAD64 = struct.Struct("!BBQ")


def text_header(n: int, mask_bit: int = 0) -> bytes:
    """RFC 6455's header of an unfragmented text frame (FIN, opcode 1) of ``n`` bytes,
    with the length in 7, 7+16 or 7+64 bits. ``mask_bit`` 0x80: a client's frame, whose
    4-byte masking key follows the header. (websockets' ``send_text`` builds, checks and
    packs a ``Frame`` per message, which cost either end more than the JSON in it.)"""
    if n < 126:
        return _HEAD7.pack(0x81, mask_bit | n)
    if n < 65536:
        return _HEAD16.pack(0x81, mask_bit | 126, n)
    return _HEAD64.pack(0x81, mask_bit | 127, n)


def write_joined(protocol: Protocol, transport: WriteTransport) -> None:
    """Write everything ``protocol`` has to send, a batch of frames in one write."""
    chunks = protocol.data_to_send()
    if len(chunks) > 1 and all(chunks):
        transport.write(b"".join(chunks))
        return
    for chunk in chunks:  # an empty chunk asks for a half-close: the general path
        if chunk:
            transport.write(chunk)
        elif transport.can_write_eof():
            with contextlib.suppress(Exception):
                transport.write_eof()
        else:
            transport.close()


class DirectReader(Connection):
    """A websockets connection whose data messages go straight to a callback.

    Mix it in before ``ServerConnection`` or ``ClientConnection`` and say which frames
    come in: ``FROM_CLIENTS`` True (the broker's end: every frame masked) or False (the
    SDK's end: none masked), and when the opening handshake is done (``handshaken``).

    A complete data message goes from the bytes received to the handler (``attach``), in
    the same callback that received them. websockets' own path queues each message in an
    assembler and wakes a reader task that awaits it, a future and a task switch per
    message, which was a tenth of the broker's time. Here a text message is checked as
    UTF-8 (invalid: close 1007, as websockets does), a fragmented one is joined first (its
    size is bounded by the parser's ``max_size``), and a binary one is handed over as
    ``bytes``. Messages that arrive before the handler is attached wait, in order, until it
    is; those that arrive after it is detached (the connection is over) are dropped.

    The common frame, a whole text or binary message within ``max_size``, masked as it
    must be, is parsed here (``data_received``): websockets' parser, a generator that
    yields for every field of every frame, was a fifth of the broker's time on small
    requests. Every other frame (ping, pong, close, fragments, reserved bits, a mask where
    none belongs or none where one does, an oversized frame) and everything after it in the
    same read go to websockets' parser, which answers, refuses or closes as the RFC says;
    the fast path takes over again once that parser holds no partial frame.

    With a handler attached, nothing reads through websockets' ``recv``: wait for the end
    with ``wait_closed()``.
    """

    FROM_CLIENTS: bool  # frames arrive masked (a server's end) or unmasked (a client's)

    _sink: Callable[[str | bytes], None] | None = None
    # Messages read but not handed over yet: no handler yet, or it holds (``hold``).
    _waiting: deque[str | bytes] | None = None
    _holding = False
    _detached = False
    _parts: bytearray | None = None  # a fragmented message being joined
    _parts_text = False
    _partial: bytearray | None = None  # the start of a frame the fast path waits out

    def handshaken(self) -> bool:
        """Whether the opening handshake is over (frames come next)."""
        raise NotImplementedError

    def data_received(self, data: bytes) -> None:
        protocol = self.protocol
        if self._partial is not None:
            self._partial += data
            buf: bytes | bytearray = self._partial
            self._partial = None
        elif protocol.state is not _OPEN or protocol.reader.buffer or self._parts is not None:
            # (OPEN at the start of a read means the handshake is over at either end: the
            # server opens once it answered the request, the client's connection has
            # processed the response by the end of the read that opened it.)
            super().data_received(data)
            return
        else:
            buf = data
        view = memoryview(buf)
        size = len(buf)
        max_size = protocol.max_message_size
        masked = self.FROM_CLIENTS
        key = 4 if masked else 0
        pos = 0
        while pos < size:
            if size - pos < 2:
                self._partial = bytearray(view[pos:])
                return
            head = buf[pos]
            length = buf[pos + 1]
            # FIN, no reserved bits, text (1) or binary (2); and the mask bit as it must be.
            if (head != 0x81 and head != 0x82) or (length >= 0x80) != masked:
                break
            length &= 0x7F
            start = pos + 2
            if length == 126:
                start += 2
                if start <= size:
                    length = int.from_bytes(view[pos + 2 : start], "big")
            elif length == 127:
                start += 8
                if start <= size:
                    length = int.from_bytes(view[pos + 2 : start], "big")
            end = start + key + length
            if start <= size and max_size is not None and length > max_size:
                break  # websockets refuses it (1009) before reading it
            if end > size:  # the frame's header or body is still to come
                self._partial = bytearray(view[pos:])
                return
            message: bytes | memoryview
            if masked:
                message = apply_mask(view[start + 4 : end], bytes(view[start : start + 4]))
            else:
                message = view[start:end]
            pos = end
            self._deliver(message, head == 0x81)
            if protocol.state is not _OPEN:
                break  # closing (bad UTF-8): websockets discards the rest
        if pos < size:
            super().data_received(bytes(view[pos:]))

    def attach(self, sink: Callable[[str | bytes], None] | None) -> None:
        """Hand every data message, from now on and those already waiting, to ``sink``;
        ``None``: the handler is done, and later messages are dropped, not kept."""
        self._sink = sink
        self._detached = sink is None
        if sink is None:
            self._waiting = None
        else:
            self._hand_over()

    @property
    def holding(self) -> bool:
        """Whether the handler asked for no more messages for now (``hold``)."""
        return self._holding

    def hold(self) -> None:
        """Stop reading, and keep the messages already read but not yet handed over (the
        rest of the bytes in hand) until ``release()``: the handler wants no more now."""
        if not self._holding:
            self._holding = True
            self.transport.pause_reading()

    def release(self) -> None:
        """Hand over the messages kept by ``hold()``, then read again; if the handler
        holds again meanwhile, the rest stays kept. Nothing to do when not holding."""
        if self._holding:
            self._holding = False
            self._hand_over()
            if not self._holding:
                self.transport.resume_reading()

    def _hand_over(self) -> None:
        """The waiting messages to the handler, in order, until it holds again."""
        waiting = self._waiting
        while waiting and not self._holding and self._sink is not None:
            self._sink(waiting.popleft())

    def process_event(self, event: Event) -> None:
        if not isinstance(event, Frame) or not self.handshaken():
            super().process_event(event)  # the handshake
            return
        opcode = event.opcode
        if opcode is _CONT:
            if self._parts is None:  # the parser lets none through outside a message
                return
            self._parts += event.data
            if not event.fin:
                return
            data: bytes | bytearray | memoryview = self._parts
            text = self._parts_text
            self._parts = None
        elif opcode is _TEXT or opcode is _BINARY:
            if not event.fin:
                self._parts = bytearray(event.data)
                self._parts_text = opcode is _TEXT
                return
            data, text = event.data, opcode is _TEXT
        else:
            super().process_event(event)  # ping, pong, close
            return
        self._deliver(data, text)

    def _deliver(self, data: bytes | bytearray | memoryview, text: bool) -> None:
        """One whole data message, unmasked: to the handler, kept, or dropped."""
        message: str | bytes
        if text:
            try:
                message = str(data, "utf-8")
            except UnicodeDecodeError as exc:
                self.protocol.fail(CloseCode.INVALID_DATA, f"{exc.reason} at position {exc.start}")
                self.send_data()
                return
        else:
            message = bytes(data)
        if self._detached:
            return  # a peer still sending after its connection was handled to the end
        if self._sink is None or self._holding:
            if self._waiting is None:
                self._waiting = deque()
            self._waiting.append(message)
        else:
            self._sink(message)
