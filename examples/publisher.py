"""Enqueue a few jobs: ``python examples/publisher.py`` (with ``make run`` going elsewhere)."""

from __future__ import annotations

import asyncio
import os

from conveyor.sdk import Client

URL = os.environ.get("CONVEYOR_URL", "ws://127.0.0.1:8765")


async def main() -> None:
    async with Client(URL) as client:
        for n in range(5):
            job_id = await client.enqueue("emails", {"to": f"user{n}@example.com"})
            print("enqueued", job_id)
        later = await client.enqueue("emails", {"to": "later@example.com"}, delay_s=2)
        print("enqueued", later, "(runs in 2 s)")
        print(await client.stats("emails"))


if __name__ == "__main__":
    asyncio.run(main())
