"""What a drain costs the broker and its workers, by worker processes and prefetch.

    PYTHONPATH=. .venv/bin/python bench/drain_workers.py 100000 1
    PYTHONPATH=. .venv/bin/python bench/drain_workers.py 100000 4
    PYTHONPATH=. .venv/bin/python bench/drain_workers.py 100000 1 --store sqlite --prefetch 256

Starts ``conveyor serve --store memory`` (``--store sqlite``: a ``--sync full`` file in a
temporary directory), fills N jobs with ``Client.enqueue_many``, then starts K processes
that each run an SDK ``Worker`` (``--prefetch``, 64 unless told, uvloop, an async
handler that counts the job in a shared counter) and, once all have started, lets them
connect and drain. Printed: jobs/s from "go" to the last job handled, and the broker's CPU and the
worker processes' CPU (together), in microseconds per job, over that time. Run the
settings you compare alternately: the machine drifts.
"""

from __future__ import annotations

import argparse
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


def work(url: str, prefetch: int, count: Any, go: Any, ready: Any, done: Any) -> None:
    """One worker process: start at ``go``, count each job handled, stop at ``done``."""

    async def main() -> None:
        worker = Worker(url, queues=["bench"], prefetch=prefetch)

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
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("n", type=int, help="jobs to drain")
    parser.add_argument("k", type=int, help="worker processes")
    parser.add_argument("--store", choices=["memory", "sqlite"], default="memory")
    parser.add_argument("--prefetch", type=int, default=64, help="each worker's prefetch")
    args = parser.parse_args()
    n, k, store = args.n, args.k, args.store
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
            procs = [
                ctx.Process(target=work, args=(url, args.prefetch, count, go, ready, done))
                for _ in range(k)
            ]
            for proc in procs:
                proc.start()
            for _ in procs:
                ready.acquire()
            before = cpu_s(broker.pid)[1]
            workers_before = sum(cpu_s(proc.pid)[1] for proc in procs if proc.pid)
            started = time.perf_counter()
            go.set()
            while count.value < n:
                time.sleep(0.005)
            seconds = time.perf_counter() - started
            used = cpu_s(broker.pid)[1] - before
            workers_used = sum(cpu_s(proc.pid)[1] for proc in procs if proc.pid) - workers_before
            done.set()
            print(
                f"{store}, {k} worker process(es), prefetch {args.prefetch}: "
                f"{n / seconds:,.0f} jobs/s; "
                f"broker CPU {used / n * 1e6:.1f} us per job, "
                f"workers' CPU {workers_used / n * 1e6:.1f} us per job"
            )
            for proc in procs:
                proc.join(30)
        finally:
            broker.terminate()
            broker.wait()


if __name__ == "__main__":
    main()
