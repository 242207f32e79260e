"""Fixtures for the durability tests."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from conveyor.broker.store import SqliteStore
from conveyor.broker.store._wal_sync import WalSyncer


@pytest.fixture
def break_fsyncs() -> Iterator[Callable[[SqliteStore], None]]:
    """``break_fsyncs(store)``: from then on every fsync the store asks of its helper
    fails, for real: the helper is replaced by one given a pipe, which cannot be fsynced
    (EINVAL). The checkpointing commits' fsyncs, on the writer thread, are not touched."""
    pipes: list[int] = []

    def apply(store: SqliteStore) -> None:
        assert store._syncer is not None, "a --sync full store, loaded"
        read_end, write_end = os.pipe()
        pipes.extend((read_end, write_end))
        store._syncer.close()
        store._syncer = WalSyncer(read_end, str(store.path))

    yield apply
    for fd in pipes:
        os.close(fd)
