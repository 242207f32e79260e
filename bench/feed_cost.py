"""What one dashboard update costs the broker with a million jobs in a hundred queues.

    .venv/bin/python bench/feed_cost.py [--queues 100] [--jobs 1000000]

Builds a local backend's table with the jobs spread over the queues (a mix of ready, scheduled,
processing and dead), a feed with one viewer following a dead-letter page and a job, and
times the work of one snapshot: sampling every queue's counters, encoding the shared
parts, and building the viewer's frame. Stats are read from counters, so the cost grows
with the number of queues, not of jobs: the script prints it at 1% of the jobs too, to
show the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from typing import Any

from conveyor.broker.backend import LocalBackend
from conveyor.broker.dispatch import Dispatcher
from conveyor.broker.engine import RawJSON
from conveyor.broker.feed import Feed
from conveyor.broker.scheduler import ManualScheduler
from conveyor.broker.store import MemoryStore

PAYLOAD = RawJSON(b'{"to":"someone@example.com","subject":"hello","body":"' + b"x" * 45 + b'"}')


class Viewer:
    """Stands in for a server connection: always caught up, keeps the last frame."""

    caught_up = True

    def __init__(self) -> None:
        self.frames = 0

    def push_now(self, frame: dict[str, Any]) -> None:
        self.frames += 1


def build(queues: int, jobs: int) -> tuple[Feed, ManualScheduler, str]:
    clock = ManualScheduler(1_000_000.0)
    backend = LocalBackend(
        MemoryStore(), clock, max_payload_bytes=1 << 20, rng=random.Random(1), id_prefix="b"
    )
    table = backend.table  # filled directly: the fastest way to a million jobs
    per_queue = jobs // queues
    some_id = ""
    for q in range(queues):
        queue = table.queue(f"queue-{q}")
        for i in range(per_queue):
            some_id = queue.enqueue(PAYLOAD, delay_s=60.0 if i % 10 == 0 else None)
        for handle in queue.claim_batch("w", per_queue // 10):
            if handle.job.seq % 2:  # half the claimed ones die, half stay processing
                handle.fail("boom")
    dispatcher = Dispatcher(backend, grace_s=5.0, scheduler=clock)
    feed = Feed(backend, dispatcher, clock=clock.now, server_info=lambda: {"version": "bench"})
    return feed, clock, some_id


async def measure(queues: int, jobs: int, rounds: int) -> float:
    feed, clock, some_id = build(queues, jobs)
    viewer = Viewer()
    fields = {"job": some_id, "worker": None, "dead_queue": "queue-0", "dead_offset": 0}
    feed.watch(viewer, {**fields, "dead_limit": 20})
    costs = []
    for _ in range(rounds):
        clock.advance(1.0)  # a history sample every tick, the dearest case
        feed._viewers[viewer].sent_at = None
        start = time.perf_counter()
        await feed.tick()
        costs.append(time.perf_counter() - start)
    assert viewer.frames == rounds
    return statistics.median(costs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    small = asyncio.run(measure(args.queues, args.jobs // 100, args.rounds))
    large = asyncio.run(measure(args.queues, args.jobs, args.rounds))
    print(f"one dashboard update, {args.queues} queues, median of {args.rounds}:")
    print(f"  {args.jobs // 100:>9,} jobs: {small * 1e3:.2f} ms")
    print(f"  {args.jobs:>9,} jobs: {large * 1e3:.2f} ms   (ratio {large / small:.2f}x)")


if __name__ == "__main__":
    main()
