"""``--sync normal``: commits are written on the event loop's thread. Every
``_CHECKPOINT_EVERY``-th starts a checkpoint beside the commits, on a thread and a
connection of its own, which no commit waits for; once the WAL holds more than
``_RESTART_FRAMES`` frames, the next checkpoint is a whole one on the writer thread, after
its commit's write, that restarts the WAL. So the WAL stays bounded however long the
commits keep coming."""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from conveyor.broker.store import SqliteStore
from conveyor.broker.store import sqlite as sqlite_store


async def test_normal_commits_inline_checkpoints_beside_them_and_keeps_the_wal_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    restart_frames = 120
    monkeypatch.setattr(sqlite_store, "_RESTART_FRAMES", restart_frames)
    path = tmp_path / "normal.db"
    store = SqliteStore(path, sync="normal")
    table = store.load(clock=lambda: 1000.0, rng=random.Random(0), max_payload_bytes=1 << 20)
    queue = table.queue("q")
    every = sqlite_store._CHECKPOINT_EVERY
    threads: list[str] = []
    write = store.write

    def spy(changes: object, packed: object = None) -> None:
        threads.append(threading.current_thread().name)
        write(changes, packed)  # type: ignore[arg-type]

    store.write = spy  # type: ignore[method-assign]
    commits = every * 20
    sizes = []
    wal = path.parent / (path.name + "-wal")
    try:
        for i in range(commits):
            queue.enqueue({"i": i, "pad": "x" * 200})
            changes = table.take_changes()
            if not store.commit_now(changes):  # as the commit gate does
                await store.commit(changes)
            sizes.append(wal.stat().st_size)
    finally:
        store.close()
    here = threading.current_thread().name
    whole = store.checkpoints
    # Most checkpoints ran beside the commits; the WAL was restarted now and then.
    assert store.side_checkpoints >= 1 and whole >= 1
    assert store.side_checkpoints + whole == commits // every
    # Every commit was written here, those of the whole checkpoints too (only their
    # checkpoint ran on the writer thread).
    assert threads == [here] * commits
    # The WAL never held much more than the restart threshold: its frames, plus those of
    # the commits between two checkpoints (a few pages each), and the header.
    frame = 4096 + 24
    assert max(sizes) <= (restart_frames + 2 * every * 8) * frame + 32, max(sizes)

    reopened = SqliteStore(path, sync="normal")
    try:
        again = reopened.load(clock=lambda: 1000.0, rng=random.Random(0), max_payload_bytes=1 << 20)
    finally:
        reopened.close()
    assert again.queue("q").stats().ready == commits


async def test_a_checkpoint_beside_the_commits_does_not_hold_them_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteStore(tmp_path / "side.db", sync="normal")
    table = store.load(clock=lambda: 1000.0, rng=random.Random(0), max_payload_bytes=1 << 20)
    queue = table.queue("q")
    every = sqlite_store._CHECKPOINT_EVERY
    started, release = threading.Event(), threading.Event()
    side = store._side_checkpoint

    def held(commit_no: int) -> None:
        started.set()
        assert release.wait(10)
        side(commit_no)

    monkeypatch.setattr(store, "_side_checkpoint", held)
    try:
        made_here = 0
        # The first checkpointing commit starts one beside the commits, held until the
        # test lets it go; the commits after it go on meanwhile.
        for i in range(every + every // 2):
            queue.enqueue({"i": i})
            if store.commit_now(table.take_changes()):
                made_here += 1
        assert started.wait(10)
        # Every commit was made at once, on this thread, the checkpoint still held.
        assert made_here == every + every // 2
        assert store.side_checkpoints == 0
        release.set()
        assert store._side is not None
        store._side.result(timeout=10)
    finally:
        release.set()
        store.close()
    assert store.side_checkpoints == 1 and store.checkpoints == 0
