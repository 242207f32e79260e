"""Per-operation cost of the engine at queue depths of 1,000 and 1,000,000.

    .venv/bin/python bench/engine_cost.py            # or: make bench

For each operation it keeps the queue near the given depth, times rounds of 500 calls,
and prints the median cost per call at each depth and their ratio (``docs/contract.md``,
CST-3, asks for about 2x at most). Then the memory the engine holds per pending job (tracemalloc),
with a 100-byte payload as the broker stores it (raw JSON bytes), without a key and with a key
shaped like the one the SDK gives every job. Timings on a shared
machine are noisy: compare the ratio printed in one run, not absolute times across runs.
"""

from __future__ import annotations

import argparse
import gc
import random
import secrets
import statistics
import time
import tracemalloc
from collections.abc import Callable

from conveyor.broker.engine import JobHandle, JobTable, Queue, QueueOpts, RawJSON

ROUND = 500
PAYLOAD = RawJSON(b'{"to":"someone@example.com","subject":"hello","body":"' + b"x" * 45 + b'"}')


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def fill(depth: int) -> tuple[JobTable, Queue, Clock]:
    clock = Clock()
    table = JobTable(clock=clock, rng=random.Random(7), id_prefix="b")
    queue = table.queue("bench", QueueOpts(visibility_timeout_s=300))
    for i in range(depth):
        queue.enqueue(PAYLOAD, priority=i % 3)
    return table, queue, clock


def timed(fn: Callable[..., object], *args: object) -> float:
    start = time.perf_counter_ns()
    fn(*args)
    return (time.perf_counter_ns() - start) / ROUND


def claim_each(queue: Queue, out: list[JobHandle]) -> None:
    for _ in range(ROUND):
        handle = queue.claim_one("w")
        assert handle is not None
        out.append(handle)


def heartbeat_each(handles: list[JobHandle]) -> None:
    for handle in handles:
        handle.heartbeat()


def ack_each(handles: list[JobHandle]) -> None:
    for handle in handles:
        handle.ack()


def retry_each(handles: list[JobHandle]) -> None:
    for handle in handles:
        handle.retry("e", 0.0)


def fail_each(handles: list[JobHandle]) -> None:
    for handle in handles:
        handle.fail("e")


def cancel_each(queue: Queue, ids: list[str]) -> None:
    for job_id in ids:
        queue.cancel(job_id)


def enqueue_each(queue: Queue, ids: list[str]) -> None:
    for i in range(ROUND):
        ids.append(queue.enqueue(PAYLOAD, priority=i % 3))


def stats_each(queue: Queue) -> None:
    for _ in range(ROUND):
        queue.stats()


def next_event_each(table: JobTable) -> None:
    for _ in range(ROUND):
        table.next_event_at()


def measure(depth: int, rounds: int) -> dict[str, float]:
    table, queue, clock = fill(depth)
    results: dict[str, list[float]] = {}

    def record(name: str, cost: float) -> None:
        results.setdefault(name, []).append(cost)

    gc.collect()
    gc.disable()  # a collection in the middle of one round would swamp it
    try:
        for _ in range(rounds):
            clock.now += 0.001
            ids: list[str] = []
            record("enqueue", timed(enqueue_each, queue, ids))
            queue.claim_batch("w", ROUND)  # back to depth (those leases just lapse later)
            handles: list[JobHandle] = []
            record("claim", timed(claim_each, queue, handles))
            record("heartbeat", timed(heartbeat_each, handles))
            record("ack", timed(ack_each, handles))
            enqueue_each(queue, ids)
            record("retry", timed(retry_each, queue.claim_batch("w", ROUND)))
            record("fail", timed(fail_each, queue.claim_batch("w", ROUND)))
            queue.purge_dead()
            enqueue_each(queue, ids)
            record("cancel", timed(cancel_each, queue, ids[-ROUND:]))
            enqueue_each(queue, ids)
            record("stats", timed(stats_each, queue))
            record("next_event_at", timed(next_event_each, table))
    finally:
        gc.enable()
    return {name: statistics.median(costs) for name, costs in results.items()}


def memory_per_job(n: int, keyed: bool = False) -> float:
    """Bytes the engine holds per pending job; ``keyed``: each with a key shaped like the
    SDK's automatic one (``auto-``, 22 random base64url characters, ``-``, a counter)."""
    gc.collect()
    prefix = f"auto-{secrets.token_urlsafe(16)}-"
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    if keyed:
        _, queue, _ = fill(0)
        for i in range(n):
            queue.enqueue(PAYLOAD, key=f"{prefix}{0x10000 + i:x}")
    else:
        _, queue, _ = fill(n)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert queue.stats().ready == n
    return (after - before) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--large", type=int, default=1_000_000)
    args = parser.parse_args()
    small = measure(1_000, args.rounds)
    large = measure(args.large, args.rounds)
    print(f"engine cost per call, median of {args.rounds} rounds of {ROUND}")
    print(f"{'operation':<14}{'depth 1,000':>14}{f'depth {args.large:,}':>18}{'ratio':>8}")
    for name in small:
        ratio = large[name] / small[name]
        print(f"{name:<14}{small[name]:>11.0f} ns{large[name]:>15.0f} ns{ratio:>7.2f}x")
    per_job = memory_per_job(100_000)
    print(f"memory per pending job (100-byte payload, 100,000 jobs): {per_job:.0f} bytes")
    keyed = memory_per_job(200_000, keyed=True)
    print(f"memory per keyed pending job (as the SDK's, 200,000 jobs): {keyed:.0f} bytes")


if __name__ == "__main__":
    main()
