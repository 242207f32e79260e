"""``--sync full`` (the default): a commit is written on the event loop's thread and the
WAL is fsynced on the writer thread before ``commit`` returns, which is when the commit
gate releases the commit's frames. An fsync that fails stops everything."""

from __future__ import annotations

import errno
import os
import random
import threading
from pathlib import Path

import pytest

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
    every = sqlite_store._CHECKPOINT_EVERY
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


async def test_an_fsync_that_fails_fails_the_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteStore(tmp_path / "eio.db")
    table = store.load(clock=lambda: 1000.0, rng=random.Random(0), max_payload_bytes=1 << 20)
    table.start_journal()
    table.queue("q").enqueue({"i": 1})

    def broken(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fdatasync", broken)
    try:
        with pytest.raises(StoreError, match="cannot fsync the WAL"):
            await store.commit(table.take_changes())
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
