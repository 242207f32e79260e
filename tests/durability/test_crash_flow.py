"""Flow control through a SIGKILL (docs/contract.md, FLW-2 and FLW-9): a durable broker
killed while a queue's slots are held keeps the queue's limits, counts the slots from the
leases it restores, and the limits hold at every instant after the restart while the
workers re-attach their leases and finish."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections import Counter
from pathlib import Path

from conveyor import Client, Job, Worker

ROOT = Path(__file__).resolve().parents[2]
WAIT = 15.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def start(db: Path, port: int) -> asyncio.subprocess.Process:
    return await start_process(db, port)


async def start_process(db: Path, port: int, *extra: str) -> asyncio.subprocess.Process:
    """``conveyor serve`` on SQLite at ``db`` and ``port`` (with ``extra`` flags), once
    it accepts connections."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conveyor", "serve", "--store", "sqlite", "--db", str(db),
        "--port", str(port), "--disconnect-grace", "30", "--log-level", "warning", *extra,
        cwd=ROOT,
        stdout=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    async with asyncio.timeout(WAIT):
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                return proc
            except OSError:
                if proc.returncode is not None:
                    raise AssertionError(f"the broker exited with {proc.returncode}") from None
                await asyncio.sleep(0.05)  # polling a port: there is no event to wait on


async def test_limits_and_held_slots_survive_a_sigkill(tmp_path: Path) -> None:
    db, port = tmp_path / "flow.db", free_port()
    url = f"ws://127.0.0.1:{port}/ws"
    proc = await start(db, port)
    running: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    started: list[str] = []
    release = asyncio.Event()
    two_running = asyncio.Event()
    all_done = asyncio.Event()
    worker = Worker(url, queues=["crm"], prefetch=8, shutdown_timeout_s=1.0)

    @worker.handler("crm")
    async def handle(job: Job) -> None:
        key = job.partition or ""
        started.append(key)
        running[key] += 1
        running["*"] += 1
        for k in (key, "*"):
            peak[k] = max(peak[k], running[k])
        if running["*"] == 2:
            two_running.set()
        await release.wait()
        running[key] -= 1
        running["*"] -= 1
        if len(started) == 6 and running["*"] == 0:
            all_done.set()

    try:
        async with Client(url, connect_timeout=WAIT, request_timeout=WAIT) as client:
            await client.set_limits("crm", concurrency=2, partition_concurrency=1)
            for key in ("a", "a", "a", "b", "b", "c"):
                await client.enqueue("crm", {"key": key}, partition=key)
            task = asyncio.create_task(worker.run())
            await asyncio.wait_for(two_running.wait(), WAIT)
            before = (await client.stats("crm"))["crm"]
            assert (before["processing"], before["ready"], before["limited"]) == (2, 4, 4)

            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()
            proc = await start(db, port)

            # The limits were kept and the two leases hold their slots again.
            after = (await client.stats("crm"))["crm"]
            assert after["limits"]["concurrency"] == 2
            assert after["limits"]["partition_concurrency"] == 1
            assert (after["processing"], after["ready"], after["limited"]) == (2, 4, 4)
            assert len(started) == 2  # nothing more was handed out meanwhile
            release.set()
            await asyncio.wait_for(all_done.wait(), WAIT)
            worker.stop()
            await asyncio.wait_for(task, WAIT)
            final = (await client.stats("crm"))["crm"]
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), WAIT)
    assert sorted(started) == ["a", "a", "a", "b", "b", "c"]
    assert peak["*"] <= 2 and max(peak[k] for k in "abc") == 1
    assert (final["processing"], final["ready"], final["limited"]) == (0, 0, 0)
