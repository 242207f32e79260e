"""The fsync helper of ``--sync full`` (``broker/store/_wal_sync.py``, ``_fsyncd.py``).

The helper is a process of its own: the event loop asks it for an fsync with one byte
and goes on, and its answer wakes the loop like any socket. These tests run the real
helper; the one that checks which descriptor it fsyncs runs its loop in-process.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.broker.store import StoreError, _fsyncd
from conveyor.broker.store._wal_sync import WalSyncer

WAIT = 5.0


@pytest.fixture
def wal(tmp_path: Path) -> Iterator[int]:
    """A file to fsync, open read-only as the store opens its WAL."""
    path = tmp_path / "some.db-wal"
    path.write_bytes(b"x" * 4096)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    yield fd
    os.close(fd)


def wait_for_exit(pid: int, timeout: float = WAIT) -> bool:
    """Whether process ``pid`` (not necessarily our child) ends within ``timeout``."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([pidfd], [], [], timeout)  # readable once it exits
        return bool(readable)
    finally:
        os.close(pidfd)


async def test_requests_are_answered_in_the_order_they_were_made(wal: int) -> None:
    syncer = WalSyncer(wal, "some.db")
    try:
        futures = [syncer.request() for _ in range(50)]
        ended: list[int] = []
        for i, future in enumerate(futures):
            future.add_done_callback(lambda _, i=i: ended.append(i))
        await asyncio.wait_for(asyncio.gather(*futures), WAIT)
        assert ended == list(range(50))
        assert syncer.syncs == 50
        # One more after a quiet spell: the helper is still there.
        await asyncio.wait_for(syncer.request(), WAIT)
        assert syncer.syncs == 51
    finally:
        syncer.close()


async def test_the_helper_holds_the_file_it_was_given(wal: int, tmp_path: Path) -> None:
    syncer = WalSyncer(wal, "some.db")
    try:
        await asyncio.wait_for(syncer.request(), WAIT)
        held = os.stat(f"/proc/{syncer.pid}/fd/{wal}")
        assert (held.st_dev, held.st_ino) == (os.fstat(wal).st_dev, os.fstat(wal).st_ino)
        assert held.st_ino == (tmp_path / "some.db-wal").stat().st_ino
    finally:
        syncer.close()


def test_each_read_of_requests_is_one_fdatasync_of_the_file_then_one_answer_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[object] = []
    requests_r, requests_w = os.pipe()
    answers_r, answers_w = os.pipe()
    real_read = os.read

    def reading(fd: int, n: int) -> bytes:
        data = real_read(fd, n)
        events.append(("read", len(data)))
        return data

    monkeypatch.setattr(_fsyncd.os, "read", reading)
    monkeypatch.setattr(_fsyncd.os, "fdatasync", lambda fd: events.append(("fdatasync", fd)))
    os.write(requests_w, b"\0\0\0")
    os.close(requests_w)  # end of input after those three
    try:
        assert _fsyncd.serve(42, requests_r, answers_w) == 0
        assert real_read(answers_r, 100) == b"\0\0\0"
    finally:
        for fd in (requests_r, answers_r, answers_w):
            os.close(fd)
    assert events == [("read", 3), ("fdatasync", 42), ("read", 0)]


def test_a_failed_fdatasync_is_reported_and_ends_the_helper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    requests_r, requests_w = os.pipe()
    answers_r, answers_w = os.pipe()

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(_fsyncd.os, "fdatasync", broken)
    os.write(requests_w, b"\0\0")  # input left unread: the helper stops at the failure
    try:
        assert _fsyncd.serve(7, requests_r, answers_w) == 1
        assert os.read(answers_r, 100) == b"\x01[Errno 5] Input/output error"
    finally:
        for fd in (requests_r, requests_w, answers_r, answers_w):
            os.close(fd)


async def test_a_failed_fsync_fails_that_request_and_every_later_one() -> None:
    # A pipe cannot be fsynced (EINVAL): the real helper's fdatasync really fails.
    read_end, write_end = os.pipe()
    syncer = WalSyncer(read_end, "broken.db")
    try:
        first = syncer.request()
        with pytest.raises(StoreError, match=r"broken\.db: cannot fsync the WAL: .*Invalid"):
            await asyncio.wait_for(first, WAIT)
        with pytest.raises(StoreError, match="cannot fsync the WAL"):
            syncer.request()
        assert syncer.syncs == 0
    finally:
        syncer.close()
        os.close(read_end)
        os.close(write_end)


async def test_a_helper_that_dies_fails_the_requests_in_flight_and_every_later_one(
    wal: int,
) -> None:
    syncer = WalSyncer(wal, "some.db")
    try:
        await asyncio.wait_for(syncer.request(), WAIT)  # it is up and answering
        os.kill(syncer.pid, signal.SIGKILL)
        assert wait_for_exit(syncer.pid)
        # (The request may find the pipe closed at once, or its answer never comes.)
        with pytest.raises(StoreError, match=r"some\.db: the fsync helper"):
            await asyncio.wait_for(syncer.request(), WAIT)
        with pytest.raises(StoreError, match="the fsync helper"):
            syncer.request()
    finally:
        syncer.close()


async def test_the_helper_outlives_the_signals_sent_to_the_brokers_process_group(
    wal: int,
) -> None:
    syncer = WalSyncer(wal, "some.db")
    try:
        await asyncio.wait_for(syncer.request(), WAIT)  # past its start: handlers are set
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            os.kill(syncer.pid, sig)
        await asyncio.wait_for(syncer.request(), WAIT)
        assert syncer.syncs == 2
    finally:
        syncer.close()


async def test_close_ends_the_helper_and_later_requests_fail(wal: int) -> None:
    syncer = WalSyncer(wal, "some.db")
    await asyncio.wait_for(syncer.request(), WAIT)
    pid = syncer.pid
    syncer.close()
    assert wait_for_exit(pid, 0)  # close waited for it
    with pytest.raises(StoreError, match="the store is closed"):
        syncer.request()
    syncer.close()  # twice is fine


def test_a_broker_killed_with_sigkill_leaves_no_helper_behind(tmp_path: Path) -> None:
    # The helper reads until end of input: when the broker dies, its end of the pipe
    # closes and the helper exits by itself.
    script = textwrap.dedent(
        f"""
        import asyncio, os, sys
        from conveyor.broker.store._wal_sync import WalSyncer

        async def main():
            fd = os.open({str(tmp_path / "x.db-wal")!r}, os.O_RDWR | os.O_CREAT)
            syncer = WalSyncer(fd, "x.db")
            await syncer.request()
            print(syncer.pid, flush=True)
            await asyncio.Event().wait()  # until killed

        asyncio.run(main())
        """
    )
    root = Path(__file__).resolve().parents[2]
    broker = subprocess.Popen(
        [sys.executable, "-c", script], cwd=root, stdout=subprocess.PIPE, text=True
    )
    try:
        assert broker.stdout is not None
        helper = int(broker.stdout.readline())
        assert not wait_for_exit(helper, 0)  # alive while the "broker" is
        broker.kill()
        broker.wait(WAIT)
        assert wait_for_exit(helper)
    finally:
        if broker.poll() is None:
            broker.kill()
            broker.wait()
        if broker.stdout is not None:
            broker.stdout.close()
