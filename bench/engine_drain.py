"""The engine's cost per job of an enqueue, and of a claim and ack, in one process.

    .venv/bin/python bench/engine_drain.py                    # this checkout's engine
    PYTHONPATH=/path/to/other/checkout .venv/bin/python bench/engine_drain.py

Fills a queue with ``--jobs`` jobs of a 100-byte payload, each with a key (as the SDK
gives every job), in batches of 64, then claims them 64 at a time and acks each. Prints
the best of ``--rounds`` rounds, in µs per job, and which checkout ran. Run two checkouts
one after the other, alternating, to compare them (shared machines are noisy).
"""

from __future__ import annotations

import argparse
import gc
import random
import time

from engine_cost import PAYLOAD, Clock  # (run from bench/: the same payload and clock)

import conveyor
from conveyor.broker.engine import JobTable, NewJob


def drain(n: int) -> tuple[float, float]:
    """µs per job of the fill and of the claims and acks."""
    table = JobTable(clock=Clock(), rng=random.Random(7), id_prefix="b")
    queue = table.queue("q")
    t0 = time.perf_counter()
    for i in range(0, n, 64):
        queue.enqueue_batch([NewJob(PAYLOAD, key=f"auto-{i}-{j}") for j in range(64)])
    t1 = time.perf_counter()
    done = 0
    while done < n:
        handles = queue.claim_batch("w", 64)
        for handle in handles:
            table.ack(handle.id, handle.lease)
        done += len(handles)
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    gc.disable()  # (the collector's passes would land on either side at random)
    rounds = [drain(args.jobs) for _ in range(args.rounds)]
    where = conveyor.__file__.rsplit("/conveyor/", 1)[0]
    print(
        f"{where}: enqueue {min(r[0] for r in rounds):.2f} µs/job, "
        f"claim+ack {min(r[1] for r in rounds):.2f} µs/job"
    )


if __name__ == "__main__":
    main()
