"""One SDK worker drains N jobs from an in-memory broker: jobs/s and CPU per job.

The broker runs as ``python -m conveyor serve --store memory`` in a subprocess; this
process enqueues N jobs with ``Client.enqueue_many``, then runs a ``Worker`` (prefetch 64,
an async handler that does nothing) on uvloop until all N are handled. Printed: the
drain's jobs per second and the CPU microseconds per job of the worker (this process) and
of the broker over the drain alone (not the enqueues). A quick A/B between two trees:

    PYTHONPATH=. .venv/bin/python bench/sdk_drain.py 150000

run alternately in each tree, several times: timings here are noisy, compare medians.
"""

from __future__ import annotations

import asyncio
import os
import resource
import socket
import subprocess
import sys
import time

import uvloop

from conveyor import Client, Job, Worker

N = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds of this process and of process ``pid``."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return ru.ru_utime + ru.ru_stime, (int(fields[11]) + int(fields[12])) / ticks


async def drain(url: str, broker_pid: int) -> None:
    async with Client(url) as client:
        for start in range(0, N, 10_000):
            await client.enqueue_many("bench", [{"i": i} for i in range(start, start + 10_000)])
    worker = Worker(url, queues=["bench"], prefetch=64)
    done = asyncio.Event()

    @worker.handler("bench")
    async def handle(job: Job) -> None:
        if worker.handled + 1 >= N:
            done.set()

    before = cpu_s(broker_pid)
    started = time.perf_counter()
    running = asyncio.create_task(worker.run())
    await done.wait()
    seconds = time.perf_counter() - started
    after = cpu_s(broker_pid)
    worker.stop()
    await running
    us = [1e6 * (b - a) / N for a, b in zip(before, after, strict=True)]
    print(
        f"{N / seconds:,.0f} jobs/s ({seconds:.2f} s); CPU per job: "
        f"worker {us[0]:.1f} us, broker {us[1]:.1f} us"
    )


def main() -> None:
    port = free_port()
    broker = subprocess.Popen(
        [sys.executable, "-m", "conveyor", "serve", "--store", "memory", "--port", str(port),
         "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        uvloop.run(drain(f"ws://127.0.0.1:{port}/ws", broker.pid))
    finally:
        broker.terminate()
        broker.wait()


if __name__ == "__main__":
    main()
