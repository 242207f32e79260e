"""``--sync normal``: commits are written on the event loop's thread, and every
``_CHECKPOINT_EVERY``-th goes to the writer thread with a checkpoint, which keeps the WAL
small however long the commits keep coming."""

from __future__ import annotations

import random
import threading
from pathlib import Path

from broker.store import SqliteStore
from broker.store import sqlite as sqlite_store


async def test_normal_commits_inline_checkpoints_and_keeps_the_wal_bounded(
    tmp_path: Path,
) -> None:
    path = tmp_path / "normal.db"
    store = SqliteStore(path, sync="normal")
    table = store.load(clock=lambda: 1000.0, rng=random.Random(0), max_payload_bytes=1 << 20)
    table.start_journal()
    queue = table.queue("q")
    every = sqlite_store._CHECKPOINT_EVERY
    threads: set[str] = set()
    write = store.write

    def spy(changes: object) -> None:
        threads.add(threading.current_thread().name)
        write(changes)  # type: ignore[arg-type]

    store.write = spy  # type: ignore[method-assign]
    commits = every * 20
    sizes = []
    try:
        for i in range(commits):
            queue.enqueue({"i": i, "pad": "x" * 200})
            await store.commit(table.take_changes())
            if i % every == every - 1:
                sizes.append((path.parent / (path.name + "-wal")).stat().st_size)
    finally:
        store.close()
    # Most commits ran right here; the checkpointing ones on the writer thread.
    assert threading.current_thread().name in threads
    assert any(name.startswith("conveyor-sqlite") for name in threads)
    assert store.checkpoints == commits // every
    # The WAL does not grow with the number of commits: it restarts after each checkpoint.
    assert max(sizes[len(sizes) // 2 :]) <= max(sizes[: len(sizes) // 2]) * 1.5

    reopened = SqliteStore(path, sync="normal")
    try:
        again = reopened.load(clock=lambda: 1000.0, rng=random.Random(0), max_payload_bytes=1 << 20)
    finally:
        reopened.close()
    assert again.queue("q").stats().ready == commits
