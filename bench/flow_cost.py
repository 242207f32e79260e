"""What flow control costs a claim, in the engine alone (``docs/contract.md``, FLW-10).

    .venv/bin/python bench/flow_cost.py
    .venv/bin/python bench/flow_cost.py --drain 200000 --large 1000000

Three measurements, each the median of rounds of 500 claims (a claim timed alone, its
ack and the enqueue that keeps the depth outside the timer):

* keys: the same depth of ready work spread over 10 partition keys and over 10,000,
  with a partition concurrency of 2; FLW-10 asks that a claim not walk the keys, so the
  ratio should stay near 1.
* drain: N plain jobs claimed in batches of 64 and acked, with no limits and with a
  concurrency and a rate so large that they never bind; the ratio is what keeping the
  slots and the bucket costs a drain. The two runs alternate, and each one's best time
  is kept.
* depth: a claim under limits (100 keys, partition concurrency 2, a rate that never
  binds) at growing table sizes: O(log n) keeps the cost nearly flat.

Timings on a shared machine are noisy: compare the ratios printed in one run, not
absolute times across runs.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

from conveyor.broker.engine import JobTable, Limits, NewJob, Queue, QueueOpts, RawJSON

ROUND = 500
BATCH = 64
PAYLOAD = RawJSON(b'{"to":"someone@example.com","subject":"hello","body":"' + b"x" * 45 + b'"}')
NEVER_BINDS = 2**31 - 1
#: Limits of a queue that never bind: a concurrency and a rate no run reaches.
GENEROUS = Limits(concurrency=NEVER_BINDS, rate=NEVER_BINDS, per_s=1.0, burst=NEVER_BINDS)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def fill(jobs: int, keys: int, limits: Limits) -> tuple[Queue, Clock]:
    """A queue of ``jobs`` ready jobs, dealt over ``keys`` keys (0: none) in turn."""
    clock = Clock()
    table = JobTable(clock=clock, rng=random.Random(7), id_prefix="b")
    queue = table.queue("bench", QueueOpts(visibility_timeout_s=300))
    queue.set_limits(limits)
    chunk = 10_000
    for start in range(0, jobs, chunk):
        queue.enqueue_batch(
            [
                NewJob(PAYLOAD, partition=None if not keys else f"k{i % keys}")
                for i in range(start, min(jobs, start + chunk))
            ]
        )
    return queue, clock


def claim_cost(queue: Queue, clock: Clock, rounds: int) -> float:
    """The median over ``rounds`` of the mean time of one ``claim_one``, in ns. Each job
    claimed is acked and a job of its key enqueued again, so the depth and the slots
    held stay where they are."""
    costs = []
    now = time.perf_counter_ns
    gc.collect()
    gc.disable()  # a collection in the middle of one round would swamp it
    try:
        for _ in range(rounds):
            clock.now += 0.001
            spent = 0
            for _ in range(ROUND):
                start = now()
                handle = queue.claim_one("w")
                spent += now() - start
                assert handle is not None
                handle.ack()
                queue.enqueue(PAYLOAD, partition=handle.partition)
            costs.append(spent / ROUND)
    finally:
        gc.enable()
    return statistics.median(costs)


def drain_time(jobs: int, limits: Limits) -> float:
    """Seconds to claim (in batches of ``BATCH``) and ack ``jobs`` plain jobs."""
    queue, _ = fill(jobs, 0, limits)
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        done = 0
        while batch := queue.claim_batch("w", BATCH):
            for handle in batch:
                handle.ack()
            done += len(batch)
        spent = time.perf_counter() - start
    finally:
        gc.enable()
    assert done == jobs, (done, jobs)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--depth", type=int, default=100_000, help="jobs for the keys test")
    parser.add_argument("--drain", type=int, default=200_000, help="jobs per drain")
    parser.add_argument("--repeats", type=int, default=3, help="drains of each kind")
    parser.add_argument("--large", type=int, default=1_000_000, help="largest table size")
    args = parser.parse_args()

    per_key = Limits(partition_concurrency=2)
    few = claim_cost(*fill(args.depth, 10, per_key), args.rounds)
    many = claim_cost(*fill(args.depth, 10_000, per_key), args.rounds)
    print(f"claim_one under partition_concurrency=2, {args.depth:,} ready jobs")
    print(f"{'keys':>8}{'per claim':>14}")
    print(f"{10:>8,}{few:>11.0f} ns")
    print(f"{10_000:>8,}{many:>11.0f} ns")
    print(f"ratio 10,000 keys / 10 keys: {many / few:.2f}x")
    print()

    plain: list[float] = []
    generous: list[float] = []
    for _ in range(args.repeats):
        plain.append(drain_time(args.drain, Limits()))
        generous.append(drain_time(args.drain, GENEROUS))
    best_plain, best_generous = min(plain), min(generous)
    print(f"drain of {args.drain:,} jobs, batches of {BATCH}, best of {args.repeats}")
    print(f"{'limits':<34}{'seconds':>9}{'jobs/s':>12}")
    for name, spent in (("none", best_plain), ("concurrency and rate, never bind", best_generous)):
        print(f"{name:<34}{spent:>9.3f}{args.drain / spent:>12,.0f}")
    print(f"ratio with limits / without: {best_generous / best_plain:.3f}x")
    print()

    depth_limits = Limits(partition_concurrency=2, rate=NEVER_BINDS, burst=NEVER_BINDS)
    sizes = [size for size in (1_000, 10_000, 100_000, 1_000_000) if size < args.large]
    sizes.append(args.large)
    print("claim_one under limits (100 keys, partition_concurrency=2, rate) by table size")
    print(f"{'jobs':>10}{'per claim':>14}{'vs smallest':>13}")
    smallest = None
    for size in sizes:
        cost = claim_cost(*fill(size, 100, depth_limits), args.rounds)
        smallest = smallest or cost
        print(f"{size:>10,}{cost:>11.0f} ns{cost / smallest:>12.2f}x")


if __name__ == "__main__":
    main()
