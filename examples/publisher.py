"""Enqueue a few jobs: ``python examples/publisher.py`` (with ``make run`` going elsewhere)."""

from __future__ import annotations

import asyncio
import os

from worker import build_report  # examples/worker.py: a task, enqueued by calling it

from conveyor import Client

URL = os.environ.get("CONVEYOR_URL", "ws://127.0.0.1:8765")


async def main() -> None:
    async with Client(URL) as client:
        for n in range(5):
            job_id = await client.enqueue("emails", {"to": f"user{n}@example.com"})
            print("enqueued", job_id)
        later = await client.enqueue("emails", {"to": "later@example.com"}, delay_s=2)
        print("enqueued", later, "(runs in 2 s)")
        # A task's arguments are checked against its signature before anything is sent.
        report = await build_report.options(client=client).enqueue(month=3)
        print("enqueued", report, "(a task)")
        print(await client.stats("emails"))


if __name__ == "__main__":
    asyncio.run(main())
