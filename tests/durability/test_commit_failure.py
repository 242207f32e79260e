"""A commit that fails mid-run: nothing it would have confirmed goes out, and the broker
stops (broker/commit.py), with ``--sync normal`` and ``--sync full`` alike; and an fsync that
fails after the commit's pushes left."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from websockets.asyncio.client import connect

from broker.config import Config
from broker.engine import Changes
from broker.server import running_broker
from broker.store import SqliteStore, StoreError

from ..server.conftest import record_writes

WAIT = 5.0


@pytest.mark.parametrize("sync", ["normal", "full"])
async def test_a_failed_commit_sends_no_reply_and_stops_the_broker(
    tmp_path: Path, sync: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = record_writes(monkeypatch)
    config = Config(port=0, store="sqlite", db_path=str(tmp_path / "c.db"), sync=sync)
    async with running_broker(config) as broker:
        ws = await connect(broker.url)
        request = {"op": "ping", "rid": 1}
        await ws.send(orjson.dumps(request).decode())
        assert orjson.loads(await asyncio.wait_for(ws.recv(), WAIT))["ok"] is True
        written.clear()

        def fail(changes: Changes, packed: object = None) -> None:
            raise StoreError("the disk is full")

        monkeypatch.setattr(broker.store, "write", fail)
        request = {"op": "enqueue", "rid": 2, "queue": "q", "payload": 1}
        await ws.send(orjson.dumps(request).decode())
        await asyncio.wait_for(broker.stopped.wait(), WAIT)
        assert written == []  # the enqueue's reply never left
        assert broker.gate is not None and isinstance(broker.gate.failed, StoreError)
        await ws.close()


async def test_a_failed_fsync_after_a_push_left_sends_no_reply_and_stops_the_broker(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    break_fsyncs: Callable[[SqliteStore], None],
) -> None:
    # With --sync full a push leaves once its claim is written, before the fsync (see
    # broker/commit.py); the reply to the enqueue waits for the fsync, which fails here.
    written = record_writes(monkeypatch)
    config = Config(port=0, store="sqlite", db_path=str(tmp_path / "c.db"), sync="full")
    async with running_broker(config) as broker:
        worker = await connect(broker.url)
        request = {"op": "subscribe", "rid": 1, "worker_id": "w", "queues": ["q"]}
        await worker.send(orjson.dumps(request).decode())
        assert orjson.loads(await asyncio.wait_for(worker.recv(), WAIT))["ok"] is True
        publisher = await connect(broker.url)
        written.clear()

        assert isinstance(broker.store, SqliteStore)
        break_fsyncs(broker.store)
        request = {"op": "enqueue", "rid": 2, "queue": "q", "payload": 1}
        await publisher.send(orjson.dumps(request).decode())
        await asyncio.wait_for(broker.stopped.wait(), WAIT)
        assert [orjson.loads(frame).get("push") for frame in written] == ["jobs"]
        assert broker.gate is not None and isinstance(broker.gate.failed, StoreError)
        assert "cannot fsync the WAL" in str(broker.gate.failed)
        await worker.close()
        await publisher.close()
