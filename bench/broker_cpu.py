"""The broker process's CPU per job, as users drive it: an SDK ``Client`` publishing
(64 enqueues in flight), then one SDK ``Worker`` draining (prefetch 64).

    .venv/bin/python bench/broker_cpu.py [--store memory|sqlite] [--jobs 30000]

The broker runs as its own process (``python -m conveyor serve``, started from whatever
``broker`` package this interpreter imports, so ``PYTHONPATH=<tree>`` measures another
tree); its user and system CPU time is read from ``/proc/<pid>/stat`` around each phase.
CPU per job is steadier than throughput on a shared machine: it does not count the time
the broker waited for a core.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time

import uvloop

from conveyor.sdk import Client, Job, Worker

WARMUP = 2000


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_broker(store: str) -> tuple[subprocess.Popen[bytes], str]:
    """A broker process on a free port, listening; its process and URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    folder = tempfile.mkdtemp(prefix="conveyor-cpu-")
    broker = subprocess.Popen(
        [sys.executable, "-m", "conveyor", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--store", store, "--db", os.path.join(folder, "bench.db")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            break
        except OSError:
            time.sleep(0.05)
    return broker, f"ws://127.0.0.1:{port}/ws"


async def measure(pid: int, url: str, jobs: int) -> tuple[float, float]:
    """Broker (process ``pid``, at ``url``) CPU µs per enqueued job and per drained job."""
    async with Client(url) as client:
        slots = asyncio.Semaphore(64)

        async def one(i: int) -> None:
            async with slots:
                await client.enqueue("q", i)

        await asyncio.gather(*(one(i) for i in range(WARMUP)))
        before = cpu_seconds(pid)
        await asyncio.gather(*(one(i) for i in range(jobs)))
        enqueue = (cpu_seconds(pid) - before) / jobs
    total = jobs + WARMUP
    done = asyncio.Event()
    seen = 0
    worker = Worker(url, ["q"], prefetch=64)

    @worker.handler("q")
    async def handle(job: Job) -> None:
        nonlocal seen
        seen += 1
        if seen >= total:
            done.set()

    before = cpu_seconds(pid)
    running = asyncio.ensure_future(worker.run())
    await done.wait()
    drain = (cpu_seconds(pid) - before) / total
    worker.stop()
    await running
    return enqueue * 1e6, drain * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="memory", choices=["memory", "sqlite"])
    parser.add_argument("--jobs", type=int, default=30_000)
    args = parser.parse_args()
    broker, url = start_broker(args.store)
    try:
        enqueue, drain = uvloop.run(measure(broker.pid, url, args.jobs))  # as the SDK runs
    finally:
        broker.terminate()
        broker.wait()
    print(f"{args.store}: broker CPU per job: enqueue {enqueue:.1f} µs, drain {drain:.1f} µs")


if __name__ == "__main__":
    main()
