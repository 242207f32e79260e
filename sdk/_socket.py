"""One socket write for a batch of WebSocket frames, for both ends of the protocol.

websockets writes each frame it has queued with its own ``transport.write``, which is a
system call apiece when the socket keeps up. Both the broker and the SDK queue many small
frames at once (replies, pushes, pipelined requests, acks), so their connection classes
override ``send_data`` with this, which joins the batch into one write.
"""

from __future__ import annotations

import contextlib
from asyncio import WriteTransport

from websockets.protocol import Protocol

__all__ = ["write_joined"]


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
