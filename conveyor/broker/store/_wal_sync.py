"""fsyncs of the WAL made by a helper process, so that the event loop never waits on the disk.

An fsync made on the event loop's thread stops the broker for the disk's whole latency
(a quarter of a millisecond on a fast virtual disk, milliseconds on a slow one); made on
a thread, its end waits for the GIL, which the busy loop holds. A helper process
(``_fsyncd.py``) has neither cost: the loop writes one byte to its stdin per request and
goes on, and the helper's answer wakes the loop through its stdout like any socket.

``request()`` once a commit is written; the future it returns ends when an fsync that
began after that call has returned (or raises ``StoreError``). Futures end in the order
they were asked for. A helper that fails, or goes away, fails every request in flight and
every later one: the broker must then promise nothing more. ``close()`` at the end.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections import deque
from pathlib import Path

from ._base import StoreError

__all__ = ["WalSyncer"]

HELPER = Path(__file__).with_name("_fsyncd.py")
_CLOSE_WAIT_S = 10.0  # for the helper to finish its last fsync and exit


class WalSyncer:
    """The helper process for one open file (``fd``, named ``path`` in messages)."""

    def __init__(self, fd: int, path: str) -> None:
        """Start the helper. Raises StoreError when it cannot be started."""
        self.path = path
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(HELPER), str(fd)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                pass_fds=(fd,),
            )
        except OSError as exc:
            raise StoreError(f"{path}: cannot start the fsync helper: {exc}") from None
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._to = self._proc.stdin.fileno()
        self._from = self._proc.stdout.fileno()
        os.set_blocking(self._from, False)
        self._pending: deque[asyncio.Future[None]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._failed: StoreError | None = None
        self.syncs = 0  # requests answered (for tests and metrics)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def request(self) -> asyncio.Future[None]:
        """Ask for an fsync of everything written so far; call on the event loop. Raises
        StoreError at once when the helper already failed."""
        if self._failed is not None:
            raise self._failed
        loop = self._loop
        if loop is None or loop.is_closed():
            loop = self._bind()
        future = loop.create_future()
        self._pending.append(future)
        try:
            os.write(self._to, b"\0")  # one byte: a pipe takes it whole, or not at all
        except OSError as exc:
            self._fail(f"the fsync helper is gone: {exc}")
        return future

    def _bind(self) -> asyncio.AbstractEventLoop:
        if self._pending:  # futures of another loop, which can no longer end
            self._fail("the event loop changed with fsyncs in flight")
            assert self._failed is not None
            raise self._failed
        loop = asyncio.get_running_loop()
        loop.add_reader(self._from, self._readable)
        self._loop = loop
        return loop

    def _readable(self) -> None:
        self._answered()  # looked up each time, so that a test may wrap it

    def _answered(self) -> None:
        try:
            data = os.read(self._from, 65536)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(f"the fsync helper is gone: {exc}")
            return
        if not data:
            self._fail("the fsync helper exited")
            return
        failed = data.find(1)
        answered = len(data) if failed < 0 else failed
        pending = self._pending
        for _ in range(answered):
            future = pending.popleft()
            if not future.done():
                future.set_result(None)
        self.syncs += answered
        if failed >= 0:
            reason = data[failed + 1 :].decode(errors="replace") or "unknown error"
            self._fail(f"cannot fsync the WAL: {reason}")

    def _fail(self, reason: str) -> None:
        if self._failed is None:
            self._failed = StoreError(f"{self.path}: {reason}")
        self._unbind()
        while self._pending:
            future = self._pending.popleft()
            if not future.done():
                future.set_exception(self._failed)

    def _unbind(self) -> None:
        loop, self._loop = self._loop, None
        if loop is not None and not loop.is_closed():
            loop.remove_reader(self._from)

    def close(self) -> None:
        """Let the helper finish the fsync it is in, and end it. Requests still waiting
        fail (the store is closing). Idempotent."""
        if self._proc.returncode is None and self._proc.stdin is not None:
            self._unbind()
            try:
                self._proc.stdin.close()  # end of input: the helper exits
                self._proc.wait(_CLOSE_WAIT_S)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
            if self._proc.stdout is not None:
                self._proc.stdout.close()
        if self._failed is None:
            self._fail("the store is closed")
