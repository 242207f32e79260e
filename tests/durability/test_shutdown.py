"""A clean stop commits what closing the connections changed.

With no disconnect grace a worker's jobs lapse as soon as its connection ends, and a
broker that stops ends every connection. Those lapses are changes like any other: they
are committed before the store closes. (With ``--sync full`` their commit's fsync was
still in flight when the store closed: the broker logged "the store failed" at CRITICAL
on an ordinary stop.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect

from broker.config import Config
from broker.server import running_broker

WAIT = 5.0


async def call(ws: ClientConnection, request: dict[str, Any]) -> dict[str, Any]:
    await ws.send(orjson.dumps(request).decode())
    while True:
        frame: dict[str, Any] = orjson.loads(await asyncio.wait_for(ws.recv(), WAIT))
        if frame.get("rid") == request["rid"]:
            return frame


@pytest.mark.parametrize("sync", ["normal", "full"])
async def test_a_stop_commits_the_lapses_of_the_connections_it_closed(
    tmp_path: Path, sync: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = Config(
        port=0, store="sqlite", db_path=str(tmp_path / "c.db"), sync=sync, disconnect_grace_s=0
    )
    async with running_broker(config) as broker:
        worker = await connect(broker.url)
        subscribe = {"op": "subscribe", "rid": 1, "worker_id": "w", "queues": ["q"]}
        assert (await call(worker, subscribe))["ok"] is True
        publisher = await connect(broker.url)
        job_id = (await call(publisher, {"op": "enqueue", "rid": 1, "queue": "q", "payload": 1}))[
            "id"
        ]
        push = orjson.loads(await asyncio.wait_for(worker.recv(), WAIT))
        assert [job["id"] for job in push["jobs"]] == [job_id]
        # The broker stops with the worker still holding the job (a lease of 300 s).
    stopped_at = time.time()
    async with running_broker(replace(config, disconnect_grace_s=60.0)) as again:
        # The lapse was committed: the lease ended at the stop, so the job is
        # reclaimable at once (contract: it is counted "processing" until reclaimed).
        job = again.table.get_job(job_id)
        assert job is not None and job.attempts == 1
        assert job.deadline is not None and job.deadline <= stopped_at
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
