"""A commit that fails mid-run: nothing it would have confirmed goes out, and the broker
stops (broker/commit.py), with ``--sync normal`` and ``--sync full`` alike; and an fsync that
fails after the commit's pushes left. ``conveyor serve`` then exits with status 3 (a store
failure while running; broker/cli.py)."""

from __future__ import annotations

import asyncio
import resource
import signal
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from conveyor.broker.config import Config
from conveyor.broker.engine import Changes
from conveyor.broker.server import running_broker
from conveyor.broker.store import SqliteStore, StoreError

from ..server.conftest import record_writes
from .test_store_errors import START, serving

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

        monkeypatch.setattr(broker.backend.store, "write", fail)
        request = {"op": "enqueue", "rid": 2, "queue": "q", "payload": 1}
        await ws.send(orjson.dumps(request).decode())
        await asyncio.wait_for(broker.stopped.wait(), WAIT)
        assert written == []  # the enqueue's reply never left
        assert broker.backend.commit_gate is not None and isinstance(
            broker.backend.commit_gate.failed, StoreError
        )
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

        assert isinstance(broker.backend.store, SqliteStore)
        break_fsyncs(broker.backend.store)
        request = {"op": "enqueue", "rid": 2, "queue": "q", "payload": 1}
        await publisher.send(orjson.dumps(request).decode())
        await asyncio.wait_for(broker.stopped.wait(), WAIT)
        assert [orjson.loads(frame).get("push") for frame in written] == ["jobs"]
        assert broker.backend.commit_gate is not None and isinstance(
            broker.backend.commit_gate.failed, StoreError
        )
        assert "cannot fsync the WAL" in str(broker.backend.failed)
        await worker.close()
        await publisher.close()


def _files_of_at_most(limit: int) -> Callable[[], None]:
    """For the broker's process: no file it writes may grow past ``limit`` bytes; a
    write past it fails (EFBIG) instead of killing the process (SIGXFSZ)."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.mark.parametrize("sync", ["normal", "full"])
async def test_a_store_that_fails_while_running_makes_serve_exit_3(
    tmp_path: Path, sync: str
) -> None:
    db = tmp_path / "c.db"
    flags = ("--sync", sync)
    async with serving(db, *flags, preexec=_files_of_at_most(256 * 1024)) as served:
        ws = await connect(served.url)
        replies = 0
        try:
            for rid in range(1, 100):  # 64 KiB each: the WAL reaches the limit before
                request = {"op": "enqueue", "rid": rid, "queue": "q", "payload": "x" * 65536}
                await ws.send(orjson.dumps(request).decode())
                reply = orjson.loads(await asyncio.wait_for(ws.recv(), WAIT))
                assert reply["ok"] is True
                replies += 1
        except ConnectionClosed:  # the broker stopped
            pass
        finally:
            await ws.close()
        _, err = await asyncio.wait_for(served.proc.communicate(), START)
    assert 0 < replies < 99
    assert served.proc.returncode == 3, err
    message = err.decode()
    assert "CRITICAL conveyor.commit: the store failed; stopping: " in message, message
    assert f"{db}: write failed: " in message, message
    assert "Traceback" not in message, message
