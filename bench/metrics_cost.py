"""What one ``/metrics`` scrape costs the broker's event loop, by number of queues.

    .venv/bin/python bench/metrics_cost.py                  # 10 / 1,000 / 5,000 / 20,000
    .venv/bin/python bench/metrics_cost.py --queues 5000 --loop-s 5

Two measurements, both in this one process (no other broker needed):

* ``render``: a table of N queues (each with a few jobs ready, one processing, some
  totals), then the wall time of one fresh render of the body (a new ``Metrics`` each
  round, so no cache is hit), median and best of ``--rounds``.
* ``loop`` (with ``--loop-s``): a real broker on port 0 holding those queues; one client
  sends ``enqueue`` frames one at a time for ``--loop-s`` seconds and times each reply,
  first alone, then while another task scrapes ``/metrics`` back to back. The reply
  times' median, 99th percentile and worst show what a scrape loop costs other clients.

Only public code paths are used, so the same script measures an older ``broker/`` too
(docs/benchmarks.md, "/metrics cost"). Timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from typing import Any

import orjson
from websockets.asyncio.client import connect

from conveyor.broker.backend import LocalBackend
from conveyor.broker.config import Config
from conveyor.broker.engine import JobTable
from conveyor.broker.metrics import Metrics
from conveyor.broker.server import running_broker


def fill(table: JobTable, queues: int) -> None:
    """``queues`` queues, each with two ready jobs, one processing and one acked."""
    for i in range(queues):
        queue = table.queue(f"queue-{i}")
        for n in range(4):
            queue.enqueue(n)
        first = queue.claim_one("bench")
        second = queue.claim_one("bench")
        assert first is not None and second is not None
        first.ack()


def render_ms(table: JobTable, rounds: int) -> tuple[float, float, int]:
    """Median and best milliseconds of one fresh render, and the body's size in bytes."""
    times: list[float] = []
    size = 0
    for _ in range(rounds):
        metrics = Metrics(
            lambda: {n: table.queue(n).stats() for n in table.queues()},
            workers=lambda: 0,
            connections=lambda: 0,
        )
        start = time.perf_counter()
        size = len(metrics.render())
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), min(times), size


async def scrape_forever(host: str, port: int, count: list[int]) -> None:
    """``GET /metrics`` back to back, reading each whole answer."""
    request = f"GET /metrics HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
    while True:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request.encode())
        await reader.read()  # until the broker closes
        writer.close()
        count[0] += 1


async def enqueue_times(url: str, seconds: float) -> list[float]:
    """Milliseconds from sending each ``enqueue`` to its reply, one in flight at a time."""
    times: list[float] = []
    async with connect(url) as ws:
        end = time.perf_counter() + seconds
        rid = 0
        while time.perf_counter() < end:
            rid += 1
            frame = {"op": "enqueue", "rid": rid, "queue": "probe", "payload": rid}
            start = time.perf_counter()
            await ws.send(orjson.dumps(frame).decode())
            reply: dict[str, Any] = orjson.loads(await ws.recv())
            times.append((time.perf_counter() - start) * 1000)
            assert reply["ok"] is True, reply
    return times


def p(times: list[float], q: float) -> float:
    return sorted(times)[min(len(times) - 1, int(q * len(times)))]


async def loop_cost(queues: int, seconds: float) -> None:
    config = Config(port=0, store="memory", sweep_interval_s=60.0)
    async with running_broker(config) as broker:
        backend = broker.backend
        assert isinstance(backend, LocalBackend), "a memory store runs on the local backend"
        fill(backend.table, queues)
        assert broker.server is not None
        host, port = next(iter(broker.server.sockets)).getsockname()[:2]
        alone = await enqueue_times(broker.url, seconds)
        count = [0]
        scraper = asyncio.create_task(scrape_forever(host, port, count))
        try:
            scraped = await enqueue_times(broker.url, seconds)
        finally:
            scraper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await scraper
    for label, times in (("alone", alone), ("scrape loop", scraped)):
        print(
            f"  enqueue reply, {label:<11}: p50 {p(times, 0.5):8.2f} ms  "
            f"p99 {p(times, 0.99):8.2f} ms  max {max(times):8.2f} ms  ({len(times)} replies)"
        )
    print(f"  scrapes answered during the loop: {count[0]} in {seconds:g} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, nargs="*", default=[10, 1_000, 5_000, 20_000])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--loop-s", type=float, default=0.0, help="also run the loop test")
    args = parser.parse_args()
    for queues in args.queues:
        table = JobTable()
        fill(table, queues)
        median, best, size = render_ms(table, args.rounds)
        print(
            f"{queues:>6} queues: render median {median:8.2f} ms, best {best:8.2f} ms, "
            f"body {size / 1e6:6.2f} MB"
        )
        if args.loop_s > 0:
            asyncio.run(loop_cost(queues, args.loop_s))


if __name__ == "__main__":
    main()
