"""One socket write for a batch of WebSocket frames, for both ends of the protocol.

websockets writes each frame it has queued with its own ``transport.write``, which is a
system call apiece when the socket keeps up. Both the broker and the SDK queue many small
frames at once (replies, pushes, pipelined requests, acks), so their connection classes
override ``send_data`` with this, which joins the batch into one write.
"""

from __future__ import annotations

import contextlib
import os
import struct
from asyncio import WriteTransport

from websockets.protocol import Protocol
from websockets.utils import apply_mask as _py_apply_mask

try:  # websockets' C masking, when it was built for this platform (as websockets does)
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover
    apply_mask = _py_apply_mask

__all__ = ["apply_mask", "masked_text_frames", "text_header", "write_joined"]

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


class _MaskKeys:
    """Masking keys for a client's frames (RFC 6455 §5.3: unpredictable, from a strong
    source of entropy): the OS's CSPRNG, read 1,024 keys at a time instead of once per
    frame (websockets' way, a system call per frame). A forked child draws its own."""

    def __init__(self) -> None:
        self._pool = b""
        self._at = 0
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._pool, self._at = b"", 0

    def take(self) -> bytes:
        at = self._at
        if at >= len(self._pool):
            self._pool, at = os.urandom(4096), 0
        self._at = at + 4
        return self._pool[at : at + 4]


_masks = _MaskKeys()


def masked_text_frames(texts: list[bytes]) -> bytes:
    """Client text frames (FIN, unfragmented, masked) for ``texts``, joined for one write.

    Each text must be valid UTF-8 (``encode`` makes it so).
    """
    parts: list[bytes] = []
    take = _masks.take
    for data in texts:
        parts.append(text_header(len(data), 0x80))
        mask = take()
        parts.append(mask)
        parts.append(apply_mask(data, mask))
    return b"".join(parts)


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
