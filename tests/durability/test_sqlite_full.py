"""``--sync full`` (the default): a commit is written on the event loop's thread, and the
WAL is then fsynced by the store's helper process before the commit counts as durable,
which is when the commit gate releases the commit's replies. The loop does not wait for
the disk meanwhile: ``commit_now`` hands back a future for the fsync, and the next
commits may be written while it is in flight. A checkpointing commit is written here too,
and then fsynced and checkpointed on the writer thread. An fsync that fails stops
everything."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from conveyor.broker.engine import Changes, JobTable
from conveyor.broker.store import SqliteStore, StoreError
from conveyor.broker.store import sqlite as sqlite_store

WAIT = 5.0


def _load(store: SqliteStore) -> JobTable:
    return store.load(clock=lambda: 1000.0, rng=random.Random(0), max_payload_bytes=1 << 20)


def _ready_after_restart(path: Path) -> int:
    reopened = SqliteStore(path)
    try:
        return _load(reopened).queue("q").stats().ready
    finally:
        reopened.close()


async def test_every_commit_returns_after_the_helper_fsynced_the_wal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "full.db"
    fsynced: list[int] = []  # inodes given to os.fsync in this process
    fsync = os.fsync

    def spy_fsync(fd: int) -> None:
        fsync(fd)
        fsynced.append(os.fstat(fd).st_ino)

    monkeypatch.setattr(os, "fsync", spy_fsync)
    store = SqliteStore(path)  # sync="full", the default
    table = _load(store)
    at_load = list(fsynced)
    table.start_journal()
    queue = table.queue("q")
    syncer = store._syncer
    assert syncer is not None
    events: list[tuple[str, str]] = []
    write, fdatasync = store.write, os.fdatasync
    request, answered = syncer.request, syncer._answered

    def spy_write(changes: Changes, packed: tuple[str, bytes] | None = None) -> None:
        write(changes, packed)
        events.append(("write", threading.current_thread().name))

    def spy_request() -> asyncio.Future[None]:
        events.append(("ask the helper", threading.current_thread().name))
        return request()

    def spy_answered() -> None:
        before = syncer.syncs
        answered()
        events.extend([("helper answered", "")] * (syncer.syncs - before))

    def spy_fdatasync(fd: int) -> None:
        fdatasync(fd)
        events.append(("fdatasync here", threading.current_thread().name))

    store.write = spy_write  # type: ignore[method-assign]
    syncer.request = spy_request  # type: ignore[method-assign]
    syncer._answered = spy_answered  # type: ignore[method-assign]
    monkeypatch.setattr(os, "fdatasync", spy_fdatasync)
    every = sqlite_store._CHECKPOINT_EVERY_FULL
    commits = every + 5
    loop_thread = threading.current_thread().name
    try:
        for i in range(commits):
            queue.enqueue({"i": i})
            before = len(events)
            await store.commit(table.take_changes())
            kinds = [kind for kind, _ in events[before:]]
            if i == every - 1:
                # The checkpointing commit: written here (its pushes may leave then),
                # then fsynced on the writer thread, which checkpoints after it.
                assert kinds == ["write", "fdatasync here"], (i, kinds)
                assert events[before][1] == loop_thread
                assert events[before + 1][1].startswith("conveyor-sqlite")
            else:
                # Written here, then the helper asked, and only its answer ends the commit.
                assert kinds == ["write", "ask the helper", "helper answered"], (i, kinds)
                assert events[before][1] == loop_thread
        wal = (tmp_path / "full.db-wal").stat()
        held = os.stat(f"/proc/{syncer.pid}/fd/{store._wal_fd}")
        assert (held.st_dev, held.st_ino) == (wal.st_dev, wal.st_ino)  # the helper's file
    finally:
        store.close()
    # The WAL's directory was fsynced at load, so that the WAL's entry survives; no
    # commit fsyncs on the loop's thread.
    assert os.stat(tmp_path).st_ino in at_load
    assert fsynced == at_load
    assert store.checkpoints == 1
    assert store.syncs == commits
    assert _ready_after_restart(path) == commits


async def test_commit_now_writes_at_once_and_the_next_commit_need_not_wait_for_its_fsync(
    tmp_path: Path,
) -> None:
    path = tmp_path / "pipelined.db"
    store = SqliteStore(path)
    table = _load(store)
    queue = table.queue("q")
    try:
        queue.enqueue({"i": 1})
        first = store.commit_now(table.take_changes())
        assert isinstance(first, asyncio.Future)
        # The fsync's answer can only arrive through the loop: nothing was awaited yet.
        assert not first.done()
        queue.enqueue({"i": 2})
        second = store.commit_now(table.take_changes())
        assert isinstance(second, asyncio.Future) and not second.done()
        ended: list[str] = []
        first.add_done_callback(lambda _: ended.append("first"))
        second.add_done_callback(lambda _: ended.append("second"))
        await asyncio.wait_for(asyncio.gather(first, second), WAIT)
        assert ended == ["first", "second"]
        assert store.commits == 2 and store.syncs == 2
    finally:
        store.close()
    assert _ready_after_restart(path) == 2


async def test_commit_now_leaves_a_checkpointing_commit_to_commit(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "turns.db")
    table = _load(store)
    queue = table.queue("q")
    every = sqlite_store._CHECKPOINT_EVERY_FULL
    try:
        for i in range(every + 3):
            queue.enqueue({"i": i})
            changes = table.take_changes()
            done = store.commit_now(changes)
            if i == every - 1:
                assert done is False and store.commits == i  # nothing written
                await store.commit(changes)
                assert store.checkpoints == 1
            else:
                assert isinstance(done, asyncio.Future)
                await asyncio.wait_for(done, WAIT)
    finally:
        store.close()
    assert store.commits == every + 3


async def _by_commit(store: SqliteStore, changes: Changes) -> None:
    await store.commit(changes)


async def _by_commit_now(store: SqliteStore, changes: Changes) -> None:
    done = store.commit_now(changes)
    assert isinstance(done, asyncio.Future)
    await asyncio.wait_for(done, WAIT)


@pytest.mark.parametrize("commit", [_by_commit, _by_commit_now], ids=["commit", "commit_now"])
async def test_an_fsync_that_fails_fails_the_commit_and_every_later_one(
    tmp_path: Path,
    break_fsyncs: Callable[[SqliteStore], None],
    commit: Callable[[SqliteStore, Changes], Awaitable[None]],
) -> None:
    store = SqliteStore(tmp_path / "eio.db")
    table = _load(store)
    try:
        break_fsyncs(store)
        table.queue("q").enqueue({"i": 1})
        with pytest.raises(StoreError, match="cannot fsync the WAL"):
            await commit(store, table.take_changes())
        table.queue("q").enqueue({"i": 2})
        with pytest.raises(StoreError, match="cannot fsync the WAL"):
            await commit(store, table.take_changes())
    finally:
        store.close()


async def test_a_failed_fsync_on_the_writer_thread_fails_the_checkpointing_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "_CHECKPOINT_EVERY_FULL", 1)  # every commit
    store = SqliteStore(tmp_path / "eio.db")
    table = _load(store)

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fdatasync", broken)
    table.queue("q").enqueue({"i": 1})
    try:
        with pytest.raises(StoreError, match=r"cannot fsync the WAL: .*Input/output error"):
            await store.commit(table.take_changes())
    finally:
        store.close()


async def test_normal_never_fsyncs_a_commit_and_starts_no_helper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteStore(tmp_path / "normal.db", sync="normal")
    table = _load(store)
    table.start_journal()
    calls: list[int] = []
    monkeypatch.setattr(os, "fdatasync", calls.append)
    try:
        for i in range(5):
            table.queue("q").enqueue({"i": i})
            await store.commit(table.take_changes())
    finally:
        store.close()
    assert calls == [] and store.syncs == 0
    assert store._syncer is None
