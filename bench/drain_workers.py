"""What K worker processes cost the broker beside one: its CPU per job over a drain.

    PYTHONPATH=. .venv/bin/python bench/drain_workers.py 100000 1
    PYTHONPATH=. .venv/bin/python bench/drain_workers.py 100000 4

Starts ``conveyor serve --store memory`` (``--store sqlite`` as a third argument: a
``--sync full`` file in a temporary directory), fills N jobs with ``Client.enqueue_many``,
then starts K processes that each run an SDK ``Worker`` (prefetch 64, uvloop, an async
handler that counts the job in a shared counter) and, once all are connected, lets them
drain. Printed: jobs/s from "go" to the last job handled, and the broker's CPU
microseconds per job over that time. Run 1 and 4 alternately: the machine drifts.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import subprocess
import sys
import tempfile
import time
from typing import Any

import uvloop
from sdk_drain import cpu_s, free_port  # (run from bench/: the same helpers)

from conveyor import Client, Job, Worker


def work(url: str, count: Any, go: Any, ready: Any, done: Any) -> None:
    """One worker process: start at ``go``, count each job handled, stop at ``done``."""

    async def main() -> None:
        worker = Worker(url, queues=["bench"], prefetch=64)

        @worker.handler("bench")
        async def handle(job: Job) -> None:
            with count.get_lock():
                count.value += 1

        loop = asyncio.get_running_loop()
        ready.release()
        await loop.run_in_executor(None, go.wait)
        running = asyncio.create_task(worker.run())
        await loop.run_in_executor(None, done.wait)
        worker.stop()
        await running

    uvloop.run(main())


def main() -> None:
    n, k = int(sys.argv[1]), int(sys.argv[2])
    store = sys.argv[3] if len(sys.argv) > 3 else "memory"
    port = free_port()
    url = f"ws://127.0.0.1:{port}/ws"
    with tempfile.TemporaryDirectory() as tmp:
        broker = subprocess.Popen(
            [sys.executable, "-m", "conveyor", "serve", "--store", store, "--port", str(port),
             "--db", f"{tmp}/bench.db", "--log-level", "warning"],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        try:
            assert broker.stdout is not None
            broker.stdout.readline()  # "conveyor listening on ..."

            async def fill() -> None:
                async with Client(url) as client:
                    for start in range(0, n, 10_000):
                        jobs = [{"i": i} for i in range(start, min(n, start + 10_000))]
                        await client.enqueue_many("bench", jobs)

            uvloop.run(fill())
            ctx = multiprocessing.get_context("fork")
            count, go, ready, done = ctx.Value("q", 0), ctx.Event(), ctx.Semaphore(0), ctx.Event()
            procs = [ctx.Process(target=work, args=(url, count, go, ready, done)) for _ in range(k)]
            for proc in procs:
                proc.start()
            for _ in procs:
                ready.acquire()
            before = cpu_s(broker.pid)[1]
            started = time.perf_counter()
            go.set()
            while count.value < n:
                time.sleep(0.005)
            seconds = time.perf_counter() - started
            used = cpu_s(broker.pid)[1] - before
            done.set()
            print(
                f"{store}, {k} worker process(es): {n / seconds:,.0f} jobs/s; "
                f"broker CPU {used / n * 1e6:.1f} us per job"
            )
            for proc in procs:
                proc.join(30)
        finally:
            broker.terminate()
            broker.wait()


if __name__ == "__main__":
    main()
