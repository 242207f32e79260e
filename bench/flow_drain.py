"""Drain throughput through the SDK with flow-control limits that never bind, against
none: what enforcing limits costs a queue whose limits are generous.

The broker runs as ``python -m conveyor serve`` in a subprocess (``--store memory`` unless
``--store sqlite``); this process enqueues N jobs with ``Client.enqueue_many`` and runs
one ``Worker`` (prefetch 64, an async handler that does nothing) on uvloop until all N
are handled. Each case drains its own queue; the cases run in turn, round after round,
so that the machine's drift falls on all of them alike; the table gives each case's
median jobs/s and its ratio to the case with no limits:

* ``none``: no limits, no partition keys;
* ``global``: ``concurrency`` 10,000 and ``rate`` 10,000,000 per second with a burst of
  10,000 (never reached);
* ``keys-10`` and ``keys-10000``: the jobs spread over 10 or 10,000 partition keys, with
  ``partition_concurrency`` 1,000 and the global limits above (claims take turns across
  the keys).

    PYTHONPATH=. .venv/bin/python bench/flow_drain.py --jobs 50000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

from conveyor import Client, Job, Worker

GLOBAL = {"concurrency": 10_000, "rate": 10_000_000, "burst": 10_000}
CASES: dict[str, tuple[dict[str, Any], int]] = {
    # name: (limits, partition keys; 0 for none)
    "none": ({}, 0),
    "global": (GLOBAL, 0),
    "keys-10": ({**GLOBAL, "partition_concurrency": 1_000}, 10),
    "keys-10000": ({**GLOBAL, "partition_concurrency": 1_000}, 10_000),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def fill(client: Client, queue: str, n: int, keys: int) -> None:
    if not keys:
        for start in range(0, n, 10_000):
            batch = [{"i": i} for i in range(start, min(n, start + 10_000))]
            await client.enqueue_many(queue, batch)
        return
    # One enqueue_many per key (the option is per call), keys interleaved in time.
    per_key = n // keys
    for key in range(keys):
        await client.enqueue_many(queue, [{"i": i} for i in range(per_key)], partition=f"k{key}")


async def drain_one(url: str, queue: str, n: int) -> float:
    worker = Worker(url, queues=[queue], prefetch=64)
    done = asyncio.Event()

    @worker.handler(queue)
    async def handle(job: Job) -> None:
        if worker.handled + 1 >= n:
            done.set()

    started = time.perf_counter()
    running = asyncio.create_task(worker.run())
    await done.wait()
    seconds = time.perf_counter() - started
    worker.stop()
    await running
    return n / seconds


async def run(url: str, jobs: int, rounds: int) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {name: [] for name in CASES}
    async with Client(url) as client:
        for r in range(rounds):
            for name, (limits, keys) in CASES.items():
                queue = f"{name}-{r}"
                n = jobs if not keys else (jobs // keys) * keys
                if limits:
                    await client.set_limits(queue, **limits)
                await fill(client, queue, n, keys)
                rates[name].append(await drain_one(url, queue, n))
                print(f"round {r + 1} {name}: {rates[name][-1]:,.0f} jobs/s", flush=True)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--store", choices=["memory", "sqlite"], default="memory")
    args = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        broker = subprocess.Popen(
            [sys.executable, "-m", "conveyor", "serve", "--store", args.store,
             "--db", str(Path(tmp) / "bench.db"), "--port", str(port),
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
            rates = uvloop.run(run(f"ws://127.0.0.1:{port}/ws", args.jobs, args.rounds))
        finally:
            broker.terminate()
            broker.wait()
    base = statistics.median(rates["none"])
    head = f"case ({args.store}, {args.jobs:,} jobs, median of {args.rounds})"
    print(f"\n| {head} | jobs/s | ÷ none |")
    print("| --- | --- | --- |")
    for name, found in rates.items():
        median = statistics.median(found)
        print(f"| {name} | {median:,.0f} | {median / base:.2f} |")


if __name__ == "__main__":
    main()
