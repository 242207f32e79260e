"""What progress reports cost the broker: one job whose handler reports progress 10,000
times a second for a few seconds, watched by a client, against the same run with no
progress.

    .venv/bin/python bench/progress_cost.py [--store memory|sqlite] [--seconds 3]
        [--rate 10000]

The broker runs as its own process (``python -m conveyor serve``); its user and system
CPU time is read from ``/proc/<pid>/stat`` around each run. Each run enqueues one job; an
SDK ``Worker`` runs a handler that calls ``job.progress(i / n)`` ``rate`` times a second
(in slices of 1 ms) for ``seconds``, then returns; a ``Client`` watches the job from
before it starts to its end. Printed per run: the broker's CPU seconds, the ``progress``
frames it received (the worker's count of frames sent), the events the watcher got, and
whether the watcher's last progress was the final value. Runs:

- ``none``: the handler reports nothing (the same slices, the same time): the baseline;
- ``sdk``: ``job.progress`` as shipped (``progress_interval_s`` 0.1);
- ``in-flight``: only the one-frame-in-flight-per-job limit (``progress_interval_s``
  one microsecond): what the broker would pay without the SDK's pacing;
- ``raw``: no SDK worker: a bare WebSocket client sends every report as its own
  ``progress`` frame, unanswered ones piling up (what a careless client in another
  language could do): what the broker pays per frame, and that its coalescing keeps the
  watcher's pushes bounded all the same.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import orjson
from broker_cpu import cpu_seconds, start_broker  # (run from bench/: the same broker and clock)
from websockets.asyncio.client import connect

from conveyor.sdk import Client, Job, Worker

RUNS = {"none": None, "sdk": 0.1, "in-flight": 1e-6}


async def one_run(
    pid: int, url: str, interval: float | None, seconds: float, rate: int
) -> dict[str, object]:
    total = int(rate * seconds)
    per_ms = max(1, rate // 1000)
    worker = Worker(url, ["p"], prefetch=1, progress_interval_s=interval or 0.1)

    @worker.handler("p")
    async def report(job: Job) -> str:
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i in range(0, total, per_ms):
            if interval is not None:
                for k in range(i, min(total, i + per_ms)):
                    job.progress((k + 1) / total)
            # Pace: slice i is due at start + i / rate.
            wait = start + (i + per_ms) / rate - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
        return "done"

    async with Client(url) as client:
        job_id = await client.enqueue("p", None)
        events = 0
        last_progress = None
        watching = asyncio.get_running_loop().create_task(_watch(client, job_id))
        await asyncio.sleep(0.2)  # the watch is in place
        before = cpu_seconds(pid)
        began = time.monotonic()
        runner = asyncio.get_running_loop().create_task(worker.run())
        events, last_progress = await watching
        took = time.monotonic() - began
        cpu = cpu_seconds(pid) - before
        worker.stop()
        await runner
    return {
        "broker_cpu_s": round(cpu, 3),
        "wall_s": round(took, 2),
        "frames": worker.progress_frames,
        "watcher_events": events,
        "final_seen": last_progress == 1.0 if interval is not None else None,
    }


async def raw_run(pid: int, url: str, seconds: float, rate: int) -> dict[str, object]:
    total = int(rate * seconds)
    per_ms = max(1, rate // 1000)
    async with Client(url) as client:
        job_id = await client.enqueue("p", None)
        watching = asyncio.get_running_loop().create_task(_watch(client, job_id))
        await asyncio.sleep(0.2)  # the watch is in place
        before = cpu_seconds(pid)
        began = time.monotonic()
        async with connect(url, max_size=None) as ws:
            await ws.send(orjson.dumps({"op": "hello", "rid": 0, "client": "bench"}).decode())
            await ws.recv()
            subscribe = {"op": "subscribe", "rid": 1, "worker_id": "raw", "queues": ["p"]}
            await ws.send(orjson.dumps(subscribe).decode())
            lease = None
            while lease is None:
                frame = orjson.loads(await ws.recv())
                if frame.get("push") == "jobs":
                    lease = frame["jobs"][0]["lease"]
            replies = asyncio.get_running_loop().create_task(_drain(ws))
            loop = asyncio.get_running_loop()
            start = loop.time()
            for i in range(0, total, per_ms):
                for k in range(i, min(total, i + per_ms)):
                    item = {"id": job_id, "lease": lease, "progress": (k + 1) / total}
                    await ws.send(orjson.dumps({"op": "progress", "items": [item]}).decode())
                wait = start + (i + per_ms) / rate - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
            ack = {"op": "ack", "rid": 2, "id": job_id, "lease": lease}
            await ws.send(orjson.dumps(ack).decode())
            events, last_progress = await watching
            replies.cancel()
        took = time.monotonic() - began
        cpu = cpu_seconds(pid) - before
    return {
        "broker_cpu_s": round(cpu, 3),
        "wall_s": round(took, 2),
        "frames": total,
        "watcher_events": events,
        "final_seen": last_progress == 1.0,
    }


async def _drain(ws: object) -> None:
    async for _ in ws:  # type: ignore[attr-defined]
        pass


async def _watch(client: Client, job_id: str) -> tuple[int, object]:
    events = 0
    last = None
    async for event in client.watch(job_id):
        events += 1
        if event.kind == "progress":
            last = event.progress
    return events, last


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="memory", choices=["memory", "sqlite"])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rate", type=int, default=10_000)
    args = parser.parse_args()
    broker, url = start_broker(args.store)
    try:
        print(f"store={args.store} seconds={args.seconds} rate={args.rate}/s")
        for name, interval in RUNS.items():
            result = asyncio.run(one_run(broker.pid, url, interval, args.seconds, args.rate))
            print(f"{name:10s} " + " ".join(f"{k}={v}" for k, v in result.items()))
        result = asyncio.run(raw_run(broker.pid, url, args.seconds, args.rate))
        print(f"{'raw':10s} " + " ".join(f"{k}={v}" for k, v in result.items()))
    finally:
        broker.terminate()
        broker.wait()


if __name__ == "__main__":
    main()
