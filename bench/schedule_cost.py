"""What schedules cost the engine (``docs/contract.md``, SCH-11).

    .venv/bin/python bench/schedule_cost.py
    .venv/bin/python bench/schedule_cost.py --many 100000

Two measurements, each the median of rounds:

* a pass: what the local backend's timer does at each wake, ``next_event_at()`` and then
  ``fire_schedules()``, with none of the schedules due, beside 10 schedules and beside
  ``--many`` (10,000 by default), all of them un-paused. SCH-11 asks that a pass not walk
  the schedules, so the ratio should stay near 1.
* a fire: ``--many`` schedules of every hour whose ticks fall about a millisecond apart; the
  clock moves on so that each ``fire_schedules()`` fires 500 of them (each making its job
  on a queue, with its key, and moving on in the heap): the cost per schedule fired, jobs
  included.

Timings on a shared machine are noisy: compare the ratios printed in one run, not
absolute times across runs.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

from conveyor.broker.engine import JobTable, ScheduleSpec

ROUND = 500
START = 1_000_000.0
# Ticks this far apart (a power of two: the sums below are exact, so each pass fires
# exactly ROUND of them).
SPACING = 1 / 1024


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def table_of(n: int, spacing_s: float) -> tuple[JobTable, Clock]:
    """A table of ``n`` hourly schedules, the first tick of the i-th at
    ``START + 60 + i * spacing_s``; the clock at ``START``."""
    clock = Clock()
    table = JobTable(clock=clock, rng=random.Random(7), id_prefix="b")
    for i in range(n):
        table.set_schedule(
            ScheduleSpec(
                id=f"s{i:07d}",
                queue=f"q{i % 10}",
                payload={"report": i},
                every_s=3600.0,
                start_at=START + 60.0 + i * spacing_s,
            )
        )
    return table, clock


def pass_cost(n: int, rounds: int) -> float:
    """Median ns of one pass (next event, then a fire that finds nothing due)."""
    table, _ = table_of(n, SPACING)
    assert table.next_event_at() == START + 60.0
    samples = []
    for _ in range(rounds):
        gc.disable()
        start = time.perf_counter_ns()
        for _ in range(ROUND):
            table.next_event_at()
            table.fire_schedules()
        samples.append((time.perf_counter_ns() - start) / ROUND)
        gc.enable()
    return statistics.median(samples)


def fire_cost(n: int) -> float:
    """Median ns per schedule fired, ``ROUND`` of them per pass."""
    table, clock = table_of(n, SPACING)
    samples = []
    step = ROUND * SPACING
    clock.now = START + 60.0 - SPACING / 2  # each step below brings ROUND ticks due
    for _ in range(n // ROUND):
        clock.now += step
        gc.disable()
        start = time.perf_counter_ns()
        table.next_event_at()
        queues = table.fire_schedules()
        elapsed = time.perf_counter_ns() - start
        gc.enable()
        assert queues, "nothing fired"
        samples.append(elapsed / ROUND)
    made = sum(table.queue(name).stats().ready for name in table.queues())
    assert made == n // ROUND * ROUND, made
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--many", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    few = pass_cost(10, args.rounds)
    many = pass_cost(args.many, args.rounds)
    print(f"pass (none due), 10 schedules:      {few / 1000:8.2f} µs")
    print(
        f"pass (none due), {args.many:,} schedules: {many / 1000:8.2f} µs   ratio {many / few:.2f}x"
    )
    fired = fire_cost(args.many)
    print(f"per schedule fired ({args.many:,} schedules, {ROUND} a pass): {fired / 1000:.2f} µs")


if __name__ == "__main__":
    main()
