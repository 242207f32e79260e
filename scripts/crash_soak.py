"""Crash soak: a durable broker killed with SIGKILL under load, again and again.

    .venv/bin/python scripts/crash_soak.py [--kills 100] [--seed 1] [--budget 540]

A real ``conveyor serve --store sqlite`` process runs on a fixed port. SDK publishers
(``Client``) enqueue unique payloads with several requests in flight each, and record
the id of every enqueue the broker *answered*; SDK workers (``Worker``) record every job
their handler sees. The broker is killed with SIGKILL at random moments (after a random
number, drawn from a seeded generator, of enqueues answered or jobs handled since the
last restart; a third of the time with the handlers held up meanwhile, so that answered
jobs wait in the broker when it dies) and restarted on the same port; the SDK clients
reconnect by themselves.

At the end publishing stops, the run waits until every answered job was handled, the
workers stop gracefully, and the broker is restarted once more, cleanly, to read what
it kept. It checks:

* lost: answered enqueues whose job was never handled (must be 0);
* unknown: handled payloads no publisher ever sent (must be 0);
* duplicates: handler calls beyond the first for a payload. At least once allows
  them, from jobs in flight at a kill: a job whose worker did not re-attach its lease
  within the grace runs again (at most workers x prefetch per kill: "redelivered"),
  and an enqueue whose reply the kill swallowed is stored again if its first job was
  already done when it was resent (an idempotency key lives only as long as its job:
  at most the enqueues in flight per kill: "stored twice");
* the restarted broker holds nothing pending, processing or dead, and has completed
  every job it ever stored.

Every wait is bounded and driven by events (an answer, a handled job), never by sleeps.
The exit status is 1 if anything was lost or a check failed. ``tests/durability``
runs the same scenario with a few kills.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import signal
import socket
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from conveyor.sdk import Client, ConveyorError, Job, Worker

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "crash"
PAD = "x" * 60  # payloads of about 100 bytes
START_S = 20.0  # seconds a broker may take to print its listening line
STOP_S = 10.0  # seconds a broker may take to exit after SIGTERM


@dataclass
class Settings:
    """One run's shape. ``budget_s`` bounds the killing phase: fewer kills if it runs out."""

    db: Path
    kills: int = 100
    seed: int = 1
    publishers: int = 2
    concurrency: int = 8  # enqueues in flight per publisher
    workers: int = 3
    prefetch: int = 8
    backlog: int = 400  # publishers wait while this many jobs they sent are unhandled
    min_events: int = 10  # a kill comes after min..max answers or handled jobs
    max_events: int = 250
    grace_s: float = 1.0
    step_timeout_s: float = 30.0  # the longest any one awaited event may take
    budget_s: float = 540.0
    log: Path | None = None  # the brokers' stderr (appended); default next to the db
    sync: str = "full"  # the broker's --sync

    def redelivery_bound(self, kills: int) -> int:
        """Jobs the workers can hold at one kill (workers x prefetch), times the kills."""
        return kills * self.workers * self.prefetch

    def duplicate_bound(self, kills: int) -> int:
        """Jobs in flight at one kill (held by workers, or enqueues unanswered), times kills."""
        return kills * (self.workers * self.prefetch + self.publishers * self.concurrency)


@dataclass
class Result:
    kills: int
    answered: int  # enqueues answered (distinct job ids)
    sent: int  # payloads publishers tried to enqueue
    failed_enqueues: int  # enqueues that raised instead of being answered
    handled: int  # handler calls
    lost: list[str]  # answered job ids never handled
    unknown: list[str]  # handled payloads never sent
    duplicates: int  # handler calls beyond the first, per payload
    redeliveries: int  # handler calls beyond the first, per job id
    stored_twice: int  # payloads stored as two jobs (a resend after the first was done)
    leftovers: int  # jobs still queued once the workers stopped (drained, and counted)
    final_stats: dict[str, Any]
    restart_s: list[float]  # SIGKILL to listening again, per kill
    elapsed_s: float
    problems: list[str] = field(default_factory=list)  # failed final checks

    @property
    def ok(self) -> bool:
        return not self.lost and not self.unknown and not self.problems

    def summary(self) -> str:
        restart = (
            f"restart mean {sum(self.restart_s) / len(self.restart_s):.2f}s "
            f"max {max(self.restart_s):.2f}s"
            if self.restart_s
            else "no restarts"
        )
        lines = [
            f"kills={self.kills} answered={self.answered} handled={self.handled} "
            f"lost={len(self.lost)} duplicates={self.duplicates} "
            f"(same job redelivered: {self.redeliveries}; payloads stored twice: "
            f"{self.stored_twice}) unknown={len(self.unknown)}",
            f"sent={self.sent} failed_enqueues={self.failed_enqueues} "
            f"leftovers={self.leftovers} {restart} time={self.elapsed_s:.1f}s",
            f"final stats: {self.final_stats}",
        ]
        lines += [f"PROBLEM: {p}" for p in self.problems]
        if self.lost:
            lines.append(f"LOST (first 10): {self.lost[:10]}")
        if self.unknown:
            lines.append(f"UNKNOWN (first 10): {self.unknown[:10]}")
        return "\n".join(lines)


class Stuck(AssertionError):
    """An awaited event did not come in time."""


def free_port() -> int:
    """A port nothing listens on now (bound and released), on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}


class BrokerProcess:
    """``conveyor serve`` on one port and one database file, started and killed at will."""

    def __init__(
        self, port: int, db: Path, grace_s: float, log: IO[bytes], sync: str = "full"
    ) -> None:
        self.port = port
        self.db = db
        self.grace_s = grace_s
        self.sync = sync
        self.log = log
        self.proc: asyncio.subprocess.Process | None = None
        self.url = f"ws://127.0.0.1:{port}/ws"

    async def start(self) -> None:
        assert self.proc is None
        self.log.write(f"--- start {time.strftime('%H:%M:%S')}\n".encode())
        self.log.flush()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "conveyor", "serve", "--host", "127.0.0.1",
            "--port", str(self.port), "--store", "sqlite", "--db", str(self.db),
            "--sync", self.sync,
            "--disconnect-grace", str(self.grace_s), "--log-level", "warning",
            cwd=ROOT, env=_environment(), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=self.log,
        )  # fmt: skip
        self.proc = proc
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), START_S)
        except TimeoutError:
            line = b""
        expected = f"conveyor listening on {self.url} (store: sqlite {self.db})\n".encode()
        if line != expected:
            await self.kill()
            raise RuntimeError(f"the broker did not start: {line!r}; see its log {self.log.name}")

    async def kill(self) -> None:
        """SIGKILL, and reap the process."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.returncode is None:
                proc.kill()
            await proc.communicate()

    async def terminate(self) -> int:
        """SIGTERM, and wait for the exit (SIGKILL past ``STOP_S``); the exit status."""
        proc, self.proc = self.proc, None
        assert proc is not None
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.communicate(), STOP_S)
        except TimeoutError:
            proc.kill()
            await proc.communicate()
        assert proc.returncode is not None
        return proc.returncode


class Record:
    """What the publishers and workers saw; every change wakes the waiters."""

    def __init__(self) -> None:
        self.sent: set[str] = set()
        self.answered: dict[str, str] = {}  # job id -> payload tag
        self.answers = 0  # answered enqueues, counting repeats
        self.failed: list[str] = []
        self.unhandled: set[str] = set()  # tags sent and not handled yet
        self.handled_ids: Counter[str] = Counter()
        self.handled_tags: Counter[str] = Counter()
        self.ids_of: dict[str, set[str]] = {}  # payload tag -> the job ids it was handled as
        self.handled = 0
        self._changed = asyncio.Event()
        # Handlers wait for this: closed, the workers sit on the jobs they hold and the
        # rest pile up in the broker, so that a kill finds a backlog only the disk has.
        self.gate = asyncio.Event()
        self.gate.set()

    def send(self, tag: str) -> None:
        self.sent.add(tag)
        self.unhandled.add(tag)

    def answer(self, job_id: str, tag: str) -> None:
        self.answered[job_id] = tag
        self.answers += 1
        self._changed.set()

    def fail(self, tag: str, exc: Exception) -> None:
        self.failed.append(f"{tag}: {type(exc).__name__}: {exc}")
        self.unhandled.discard(tag)
        self._changed.set()

    def handle(self, job: Job) -> None:
        tag = job.payload["tag"]
        self.handled_ids[job.id] += 1
        self.handled_tags[tag] += 1
        self.ids_of.setdefault(tag, set()).add(job.id)
        self.handled += 1
        self.unhandled.discard(tag)
        self._changed.set()

    def poke(self) -> None:
        """Wake the waiters to look again (something outside the record changed)."""
        self._changed.set()

    def missing(self) -> list[str]:
        """Answered job ids not handled yet."""
        return [job_id for job_id in self.answered if job_id not in self.handled_ids]

    async def wait_for(self, predicate: Callable[[], bool], within: float, what: str) -> None:
        """Return once ``predicate()`` holds, re-checking at each change; ``Stuck`` past
        ``within`` seconds."""
        try:
            async with asyncio.timeout(within):
                while not predicate():
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise Stuck(
                f"waited {within} s for {what}: answered={len(self.answered)} "
                f"handled={self.handled} answered but not handled={len(self.missing())} "
                f"(first 5: {self.missing()[:5]})"
            ) from None


def reaches(count: Callable[[], int], target: int) -> Callable[[], bool]:
    """A predicate: ``count()`` has reached ``target``."""
    return lambda: count() >= target


async def publish(
    client: Client, record: Record, name: str, stop: asyncio.Event, settings: Settings
) -> None:
    """Enqueue unique payloads until ``stop``; never more than the backlog unhandled."""
    for n in range(sys.maxsize):
        await record.wait_for(
            lambda: stop.is_set() or len(record.unhandled) < settings.backlog,
            settings.step_timeout_s,
            "room in the backlog",
        )
        if stop.is_set():
            return
        tag = f"{name}-{n}"
        record.send(tag)
        try:
            # Enough attempts that lapses at the kills never dead-letter a job.
            job_id = await client.enqueue(QUEUE, {"tag": tag, "pad": PAD}, max_attempts=1000)
        except ConveyorError as exc:
            record.fail(tag, exc)
        else:
            record.answer(job_id, tag)


def make_worker(url: str, record: Record, worker_id: str, prefetch: int) -> Worker:
    worker = Worker(
        url, queues=[QUEUE], worker_id=worker_id, prefetch=prefetch, shutdown_timeout_s=STOP_S
    )

    @worker.handler(QUEUE)
    async def handle(job: Job) -> None:
        await record.gate.wait()
        record.handle(job)

    return worker


@contextlib.asynccontextmanager
async def working(workers: list[Worker]) -> Any:
    """Run ``workers`` for the block; stop them gracefully (bounded) at its end."""
    loop = asyncio.get_running_loop()
    tasks = [loop.create_task(worker.run()) for worker in workers]
    try:
        yield tasks
    finally:
        for worker in workers:
            worker.stop()
        _, pending = await asyncio.wait(tasks, timeout=STOP_S + 5.0)
        for task in pending:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
    # Only when the block ended normally: a worker that failed or did not stop fails the run.
    if pending:
        raise Stuck(f"{len(pending)} worker(s) did not stop in time")
    for result in results:
        if isinstance(result, BaseException):
            raise result


async def run(settings: Settings, progress: Callable[[str], None] = lambda s: None) -> Result:
    """The whole scenario; see the module docstring."""
    started = time.monotonic()
    rng = random.Random(settings.seed)
    record = Record()
    log_path = settings.log or settings.db.with_suffix(".broker.log")
    restarts: list[float] = []
    kills = 0
    leftovers = 0
    with log_path.open("ab") as log:
        broker = BrokerProcess(free_port(), settings.db, settings.grace_s, log, settings.sync)
        try:
            await broker.start()
            stop = asyncio.Event()
            workers = [
                make_worker(broker.url, record, f"crash-worker-{i}", settings.prefetch)
                for i in range(settings.workers)
            ]
            async with contextlib.AsyncExitStack() as stack:
                await stack.enter_async_context(working(workers))
                # A request waits through restarts for its reply, this long at most.
                patience = 2 * settings.step_timeout_s
                clients = [
                    await stack.enter_async_context(Client(broker.url, request_timeout=patience))
                    for _ in range(settings.publishers)
                ]
                loop = asyncio.get_running_loop()
                publishers = [
                    loop.create_task(publish(client, record, f"p{i}.{j}", stop, settings))
                    for i, client in enumerate(clients)
                    for j in range(settings.concurrency)
                ]
                try:
                    for _ in range(settings.kills):
                        if time.monotonic() - started > settings.budget_s:
                            progress(f"time budget of {settings.budget_s}s spent")
                            break
                        # A random moment: after n more answers, or n more handled jobs;
                        # a third of the time with the workers held up meanwhile, so that
                        # answered jobs pile up unhandled before the kill.
                        n = rng.randint(settings.min_events, settings.max_events)
                        roll = rng.random()
                        if roll < 1 / 3:
                            record.gate.clear()
                            # Publishers stop at the backlog: ask for no more than fits.
                            n = max(0, min(n, settings.backlog - len(record.unhandled)))
                        if roll < 2 / 3:
                            what, count = "answered enqueues", lambda: record.answers
                        else:
                            what, count = "handled jobs", lambda: record.handled
                        await record.wait_for(
                            reaches(count, count() + n),
                            settings.step_timeout_s,
                            f"{n} more {what}",
                        )
                        killed_at = time.monotonic()
                        await broker.kill()
                        kills += 1
                        await broker.start()
                        restarts.append(time.monotonic() - killed_at)
                        record.gate.set()
                        if kills % 10 == 0:
                            progress(
                                f"{kills} kills, {len(record.answered)} answered, "
                                f"{record.handled} handled, {time.monotonic() - started:.0f}s"
                            )
                except BaseException:
                    for task in publishers:
                        task.cancel()
                    await asyncio.gather(*publishers, return_exceptions=True)
                    raise
                # Stop publishing; the enqueues in flight get their answers first.
                stop.set()
                record.poke()
                _, pending = await asyncio.wait(publishers, timeout=patience + 5.0)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*publishers, return_exceptions=True)
                if pending:
                    raise Stuck(f"{len(pending)} publisher(s) still waiting after {patience} s")
                for task in publishers:
                    failure = task.exception()
                    if failure is not None:
                        raise failure
                await record.wait_for(
                    lambda: not record.missing(),
                    settings.step_timeout_s,
                    "every answered job to be handled",
                )
            # The workers stopped gracefully: every job they held was reported. A job
            # handled already may still be queued (its lease lapsed at a kill, and it
            # went back to the queue): one more worker drains those.
            leftovers = await drain_leftovers(broker.url, record, settings)
            code = await broker.terminate()
            await broker.start()
            async with Client(broker.url, request_timeout=settings.step_timeout_s) as client:
                final = (await client.stats(QUEUE))[QUEUE]
            code_after = await broker.terminate()
        finally:
            await broker.kill()
    problems = []
    if code != 0 or code_after != 0:
        problems.append(f"SIGTERM exit statuses {code}, {code_after} (want 0, 0)")
    held = {name: final[name] for name in ("ready", "scheduled", "processing", "dead")}
    if any(held.values()):
        problems.append(f"after the final restart the broker still holds {held}")
    totals = final["totals"]
    if totals["completed"] != totals["enqueued"]:
        problems.append(
            f"stored {totals['enqueued']} jobs but completed {totals['completed']} (want equal)"
        )
    if len(record.answered) > totals["enqueued"]:
        problems.append(f"{len(record.answered)} answered but only {totals['enqueued']} stored")
    redeliveries = record.handled - len(record.handled_ids)
    duplicates = record.handled - len(record.handled_tags)
    if redeliveries > settings.redelivery_bound(kills):
        problems.append(
            f"{redeliveries} redeliveries: more than kills x workers x prefetch "
            f"= {settings.redelivery_bound(kills)}"
        )
    if duplicates > settings.duplicate_bound(kills):
        problems.append(
            f"{duplicates} duplicates: more than kills x (workers x prefetch + enqueues in "
            f"flight) = {settings.duplicate_bound(kills)}"
        )
    return Result(
        kills=kills,
        answered=len(record.answered),
        sent=len(record.sent),
        failed_enqueues=len(record.failed),
        handled=record.handled,
        lost=record.missing(),
        unknown=sorted(set(record.handled_tags) - record.sent),
        duplicates=duplicates,
        redeliveries=redeliveries,
        stored_twice=sum(len(ids) > 1 for ids in record.ids_of.values()),
        leftovers=leftovers,
        final_stats=final,
        restart_s=restarts,
        elapsed_s=time.monotonic() - started,
        problems=problems,
    )


async def drain_leftovers(url: str, record: Record, settings: Settings) -> int:
    """Handle whatever is still queued with a fresh worker; return how many it handled."""
    async with Client(url, request_timeout=settings.step_timeout_s) as client:
        stats = (await client.stats(QUEUE))[QUEUE]
        queued = stats["ready"] + stats["scheduled"] + stats["processing"]
        if not queued:
            return 0
        mark = record.handled
        worker = make_worker(url, record, "crash-drain", settings.prefetch)
        async with working([worker]):
            # Processing leftovers lapse after the grace; then they are pushed here.
            await record.wait_for(
                lambda: record.handled >= mark + queued,
                settings.step_timeout_s,
                f"{queued} leftover jobs to be handled",
            )
        return record.handled - mark


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=100, help="SIGKILLs to deliver (100)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the kill moments (1)")
    parser.add_argument(
        "--budget", type=float, default=540.0, help="seconds of killing at most (540)"
    )
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--prefetch", type=int, default=8)
    parser.add_argument("--db", type=Path, help="database file (default: a fresh temp dir)")
    parser.add_argument("--sync", choices=("full", "normal"), default="full")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # the SDK's reconnect warnings are expected

    with tempfile.TemporaryDirectory(prefix="conveyor-soak-") as tmp:
        db = args.db or Path(tmp) / "soak.db"
        settings = Settings(
            db=db,
            kills=args.kills,
            seed=args.seed,
            workers=args.workers,
            prefetch=args.prefetch,
            budget_s=args.budget,
            log=Path(tmp) / "broker.log",
            sync=args.sync,
        )
        print(
            f"crash soak: {settings.kills} kills, seed {settings.seed}, sync {settings.sync}, "
            f"{settings.publishers}x{settings.concurrency} publishers, "
            f"{settings.workers} workers x prefetch {settings.prefetch}",
            flush=True,
        )
        try:
            result = asyncio.run(run(settings, progress=lambda s: print(s, flush=True)))
        except Stuck as exc:
            print(f"FAILED: {exc}")
            print((Path(tmp) / "broker.log").read_text()[-3000:])
            return 1
        print(result.summary())
        print(
            f"bounds: redeliveries <= kills x workers x prefetch = "
            f"{settings.redelivery_bound(result.kills)}; duplicates <= kills x (workers x "
            f"prefetch + enqueues in flight) = {settings.duplicate_bound(result.kills)}"
        )
        print("RESULT: " + ("OK" if result.ok else "FAILED"))
        if not result.ok:
            print((Path(tmp) / "broker.log").read_text()[-3000:])
        return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
