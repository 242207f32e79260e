"""The fsync helper of ``--sync full``: a process of its own that fsyncs the WAL on request.

Run by ``WalSyncer`` (``_wal_sync.py``) as ``python -I -S _fsyncd.py FD``, with the WAL
open as descriptor ``FD``. It reads requests from stdin, one byte each; for every read
it makes one ``fdatasync`` of ``FD``, which covers every request read (each was sent after
the write it asks to make durable), and then writes one zero byte per request to stdout.
When an fsync fails it writes ``b"\\x01"`` and the error's text, and exits: the pages it
failed to write may be gone from the page cache, so no later fsync could be trusted.

It ignores SIGINT, SIGTERM and SIGHUP, which a terminal or a service manager sends to the
broker's whole process group: the broker, stopping, still has its last commits to sync,
and closes stdin when it is done. End of stdin (the broker closed it, or died) ends this.

Standard library only, nothing else imported: it starts in milliseconds, with ``-S``.
"""

from __future__ import annotations

import os
import signal
import sys


def serve(fd: int, requests: int = 0, answers: int = 1) -> int:
    """Answer fsync requests read from ``requests`` on ``answers`` until end of input;
    return the exit status (0 at the end of input, 1 after a failed fsync)."""
    while True:
        # At most 4,096 requests per fsync, so that the answer fits in a pipe's buffer.
        asked = os.read(requests, 4096)
        if not asked:
            return 0
        try:
            os.fdatasync(fd)
        except OSError as exc:
            os.write(answers, b"\x01" + str(exc).encode(errors="replace"))
            return 1
        os.write(answers, bytes(len(asked)))


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    return serve(int(sys.argv[1]))


if __name__ == "__main__":
    sys.exit(main())
