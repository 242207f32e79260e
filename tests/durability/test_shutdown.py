"""A clean stop commits what closing the connections changed.

With no disconnect grace a worker's jobs lapse as soon as its connection ends, and a
broker that stops ends every connection. Those lapses are changes like any other: they
are committed before the store closes. (With ``--sync full`` their commit's fsync was
still in flight when the store closed: the broker logged "the store failed" at CRITICAL
on an ordinary stop.)
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from conveyor.broker.config import Config
from conveyor.broker.server import running_broker

from ..server.conftest import RawClient


@pytest.mark.parametrize("sync", ["normal", "full"])
async def test_a_stop_commits_the_lapses_of_the_connections_it_closed(
    tmp_path: Path, sync: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = Config(
        port=0, store="sqlite", db_path=str(tmp_path / "c.db"), sync=sync, disconnect_grace_s=0
    )
    async with running_broker(config) as broker:
        worker = RawClient(await connect(broker.url))
        await worker.call("subscribe", worker_id="w", queues=["q"])
        publisher = RawClient(await connect(broker.url))
        job_id = (await publisher.call("enqueue", queue="q", payload=1))["id"]
        assert [job["id"] for job in await worker.jobs(1)] == [job_id]
        # The broker stops with the worker still holding the job (a lease of 300 s).
    stopped_at = time.time()
    async with running_broker(replace(config, disconnect_grace_s=60.0)) as again:
        # The lapse was committed: the lease ended at the stop, so the job is
        # reclaimable at once (docs/contract.md, CLM-2 and HND-11: it is counted
        # "processing" until reclaimed).
        job = again.backend.table.get_job(job_id)
        assert job is not None and job.attempts == 1
        assert job.deadline is not None and job.deadline <= stopped_at
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
