"""What many queues, and many workers waiting, cost the calls about one queue.

    .venv/bin/python bench/scale_cost.py
    .venv/bin/python bench/scale_cost.py --many 100000

A broker may hold many queues (one per tenant, say) while a worker claims from one, and
many workers may wait on one queue. Two measurements, each beside 10 and beside
``--many`` (10,000 by default), the median of rounds, in µs per call:

* queues: through ``LocalBackend`` on the memory store, the calls a busy broker makes
  about one queue: an enqueue, a claim of that job, its ack, a ``stats`` read of that
  queue, and ``resume`` of a queue that was never paused (a lookup by name), beside that
  many other queues, each holding a job;
* waiting workers: an enqueue of one job, the dispatcher's pass that pushes it and its
  ack, with that many subscriptions (prefetch 64, no connection) waiting on the queue.

None of these should walk the queues or the line, so each ratio should stay near 1.

* a worker listing that many queues (prefetch 64), its jobs all in the last of them:
  µs per job drained through the dispatcher, each job acked as it comes. Queues are
  served in strict order, so each refill looks at the queues before the one holding
  jobs: this one grows with the queues listed (3 rounds of 1,000 jobs).

Timings on a shared machine are noisy: compare the ratios printed in one run, not
absolute times across runs.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from typing import Any

from conveyor.broker.backend import Claim, Enqueue, LocalBackend
from conveyor.broker.dispatch import Dispatcher, Subscription
from conveyor.broker.egress import Out
from conveyor.broker.scheduler import ManualScheduler
from conveyor.broker.store import MemoryStore

ROUND = 200


def rig() -> tuple[ManualScheduler, LocalBackend, Dispatcher]:
    """A local backend on the memory store and a dispatcher, on one manual clock."""
    clock = ManualScheduler(1_000_000.0)
    backend = LocalBackend(
        MemoryStore(), clock, max_payload_bytes=1 << 20, rng=random.Random(1), id_prefix="b"
    )
    return clock, backend, Dispatcher(backend, grace_s=5.0, scheduler=clock)


def build(queues: int) -> LocalBackend:
    _, backend, _ = rig()
    backend.enqueue([Enqueue(f"queue-{i}", {"n": i}) for i in range(queues)])
    return backend


def one_round(backend: LocalBackend) -> dict[str, float]:
    """µs per call of each kind, over ``ROUND`` calls of each on ``queue-0``."""
    spent = dict.fromkeys(("enqueue", "claim", "ack", "stats", "resume"), 0.0)
    for _ in range(ROUND):
        start = time.perf_counter()
        backend.enqueue([Enqueue("queue-0", {"n": 0})])
        claimed = time.perf_counter()
        ((handle,),) = backend.claim([Claim("w", ("queue-0",), 1)]).result()
        acked = time.perf_counter()
        backend.ack([(handle.id, handle.lease)])
        read = time.perf_counter()
        backend.stats(["queue-0"])
        resumed = time.perf_counter()
        backend.resume("queue-0")
        end = time.perf_counter()
        spent["enqueue"] += claimed - start
        spent["claim"] += acked - claimed
        spent["ack"] += read - acked
        spent["stats"] += resumed - read
        spent["resume"] += end - resumed
    return {name: total / ROUND * 1e6 for name, total in spent.items()}


def measure(queues: int, rounds: int) -> dict[str, float]:
    backend = build(queues)
    # The first claim takes queue-0's own job; from then on each claim takes the job its
    # round just enqueued.
    backend.claim([Claim("w", ("queue-0",), 1)])
    each = [one_round(backend) for _ in range(rounds)]
    return {name: statistics.median(r[name] for r in each) for name in each[0]}


def measure_line(waiting: int, rounds: int) -> float:
    """µs per enqueue of one job, the pass that pushes it and its ack, with ``waiting``
    workers in the queue's line."""
    clock, backend, dispatcher = rig()
    pushed: list[tuple[Subscription, str, str]] = []

    def subscription(worker_id: str) -> Subscription:
        def emit(out: Out, frame: dict[str, Any]) -> None:
            pushed.extend((sub, job["id"], job["lease"]) for job in frame.get("jobs", ()))

        sub = Subscription(worker_id, ["q"], 64, emit)
        return sub

    for i in range(waiting):
        dispatcher.subscribe(subscription(f"w{i}"), [])
    clock.run_soon()
    each = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(ROUND):
            backend.enqueue([Enqueue("q", {"n": 0})])
            dispatcher.run_pending()
            ((sub, job_id, lease),) = pushed
            backend.ack([(job_id, lease)])
            dispatcher.finished(sub, job_id, lease)
            pushed.clear()
        each.append((time.perf_counter() - start) / ROUND * 1e6)
    return statistics.median(each)


def measure_listed(listed: int, jobs: int = 1000) -> float:
    """µs per job drained by one worker that lists ``listed`` queues, its jobs in the last."""
    clock, backend, dispatcher = rig()
    queues = [f"queue-{i}" for i in range(listed)]
    for name in queues:
        backend.table.queue(name)
    pushed: list[tuple[str, str]] = []

    def emit(out: Out, frame: dict[str, Any]) -> None:
        pushed.extend((job["id"], job["lease"]) for job in frame.get("jobs", ()))

    sub = Subscription("w", queues, 64, emit)
    dispatcher.subscribe(sub, [])
    backend.enqueue([Enqueue(queues[-1], {"n": i}) for i in range(jobs)])
    start = time.perf_counter()
    done = 0
    clock.run_soon()
    while done < jobs:
        batch = pushed[:]
        pushed.clear()
        assert batch, f"nothing pushed after {done} jobs"
        backend.ack(batch)
        for job_id, lease in batch:
            dispatcher.finished(sub, job_id, lease)
        done += len(batch)
        clock.run_soon()
    return (time.perf_counter() - start) / jobs * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--many", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    gc.disable()  # (the collector's passes would land on either side at random)
    few = measure(10, args.rounds)
    many = measure(args.many, args.rounds)
    table(
        f"local backend, memory store: µs per call on one queue, median of {args.rounds}",
        ("call", "queues"), args.many, few, many,
    )  # fmt: skip
    line = {"push": measure_line(10, args.rounds)}, {"push": measure_line(args.many, args.rounds)}
    table(
        f"\nan enqueue, the pass that pushes it and its ack, µs, median of {args.rounds}",
        ("", "waiting"), args.many, *line,
    )  # fmt: skip
    listed = [
        {"drain": statistics.median(measure_listed(n) for _ in range(3))} for n in (10, args.many)
    ]
    table(
        "\na worker listing that many queues, its jobs in the last: µs per job, median of 3",
        ("", "listed"), args.many, *listed,
    )  # fmt: skip


def table(
    title: str, heads: tuple[str, str], many: int, few_: dict[str, float], many_: dict[str, float]
) -> None:
    """Each figure beside 10 and beside ``many``, and their ratio."""
    first, unit = heads
    print(title)
    print(f"{first:<10}{f'10 {unit}':>12}{f'{many:,} {unit}':>18}{'ratio':>9}")
    for name, value in few_.items():
        print(f"{name:<10}{value:>12.2f}{many_[name]:>18.2f}{many_[name] / value:>8.2f}x")


if __name__ == "__main__":
    main()
