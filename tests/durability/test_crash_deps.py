"""Dependencies through a SIGKILL (docs/contract.md, DEP-1 to DEP-3): a durable broker
killed while jobs wait for their dependencies restarts with them still waiting, with the
results of the dependencies acked before the kill, and goes on: the fan-in runs once the
rest are acked and reads every result; a dependency that fails after the restart still
takes its dependents with it."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from conveyor import Client, Fail, Job, JobFailed, Worker

from .test_crash_flow import WAIT, free_port, start


async def _run_until(worker: Worker, done: asyncio.Event) -> None:
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(done.wait(), WAIT)
    worker.stop()
    await asyncio.wait_for(task, WAIT)


async def test_waiting_jobs_their_edges_and_results_survive_a_sigkill(tmp_path: Path) -> None:
    db, port = tmp_path / "deps.db", free_port()
    url = f"ws://127.0.0.1:{port}/ws"
    proc = await start(db, port)
    try:
        async with Client(url, connect_timeout=WAIT, request_timeout=WAIT) as client:
            early = [await client.enqueue("early", {"i": i}) for i in range(3)]
            late = [await client.enqueue("late", {"i": i}) for i in range(3, 5)]
            final = await client.enqueue("fin", None, after=[*early, *late])
            doomed_root = await client.enqueue("bad", "x")
            doomed = await client.enqueue("fin", "doomed", after=[doomed_root])

            ran: list[int] = []
            three_ran = asyncio.Event()
            first = Worker(url, queues=["early"], shutdown_timeout_s=1.0)

            @first.handler("early")
            async def early_part(job: Job) -> int:
                ran.append(job.payload["i"])
                if len(ran) == 3:
                    three_ran.set()
                return int(job.payload["i"]) * 10

            # The worker's run ends once its reports are answered; a read is answered
            # once what came before it is durable (the broker's default sync).
            await _run_until(first, three_ran)
            info = await client.get_job(final)
            assert info is not None and info.waiting_for == 2

            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()
            proc = await start(db, port)

            info = await client.get_job(final)
            assert info is not None and info.state == "waiting" and info.waiting_for == 2
            assert info.after == (*early, *late)
            stats = await client.stats()
            assert stats["fin"]["waiting"] == 2

            seen: dict[str, Any] = {}
            finished = asyncio.Event()
            second = Worker(url, queues=["late", "fin", "bad"], shutdown_timeout_s=1.0)

            @second.handler("late")
            async def late_part(job: Job) -> int:
                return int(job.payload["i"]) * 10

            @second.handler("bad")
            async def bad(job: Job) -> None:
                raise Fail("bad input")

            @second.handler("fin")
            async def fan_in(job: Job) -> None:
                seen.update(await job.dependency_results())
                finished.set()

            doomed_end = asyncio.ensure_future(client.result(doomed, timeout_s=WAIT))
            await _run_until(second, finished)
            try:
                await doomed_end
            except JobFailed as exc:
                assert exc.error == f"dependency {doomed_root} died: bad input"
            else:
                raise AssertionError("the dependent of a failed job did not die")
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), WAIT)
    assert seen == {job_id: i * 10 for i, job_id in enumerate([*early, *late])}
