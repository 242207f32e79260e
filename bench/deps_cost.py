"""What dependencies cost the engine (``docs/contract.md``, DEP-14).

    .venv/bin/python bench/deps_cost.py
    .venv/bin/python bench/deps_cost.py --many 100000

Each measurement is the median of rounds, per edge, beside ``--few`` (1,000) and beside
``--many`` (10,000 by default) other jobs waiting on something else, which DEP-14 says a
release must not look at; the ratio should stay near 1:

* release: one dependency's ack makes ``EDGES`` waiting jobs pending (a heap insert each);
* doom: one dependency's cancel kills ``EDGES`` waiting jobs;
* enqueue: a job naming one dependency (its edge, its waiting state).

Timings on a shared machine are noisy: compare the ratios printed in one run, not
absolute times across runs.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from conveyor.broker.engine import JobTable

EDGES = 1000
ROUNDS = 15


def _table(others: int) -> tuple[JobTable, str]:
    table = JobTable(clock=lambda: 1000.0, id_prefix="b")
    q = table.queue("q")
    blocker = q.enqueue("blocker", delay_s=1e6)
    for i in range(others):
        q.enqueue(i, after=[blocker])
    return table, blocker


def measure(others: int) -> dict[str, float]:
    table, _ = _table(others)
    q = table.queue("q")
    release, doom, enqueue = [], [], []
    for _ in range(ROUNDS):
        dep = q.enqueue("dep", priority=10)
        gc.collect()
        t0 = time.perf_counter()
        for i in range(EDGES):
            q.enqueue(i, after=[dep])
        t1 = time.perf_counter()
        (h,) = q.claim_batch("w", 1)
        t2 = time.perf_counter()
        h.ack(b"1")
        t3 = time.perf_counter()
        for handle in q.claim_batch("w", EDGES):
            handle.ack()
        doomed = q.enqueue("doomed", delay_s=1e6)
        for i in range(EDGES):
            q.enqueue(i, after=[doomed])
        t4 = time.perf_counter()
        table.cancel(doomed)
        t5 = time.perf_counter()
        enqueue.append((t1 - t0) / EDGES)
        release.append((t3 - t2) / EDGES)
        doom.append((t5 - t4) / EDGES)
    return {
        "enqueue": statistics.median(enqueue),
        "release": statistics.median(release),
        "doom": statistics.median(doom),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--few", type=int, default=1000)
    parser.add_argument("--many", type=int, default=10_000)
    args = parser.parse_args()
    few, many = measure(args.few), measure(args.many)
    print(f"per edge, beside {args.few:,} and {args.many:,} other waiting jobs:")
    for name in ("enqueue", "release", "doom"):
        a, b = few[name] * 1e6, many[name] * 1e6
        print(f"  {name:8} {a:6.2f} us  {b:6.2f} us  ratio {b / a:.2f}x")


if __name__ == "__main__":
    main()
