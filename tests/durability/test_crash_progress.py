"""Progress through a SIGKILL (docs/contract.md, PRG-2): a SQLite broker killed while a
worker's progress reports stream in comes back with a job progress at least as recent as
the last report it answered (an answer leaves only once the change is written, and the
latest value of each job rides each commit), and no later than the last one sent."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect

from conveyor import Client

from .test_crash_flow import WAIT, free_port, start_process


async def _worker_lease(url: str, queue: str) -> tuple[Any, str]:
    """A bare worker connection holding the one job of ``queue``: (socket, lease)."""
    ws = await connect(url)
    await ws.send(orjson.dumps({"op": "hello", "rid": 0}).decode())
    await ws.recv()
    subscribe = {"op": "subscribe", "rid": 1, "worker_id": "w", "queues": [queue]}
    await ws.send(orjson.dumps(subscribe).decode())
    async with asyncio.timeout(WAIT):
        while True:
            frame = orjson.loads(await ws.recv())
            if frame.get("push") == "jobs":
                return ws, frame["jobs"][0]["lease"]


@pytest.mark.parametrize("sync", ["full", "normal"])
async def test_answered_progress_survives_a_sigkill_prg_2(tmp_path: Path, sync: str) -> None:
    db, port = tmp_path / "progress.db", free_port()
    url = f"ws://127.0.0.1:{port}/ws"
    proc = await start_process(db, port, "--sync", sync)
    try:
        async with Client(url, connect_timeout=WAIT) as client:
            job_id = await client.enqueue("q", None, visibility_timeout_s=600.0)
        ws, lease = await _worker_lease(url, "q")
        sent = 0
        answered = 0
        rids = itertools.count(10)
        async with asyncio.timeout(WAIT):
            # Reports stream in, 50 unanswered at most; the broker is killed once 300 are
            # answered, with the rest still on the way.
            while answered < 300:
                while sent - answered < 50:
                    sent += 1
                    item = {"id": job_id, "lease": lease, "progress": sent}
                    frame = {"op": "progress", "rid": next(rids), "items": [item]}
                    await ws.send(orjson.dumps(frame).decode())
                reply = orjson.loads(await ws.recv())
                if reply.get("rid") is not None and reply["rid"] >= 10:
                    assert reply["ok"] and reply["landed"] == [True]
                    answered = reply["rid"] - 9  # (replies come in order)
        os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()
        await ws.close()
        proc = await start_process(db, port, "--sync", sync)
        async with Client(url, connect_timeout=WAIT) as client:
            info = await client.get_job(job_id)
        assert info is not None and info.state == "processing"
        assert answered <= info.progress <= sent, (answered, info.progress, sent)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await proc.wait()
