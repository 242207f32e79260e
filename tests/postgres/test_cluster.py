"""Three broker processes on one PostgreSQL database, one of them killed with SIGKILL
mid-run and started again, under publishers and SDK workers spread across them.

What must hold at the end, from the clients' own records:

- every enqueue that was answered was handled (none lost);
- no job was ever held under two leases at once (no two runs of a job overlap);
- a job ran twice at most where its worker's broker died under it, so duplicates are
  no more than the jobs the workers could hold at the kill;
- a cancel made through one broker reached the worker connected to another.

Bounded: a few thousand short jobs, every wait with a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

from conveyor.sdk import Client, Job, Worker

from ..conformance.pg import database
from ..sdk.conftest import ROOT, Lines, conveyor, free_port
from ..sdk.conftest import stop as stop_process
from .test_brokers import _url

WAIT = 30.0
JOBS_PER_PUBLISHER = 500
PUBLISHERS = 3
WORKERS = 6
PREFETCH = 8


class BrokerProcess:
    """``conveyor serve --db URL`` on a fixed port, so that it can be started again there."""

    def __init__(self, db: str) -> None:
        self.db = db
        self.port = free_port()
        self.url = f"ws://127.0.0.1:{self.port}/ws"
        self.proc: subprocess.Popen[str] | None = None
        self._lines: Lines | None = None

    def start(self) -> None:
        proc = subprocess.Popen(
            conveyor("serve", "--db", self.db, "--port", str(self.port), "--log-level", "warning"),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=ROOT,
            env={**os.environ, "CONVEYOR_DISCONNECT_GRACE": "5"},
        )
        assert proc.stdout is not None
        self.proc, self._lines = proc, Lines(proc.stdout)
        line = self._lines.next(timeout=WAIT)
        assert line.startswith("conveyor listening on ws://"), line

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=WAIT)
        self._close()

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self._close()

    def _close(self) -> None:
        if self._lines is not None and self.proc is not None and self.proc.stdout is not None:
            self._lines.join()
            self.proc.stdout.close()
        self.proc, self._lines = None, None


@contextlib.contextmanager
def cluster(db: str, n: int) -> Iterator[list[BrokerProcess]]:
    brokers = [BrokerProcess(db) for _ in range(n)]
    try:
        for broker in brokers:
            broker.start()
        yield brokers
    finally:
        for broker in brokers:
            broker.stop()


@dataclass
class Run:
    """One handler run, as the worker saw it."""

    job_id: str
    lease: str
    worker: str
    started: float
    ended: float = float("inf")


@contextlib.asynccontextmanager
async def working(worker: Worker) -> AsyncIterator[None]:
    task = asyncio.get_running_loop().create_task(worker.run())
    try:
        yield
    finally:
        worker.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, WAIT)


async def test_a_cluster_loses_nothing_when_a_broker_is_killed() -> None:
    async with database() as dsn:
        with cluster(_url(dsn), 3) as brokers:
            await _run(brokers)


async def _run(brokers: list[BrokerProcess]) -> None:
    urls = [broker.url for broker in brokers]
    runs: list[Run] = []
    handled: set[str] = set()
    answered: set[str] = set()
    all_handled = asyncio.Event()
    publishing_done = asyncio.Event()
    rng = random.Random(7)

    def check_done() -> None:
        if publishing_done.is_set() and answered <= handled:
            all_handled.set()

    def make_worker(i: int) -> Worker:
        # Worker i prefers broker i mod 3, and fails over to the others in turn.
        order = urls[i % 3 :] + urls[: i % 3]
        worker = Worker(order, shuffle_urls=False, prefetch=PREFETCH, worker_id=f"w{i}")

        @worker.handler("work")
        async def handle(job: Job) -> None:
            run = Run(job.id, job.lease, f"w{i}", time.monotonic())
            runs.append(run)
            await asyncio.sleep(rng.random() * 0.004)  # the job's work
            run.ended = time.monotonic()
            handled.add(job.id)
            check_done()

        return worker

    # The cancel: a worker that only knows broker 1, a job cancelled through broker 2.
    cancel_started = asyncio.Event()
    cancel_seen: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    holder = Worker([urls[1]], worker_id="holder")

    @holder.handler("held")
    async def hold(job: Job) -> None:
        cancel_started.set()
        try:
            await asyncio.sleep(3600)  # runs until it is cancelled
        except asyncio.CancelledError:
            if not cancel_seen.done():
                cancel_seen.set_result(job.id)
            raise

    async def publish(i: int, first_third: asyncio.Event) -> None:
        async with Client(urls[i:] + urls[:i], request_timeout=WAIT) as client:
            for n in range(JOBS_PER_PUBLISHER):
                answered.add(await client.enqueue("work", {"p": i, "n": n}))
                if len(answered) >= PUBLISHERS * JOBS_PER_PUBLISHER // 3:
                    first_third.set()

    async with contextlib.AsyncExitStack() as stack:
        for i in range(WORKERS):
            await stack.enter_async_context(working(make_worker(i)))
        await stack.enter_async_context(working(holder))
        first_third = asyncio.Event()
        publishers = [
            asyncio.get_running_loop().create_task(publish(i, first_third))
            for i in range(PUBLISHERS)
        ]
        await asyncio.wait_for(first_third.wait(), WAIT)
        killed_at = time.monotonic()
        brokers[0].kill()  # SIGKILL, mid-run: its workers and publishers fail over
        await asyncio.to_thread(brokers[0].start)
        await asyncio.wait_for(asyncio.gather(*publishers), WAIT * 2)
        publishing_done.set()
        check_done()
        await asyncio.wait_for(all_handled.wait(), WAIT * 2)

        # The cancel, through the restarted broker 0 to broker 2's table view: the holder
        # on broker 1 hears it.
        async with Client(urls[2]) as on_2, Client(urls[0]) as on_0:
            held_id = await on_2.enqueue("held", {})
            await asyncio.wait_for(cancel_started.wait(), WAIT)
            assert await on_0.cancel(held_id) is True
            assert await asyncio.wait_for(cancel_seen, WAIT) == held_id
            stats = (await on_2.stats())["work"]

    assert answered <= handled, f"lost: {sorted(answered - handled)[:10]}"
    by_job: dict[str, list[Run]] = {}
    for run in runs:
        by_job.setdefault(run.job_id, []).append(run)
    for job_id, each in by_job.items():
        each.sort(key=lambda run: run.started)
        for before, after in itertools.pairwise(each):
            assert before.ended <= after.started, f"{job_id} ran under two leases at once"
    duplicates = sum(len(each) - 1 for each in by_job.values())
    print(f"cluster: {len(answered)} jobs, {len(runs)} runs, {duplicates} run again")
    assert duplicates <= WORKERS * PREFETCH, duplicates
    # Every second run began after the kill: only the kill hands a job out again.
    assert all(each[1].started >= killed_at for each in by_job.values() if len(each) > 1)
    assert stats["ready"] == stats["processing"] == 0
    # An enqueue cut off by the kill is sent again with its key; had its first copy been
    # handled and acked by then, the key was free again and the job is stored twice (a
    # key holds while its job lives, ENQ-10): one such job per publisher at most.
    assert len(answered) <= stats["totals"]["completed"] <= len(answered) + PUBLISHERS
