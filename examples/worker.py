"""A worker for the ``emails`` and ``reports`` queues: ``conveyor worker examples.worker:worker``.

Stop it with Ctrl-C: it finishes the jobs it is running first (a second Ctrl-C quits at
once).
"""

from __future__ import annotations

import asyncio
import os

from conveyor import Fail, Job, Worker

worker = Worker(os.environ.get("CONVEYOR_URL", "ws://127.0.0.1:8765"), prefetch=8)


@worker.handler("emails")
async def send_email(job: Job) -> None:
    address = job.payload.get("to")
    if not isinstance(address, str) or "@" not in address:
        raise Fail(f"not an address: {address!r}")  # dead-lettered at once, no retries
    await asyncio.sleep(0.1)  # stands for the real work
    print(f"sent to {address} (attempt {job.attempt} of {job.max_attempts})", flush=True)


@worker.task("reports", timeout_s=30)  # retried if it runs past 30 s
async def build_report(month: int, fmt: str = "pdf") -> None:
    """A task: enqueued as ``await build_report.enqueue(month=3)`` (examples/publisher.py)."""
    await asyncio.sleep(0.1)
    print(f"report for month {month} as {fmt}", flush=True)
