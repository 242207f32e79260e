"""End-to-end jobs/s through a real broker process, with raw WebSocket clients.

    .venv/bin/python bench/e2e.py [--jobs 20000] [--stores memory,sqlite]

For each store, in one run: start ``conveyor serve`` on a free port (SQLite in a fresh
temporary file), then

* enqueue: one publisher sends N jobs of ~100 bytes with up to 64 requests in flight,
  each counted when its reply (the broker's durable acceptance) arrives;
* drain: one worker (prefetch 64) takes all N, acking each pushed frame's jobs with one
  ``ack_batch``;
* flow: the publisher and the worker run at once, N more jobs, until the last ack.

It checks that every job was handled exactly once, and prints jobs/s and the ratio of
each store to the first. Timings on a shared machine are noisy: compare the ratios of one
run, not absolute numbers across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import connect

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = {"to": "someone@example.com", "subject": "hello", "body": "x" * 40}
IN_FLIGHT = 64


async def start_broker(store: str, db: Path) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conveyor", "serve", "--port", "0", "--store", store,
        "--db", str(db), "--log-level", "warning",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
    if not line.startswith("conveyor listening on "):
        raise RuntimeError(f"broker did not start: {line!r}")
    return proc, line.split()[3]


async def publish(url: str, queue: str, n: int, tag: str) -> float:
    """Enqueue ``n`` jobs, ``IN_FLIGHT`` at most unanswered; seconds until the last reply."""
    async with connect(url, max_size=None, compression=None) as ws:
        window = asyncio.Semaphore(IN_FLIGHT)
        answered = 0
        done = asyncio.Event()

        async def read() -> None:
            nonlocal answered
            async for raw in ws:
                reply = orjson.loads(raw)
                assert reply.get("ok"), reply
                answered += 1
                window.release()
                if answered == n:
                    done.set()
                    return

        start = time.perf_counter()
        reader = asyncio.create_task(read())
        for i in range(n):
            await window.acquire()
            frame = {"op": "enqueue", "rid": i, "queue": queue, "payload": [tag, i, PAYLOAD]}
            await ws.send(orjson.dumps(frame).decode())
        await asyncio.wait_for(done.wait(), 300)
        elapsed = time.perf_counter() - start
        await reader
        return elapsed


async def work(url: str, queue: str, n: int, seen: set[Any], ready: asyncio.Event) -> float:
    """Take and ack ``n`` jobs with prefetch 64; seconds from the first push to the last ack."""
    async with connect(url, max_size=None, compression=None) as ws:
        await ws.send(
            orjson.dumps(
                {"op": "subscribe", "rid": "s", "worker_id": "bench", "queues": [queue],
                 "prefetch": IN_FLIGHT}
            ).decode()
        )  # fmt: skip
        acked = 0
        start: float | None = None
        ready.set()
        async for raw in ws:
            frame = orjson.loads(raw)
            if frame.get("push") == "jobs":
                start = start or time.perf_counter()
                items = []
                for job in frame["jobs"]:
                    key = (job["payload"][0], job["payload"][1])
                    assert key not in seen, f"handled twice: {key}"
                    seen.add(key)
                    items.append({"id": job["id"], "lease": job["lease"]})
                await ws.send(orjson.dumps({"op": "ack_batch", "rid": 1, "items": items}).decode())
            elif frame.get("rid") == 1:
                assert all(frame["landed"]), frame
                acked += len(frame["landed"])
                if acked == n:
                    assert start is not None
                    return time.perf_counter() - start
        raise RuntimeError("connection closed early")


async def measure(store: str, n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = await start_broker(store, Path(tmp) / "bench.db")
        try:
            seen: set[Any] = set()
            enqueue = await publish(url, "drain", n, "a")
            drain = await work(url, "drain", n, seen, asyncio.Event())
            ready = asyncio.Event()
            worker = asyncio.create_task(work(url, "flow", n, seen, ready))
            await ready.wait()
            start = time.perf_counter()
            await publish(url, "flow", n, "b")
            await worker
            flow = time.perf_counter() - start
            assert len(seen) == 2 * n, "lost jobs"
        finally:
            proc.terminate()
            await proc.wait()
    return {"enqueue": n / enqueue, "drain": n / drain, "flow": n / flow}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--stores", default="memory,sqlite")
    args = parser.parse_args()
    stores = args.stores.split(",")
    results = {store: await measure(store, args.jobs) for store in stores}
    print(f"end-to-end jobs/s, {args.jobs:,} jobs, 1 publisher ({IN_FLIGHT} in flight), "
          f"1 worker (prefetch {IN_FLIGHT}), cpu count {os.cpu_count()}")  # fmt: skip
    print(f"{'store':<10}{'enqueue':>12}{'drain':>12}{'flow':>12}")
    first = results[stores[0]]
    for store, r in results.items():
        print(f"{store:<10}{r['enqueue']:>12,.0f}{r['drain']:>12,.0f}{r['flow']:>12,.0f}")
    for store, r in list(results.items())[1:]:
        ratios = "  ".join(f"{k} {r[k] / first[k]:.2f}x" for k in r)
        print(f"{store} / {stores[0]}: {ratios}")


if __name__ == "__main__":
    asyncio.run(main())
