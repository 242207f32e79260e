"""Progress and watching through the SDK as users run them, against real brokers on the
memory and the SQLite store (docs/contract.md, PRG-1 to PRG-7): a handler's
``job.progress`` reaches ``client.watch`` in order and then the end, a retry shows as one,
a handler reporting in a tight loop costs the broker a bounded number of frames and its
watcher gets the final value, and a restarted SQLite broker still has the latest."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from conveyor import JobEvent, SyncClient
from conveyor.broker.config import Config
from conveyor.broker.engine import QueueOpts
from conveyor.broker.server import Broker, running_broker
from conveyor.sdk import Client, InvalidArgument, Job, Retry, Worker
from conveyor.sdk._cli_admin import show_job

from .conftest import BASE_CONFIG, WAIT, Probe, running

KEPT = "kept"  # a queue that keeps finished jobs an hour


@pytest.fixture(params=["memory", "sqlite"])
def config(request: pytest.FixtureRequest, tmp_path: Path) -> Config:
    return dataclasses.replace(
        BASE_CONFIG,
        store=request.param,
        db_path=str(tmp_path / "conveyor.db"),
        queue_opts={KEPT: QueueOpts(completed_retention_s=3600.0)},
    )


def make_worker(broker: Broker, *queues: str, **kwargs: Any) -> Worker:
    kwargs.setdefault("shutdown_timeout_s", 1.0)
    kwargs.setdefault("progress_interval_s", 0.01)
    return Worker(broker.url, queues=list(queues), **kwargs)


def _brief(event: JobEvent) -> tuple[Any, ...]:
    if event.kind == "progress":
        return ("progress", event.attempt, event.progress)
    if event.kind == "retry":
        return ("retry", event.attempt, event.reason, event.error)
    return ("end", event.state, event.result, event.error)


async def test_a_watcher_sees_each_step_in_order_then_the_end_prg_5(
    broker: Broker, client: Client, probe: Probe
) -> None:
    job_id = await client.enqueue(KEPT, {"steps": 3})
    steps = [asyncio.Event() for _ in range(3)]
    worker = make_worker(broker, KEPT)

    @worker.handler(KEPT)
    async def work(job: Job) -> dict[str, Any]:
        for i, step in enumerate(steps):
            await job.progress((i + 1) / 4, f"step {i + 1} of 3")
            await step.wait()
        return {"done": True}

    seen: list[tuple[Any, ...]] = []
    async with running(worker, probe):
        async with asyncio.timeout(WAIT):
            async for event in client.watch(job_id):
                seen.append(_brief(event))
                if event.kind == "progress":
                    steps[int(event.progress["value"] * 4) - 1].set()
    assert seen == [
        ("progress", 1, {"value": 0.25, "message": "step 1 of 3"}),
        ("progress", 1, {"value": 0.5, "message": "step 2 of 3"}),
        ("progress", 1, {"value": 0.75, "message": "step 3 of 3"}),
        ("end", "completed", {"done": True}, None),
    ]
    info = await client.get_job(job_id)
    assert info is not None and info.state == "completed"
    assert info.progress == {"value": 0.75, "message": "step 3 of 3"}  # PRG-4
    shown = show_job(info, time.time()).splitlines()
    assert any(line.startswith("progress:") and line.endswith(" 75% step 3 of 3") for line in shown)


async def test_a_retry_shows_as_an_event_between_the_attempts_prg_5(
    broker: Broker, client: Client, probe: Probe
) -> None:
    job_id = await client.enqueue("q", None)
    worker = make_worker(broker, "q")
    go_on = asyncio.Event()

    @worker.handler("q")
    async def work(job: Job) -> str:
        await job.progress(job.attempt / 10)
        if job.attempt == 1:
            await go_on.wait()
            raise Retry(delay_s=0, error="try again")
        return "second time lucky"

    seen: list[tuple[Any, ...]] = []
    async with running(worker, probe):
        async with asyncio.timeout(WAIT):
            async for event in client.watch(job_id):
                seen.append(_brief(event))
                go_on.set()
    assert seen == [
        ("progress", 1, 0.1),
        ("retry", 1, "failed", "try again"),
        ("progress", 2, 0.2),
        ("end", "completed", "second time lucky", None),
    ]


async def test_a_tight_loop_of_reports_costs_a_bounded_number_of_frames_prg_6(
    broker: Broker, client: Client, probe: Probe
) -> None:
    job_id = await client.enqueue(KEPT, None)
    worker = make_worker(broker, KEPT, progress_interval_s=0.05)
    started = asyncio.Event()
    loop = asyncio.get_running_loop()

    @worker.handler(KEPT)
    def work(job: Job) -> str:  # a plain def, on its thread
        loop.call_soon_threadsafe(started.set)
        for i in range(100_000):
            job.progress(i + 1)
        return "done"

    events: list[JobEvent] = []
    began = time.monotonic()
    async with running(worker, probe):
        async with asyncio.timeout(WAIT * 2):
            async for event in client.watch(job_id):
                events.append(event)
    took = time.monotonic() - began
    frames = probe.handled("progress")
    # At most one frame per interval, plus the last value's before the ack.
    assert 1 <= len(frames) <= 2 + took / 0.05
    assert worker.progress_frames == len(frames)
    assert events[-1].kind == "end" and events[-1].result == "done"
    assert events[-2].kind == "progress" and events[-2].progress == 100_000
    info = await client.get_job(job_id)
    assert info is not None and info.progress == 100_000


async def test_a_bad_progress_value_raises_in_the_handler_naming_the_field_prg_3(
    broker: Broker, client: Client, probe: Probe
) -> None:
    job_id = await client.enqueue(KEPT, None)
    worker = make_worker(broker, KEPT)
    refused: list[InvalidArgument] = []

    @worker.handler(KEPT)
    async def work(job: Job) -> str:
        for value in (float("nan"), "x" * (64 * 1024)):
            try:
                await job.progress(value)
            except InvalidArgument as exc:
                refused.append(exc)
        return "ok"

    async with running(worker, probe):
        assert await client.result(job_id, timeout_s=WAIT) == "ok"
    assert [exc.field for exc in refused] == ["progress", "progress"]
    assert not probe.handled("progress")


async def test_watching_an_unknown_job_ends_at_once_prg_7(client: Client) -> None:
    events = [event async for event in client.watch("no-such-job")]
    assert [_brief(e) for e in events] == [("end", "unknown", None, None)]


async def test_a_sync_client_watches_too(broker: Broker, client: Client, probe: Probe) -> None:
    job_id = await client.enqueue(KEPT, None)
    worker = make_worker(broker, KEPT)

    @worker.handler(KEPT)
    async def work(job: Job) -> int:
        await job.progress(0.5)
        return 7

    def watch() -> list[tuple[Any, ...]]:
        with SyncClient(broker.url, connect_timeout=WAIT) as sync:
            return [_brief(e) for e in sync.watch(job_id)]

    async with running(worker, probe):
        seen = await asyncio.to_thread(watch)
    assert seen[-1] == ("end", "completed", 7, None)
    assert all(e[0] == "progress" for e in seen[:-1])


async def test_a_restarted_sqlite_broker_keeps_the_latest_progress_prg_2(
    tmp_path: Path, probe: Probe
) -> None:
    config = dataclasses.replace(
        BASE_CONFIG, store="sqlite", db_path=str(tmp_path / "kept.db"), sync="full"
    )
    async with running_broker(config) as broker:
        async with Client(broker.url, connect_timeout=WAIT, request_timeout=WAIT) as client:
            job_id = await client.enqueue("q", None, visibility_timeout_s=600.0)
            worker = make_worker(broker, "q", shutdown_timeout_s=0.05)

            @worker.handler("q")
            async def work(job: Job) -> None:
                for i in range(1000):
                    await job.progress({"value": (i + 1) / 1000})
                await asyncio.Event().wait()  # held until the worker stops

            async with running(worker, probe):
                await probe.wait_for(
                    lambda: any(
                        item["progress"] == {"value": 1.0}
                        for h in probe.handled("progress")
                        for item in h.fields["items"]
                    )
                )
    async with running_broker(config) as broker:
        async with Client(broker.url, connect_timeout=WAIT) as client:
            info = await client.get_job(job_id)
    assert info is not None and info.state == "processing"
    assert info.progress == {"value": 1.0}
