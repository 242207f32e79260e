"""``--sync full`` (the default): a commit is written on the event loop's thread and the
WAL is fsynced before the commit returns, which is when the commit gate releases the
commit's frames: on the same thread while fsyncs are fast (``commit_now``), on the writer
thread when the gate calls ``commit`` (a checkpointing commit, or for a while after a
slow fsync). An fsync that fails stops everything."""

from __future__ import annotations

import errno
import os
import random
import threading
from pathlib import Path
from typing import NamedTuple

import pytest

from broker.engine import JobTable, Queue
from broker.store import SqliteStore, StoreError
from broker.store import sqlite as sqlite_store


async def test_every_commit_returns_after_an_fsync_of_the_wal_on_the_writer_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "full.db"
    store = SqliteStore(path)  # sync="full", the default
    table = store.load(clock=lambda: 1000.0, rng=random.Random(0), max_payload_bytes=1 << 20)
    table.start_journal()
    queue = table.queue("q")
    events: list[tuple[str, str, int]] = []
    write, fdatasync = store.write, os.fdatasync

    def spy_write(changes: object) -> None:
        write(changes)  # type: ignore[arg-type]
        events.append(("write", threading.current_thread().name, 0))

    def spy_fdatasync(fd: int) -> None:
        fdatasync(fd)
        events.append(("fsync", threading.current_thread().name, os.fstat(fd).st_ino))

    fsynced: list[int] = []
    fsync = os.fsync

    def spy_fsync(fd: int) -> None:
        fsync(fd)
        fsynced.append(os.fstat(fd).st_ino)

    store.write = spy_write  # type: ignore[method-assign]
    monkeypatch.setattr(os, "fdatasync", spy_fdatasync)
    monkeypatch.setattr(os, "fsync", spy_fsync)
    every = sqlite_store._CHECKPOINT_EVERY_FULL
    commits = every + 5
    try:
        for i in range(commits):
            queue.enqueue({"i": i})
            before = len(events)
            await store.commit(table.take_changes())
            # commit returned only after its own write, then an fsync of the WAL file.
            kinds = [kind for kind, _, _ in events[before:]]
            assert kinds == ["write", "fsync"], (i, kinds)
        wal_inode = (tmp_path / "full.db-wal").stat().st_ino
    finally:
        store.close()
    loop_thread = threading.current_thread().name
    writes = [thread for kind, thread, _ in events if kind == "write"]
    syncs = [(thread, inode) for kind, thread, inode in events if kind == "fsync"]
    assert len(writes) == len(syncs) == commits
    # Every fsync was of the WAL file, off the event loop's thread.
    assert {inode for _, inode in syncs} == {wal_inode}
    # ... and the directory that holds it was fsynced once, so the WAL's entry survives.
    assert fsynced == [os.stat(tmp_path).st_ino]
    assert all(thread.startswith("conveyor-sqlite") for thread, _ in syncs)
    # The writes ran here, except the one whose turn it was to checkpoint.
    assert writes.count(loop_thread) == commits - 1
    assert store.checkpoints == 1
    assert store.syncs == commits

    reopened = SqliteStore(path)
    try:
        again = reopened.load(clock=lambda: 1000.0, rng=random.Random(0), max_payload_bytes=1 << 20)
    finally:
        reopened.close()
    assert again.queue("q").stats().ready == commits


@pytest.mark.parametrize("where", ["commit", "commit_now"])
async def test_an_fsync_that_fails_fails_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    # On the writer thread (commit) and on the caller's (commit_now) alike.
    store = SqliteStore(tmp_path / "eio.db")
    table = store.load(clock=lambda: 1000.0, rng=random.Random(0), max_payload_bytes=1 << 20)
    table.queue("q").enqueue({"i": 1})

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fdatasync", broken)
    try:
        with pytest.raises(StoreError, match="cannot fsync the WAL"):
            if where == "commit":
                await store.commit(table.take_changes())
            else:
                store.commit_now(table.take_changes())
    finally:
        store.close()


async def test_normal_never_fsyncs_a_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteStore(tmp_path / "normal.db", sync="normal")
    table = store.load(clock=lambda: 1000.0, rng=random.Random(0), max_payload_bytes=1 << 20)
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


class FakeClock:
    """Times the store's inline fsyncs: each one "takes" ``fsync_s`` (set by the test)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.fsync_s = 0.0001

    def __call__(self) -> float:
        return self.now


class Spied(NamedTuple):
    store: SqliteStore
    table: JobTable
    queue: Queue
    clock: FakeClock
    threads: list[str]  # the thread of every fdatasync, in order


def _spied_store(path: Path, monkeypatch: pytest.MonkeyPatch) -> Spied:
    """A ``full`` store timed by a ``FakeClock``, whose fdatasyncs are recorded by thread;
    each fdatasync moves the clock by ``clock.fsync_s``."""
    clock = FakeClock()
    store = SqliteStore(path, clock=clock)
    table = store.load(clock=lambda: 1000.0, rng=random.Random(0), max_payload_bytes=1 << 20)
    threads: list[str] = []
    fdatasync = os.fdatasync

    def spy(fd: int) -> None:
        fdatasync(fd)
        threads.append(threading.current_thread().name)
        clock.now += clock.fsync_s

    monkeypatch.setattr(os, "fdatasync", spy)
    return Spied(store, table, table.queue("q"), clock, threads)


async def test_commit_now_fsyncs_on_the_callers_thread_before_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, table, queue, _, threads = _spied_store(tmp_path / "inline.db", monkeypatch)
    here = threading.current_thread().name
    made_here = 0
    try:
        for i in range(sqlite_store._CHECKPOINT_EVERY_FULL + 5):
            queue.enqueue({"i": i})
            changes = table.take_changes()
            before = len(threads)
            if store.commit_now(changes):
                made_here += 1
                assert threads[before:] == [here], i  # its fsync, made before it returned
            else:
                await store.commit(changes)  # the checkpointing one: the writer thread
                assert [t.startswith("conveyor-sqlite") for t in threads[before:]] == [True]
    finally:
        store.close()
    assert made_here == sqlite_store._CHECKPOINT_EVERY_FULL + 4
    assert store.syncs == sqlite_store._CHECKPOINT_EVERY_FULL + 5


async def test_after_a_slow_fsync_the_next_ones_go_to_the_writer_thread_for_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_store, "_OFFLOAD_COMMITS", 10)
    monkeypatch.setattr(sqlite_store, "_CHECKPOINT_EVERY_FULL", 1000)  # none in this test
    store, table, queue, clock, threads = _spied_store(tmp_path / "slow.db", monkeypatch)
    here = threading.current_thread().name
    places: list[str] = []  # where each commit's fsync ran

    async def one(i: int) -> None:
        queue.enqueue({"i": i})
        changes = table.take_changes()
        if not store.commit_now(changes):
            await store.commit(changes)
        places.append("here" if threads[-1] == here else "thread")

    try:
        await one(0)
        clock.fsync_s = sqlite_store._INLINE_FSYNC_LIMIT_S * 2  # the disk slows down
        await one(1)
        clock.fsync_s = 0.0001
        for i in range(2, 14):
            await one(i)
    finally:
        store.close()
    # The slow fsync was made here; the next 10 commits fsynced on the writer thread;
    # then the store tried here again.
    assert places == ["here", "here", *["thread"] * 10, "here", "here"]
    reopened = SqliteStore(tmp_path / "slow.db")
    try:
        again = reopened.load(clock=lambda: 1000.0, rng=random.Random(0), max_payload_bytes=1 << 20)
    finally:
        reopened.close()
    assert again.queue("q").stats().ready == 14
