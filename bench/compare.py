"""Conveyor against RabbitMQ, NATS JetStream and beanstalkd: same workload, same layout.

    .venv/bin/pip install -r bench/requirements.txt     # the peers' clients (bench only)
    .venv/bin/python bench/compare.py                   # full run (about 15-20 minutes)
    .venv/bin/python bench/compare.py --snapshot --sdk-worker   # what docs/benchmarks.md ran
    .venv/bin/python bench/compare.py --quick           # a smoke run (a couple of minutes)
    .venv/bin/python bench/compare.py --systems conveyor-memory,rabbitmq --runs 5
    .venv/bin/python bench/compare.py --systems nats,nats-memory --sdk-worker --loop asyncio

Every client process (publishers and workers of every system) runs on the loop ``--loop``
names: uvloop (``auto``, when installed, as ``conveyor worker`` picks it) or asyncio's.
NATS runs twice: ``nats`` (a file stream) and ``nats-memory`` (a memory stream).

Every system runs the same workloads with the same process layout: the broker in its own
process, one publisher process, and one process per worker (``multiprocessing``, spawn).

* enqueue: one publisher sends N jobs of ~100 bytes, at most 64 awaiting the system's
  durable acceptance (Conveyor's reply, RabbitMQ's publisher confirm, JetStream's publish
  ack, beanstalkd's ``INSERTED``); jobs/s from the first send to the last acceptance;
* enqueue1: the same with one awaited call at a time (the inverse of a round trip);
* drain: N jobs already queued, 1 and then 4 worker processes take and ack each (prefetch
  64, or ``--prefetch``, or the nearest setting); jobs/s from "go" to the last ack;
* latency: a publisher at a steady 1,000 jobs/s for 5 s, 2 workers, subscribed before the
  first job; from the enqueue call to the handler starting (the send time travels in the
  payload; one host clock), p50, p99 and max;
* cost (once, not per round): broker RSS with 1,000,000 pending jobs of ~100 bytes; broker
  RSS and CPU with 10,000 idle subscribed workers under keepalive (Conveyor only); the
  engine's claim cost at depth 1,000 vs 1,000,000 (bench/engine_cost.py).

Conveyor and beanstalkd are started fresh for every measurement, on a free port (SQLite
and binlogs in a temporary directory). RabbitMQ (127.0.0.1:5672, guest/guest) and NATS
(127.0.0.1:4222, JetStream) are the ones already running: the harness checks they answer,
skips them with a clear message when they do not, and deletes its queue/stream before
and after every measurement. Every measurement is bounded in time, checks that every job
was accepted, handled and acked exactly once (unique job ids), and that the broker holds
nothing afterwards. A round runs one workload on every system in turn (in the reverse
order every other round) before the next workload, so the two figures of a ratio are
taken close together. It prints the median and min-max of the rounds, and Conveyor's figures
as ratios to each peer's: per round, then the median of those (shared machines are noisy;
only ratios from one run compare).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import importlib.metadata
import math
import multiprocessing as mp
import os
import platform
import queue
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT: list[str] = []  # with --snapshot: the commit Conveyor runs from (git archive)
LOOP = ["auto"]  # --loop: every client's event loop (publishers and workers, every system)
HOST = "127.0.0.1"
IN_FLIGHT = 64  # enqueue window: at most 64 jobs in flight per publisher
# Per worker; --prefetch sets it, through the environment so that spawned workers see it.
PREFETCH = int(os.environ.get("BENCH_PREFETCH", "64"))
FILL_WINDOW = 1000  # untimed fills (prefill before a drain, the 1,000,000 pending jobs)
FILL_BATCH = 1000  # Conveyor fills use enqueue_batch (max_batch is 1000)
QUEUE = "bench"  # Conveyor
RABBIT_URL = "amqp://guest:guest@127.0.0.1:5672/"
RABBIT_QUEUE = "conveyor-bench"
NATS_URL = "nats://127.0.0.1:4222"
NATS_STREAM = "CONVEYOR_BENCH"
NATS_SUBJECT = "conveyor.bench"
NATS_CONSUMER = "bench-workers"
TUBE = "conveyor-bench"
FILLER = "x" * 28  # makes the encoded job 100 bytes or so (see job_body)
CTX = mp.get_context("spawn")
T = TypeVar("T")


def conveyor_build() -> str:
    """The commit the broker runs from, whether conveyor/ differs from it, the loop."""
    try:
        import uvloop  # noqa: F401

        loop = "uvloop installed"
    except ImportError:
        loop = "asyncio loop"
    if SNAPSHOT:
        return f"snapshot of commit {SNAPSHOT[0]} (git archive), {loop}"
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain", "conveyor"], capture_output=True,
                           text=True).stdout.strip()  # fmt: skip
    state = "with uncommitted changes in conveyor/" if dirty else "clean"
    return f"working tree at commit {head.stdout.strip() or '?'}, {state}, {loop}"


def take_snapshot() -> Path:
    """Copy HEAD's conveyor/ and the engine benchmark to a temporary directory and
    run Conveyor (the broker, the SDK clients, engine_cost.py) from there, so that edits
    made while the harness runs cannot mix versions within one run."""
    tmp = Path(tempfile.mkdtemp(prefix="conveyor-snapshot-"))
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "HEAD", "conveyor", "bench/engine_cost.py"],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
    SNAPSHOT[:] = [commit, str(tmp)]
    sys.path.insert(0, str(tmp))  # spawned clients inherit sys.path
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(tmp), os.environ.get("PYTHONPATH")])
    )
    return tmp


def loop_name(choice: str) -> str:
    """The loop ``--loop choice`` runs every client on, by name (the choice made as
    ``conveyor worker --loop`` makes it; ImportError for uvloop when it is missing)."""
    from conveyor.sdk._loop import loop_factory

    return "asyncio's loop" if loop_factory(choice) is None else "uvloop"


def conveyor_root() -> Path:
    return Path(SNAPSHOT[1]) if SNAPSHOT else ROOT


def job_body(seq: int, sent: float) -> bytes:
    """One job: its sequence number (the uniqueness check) and its send time (latency)."""
    return orjson.dumps({"seq": seq, "sent": sent, "to": "someone@example.com", "body": FILLER})


# -- the systems, as seen from the harness --------------------------------------------------


@dataclass(frozen=True)
class Target:
    """What a client process needs to reach one system (picklable)."""

    kind: str  # conveyor | rabbitmq | nats | beanstalkd
    address: str  # a ws:// URL, an amqp:// URL, a nats:// URL or host:port
    sdk: bool = False  # Conveyor: the SDK's Client and Worker instead of raw WebSockets
    loop: str = "auto"  # every client process runs on this loop (--loop), see run_client
    storage: str = "file"  # NATS: the stream's storage (file or memory)


class Skip(Exception):
    """A system that cannot run here (not installed, not reachable)."""


class Failed(Exception):
    """A measurement that did not complete correctly (timeout, lost or repeated jobs)."""


@dataclass
class System:
    name: str
    kind: str
    durability: str  # memory | fsync | no-fsync  (what an accepted job survives)
    sdk: bool = False
    store: str = ""  # Conveyor
    sync: str = "full"  # Conveyor sqlite
    binlog: bool = False  # beanstalkd
    storage: str = "file"  # NATS: the stream's storage
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _tmp: Path | None = field(default=None, repr=False)
    _target: Target | None = field(default=None, repr=False)

    @property
    def conveyor(self) -> bool:
        return self.kind == "conveyor"

    # Each measurement: start() (a fresh broker, or an emptied queue), work, stop().

    def check(self) -> str:
        """Raise Skip when the system cannot run here; return a version string."""
        if self.kind == "conveyor":
            from conveyor import broker

            return f"conveyor {broker.__version__} ({conveyor_build()})"
        if self.kind == "rabbitmq":
            return asyncio.run(rabbit_check())
        if self.kind == "nats":
            return asyncio.run(nats_check())
        return beanstalkd_check()

    def start(self) -> Target:
        self.stop()
        if self.kind == "conveyor":
            self._tmp = Path(tempfile.mkdtemp(prefix="conveyor-bench-"))
            self._proc, url = start_conveyor(self.store, self.sync, self._tmp)
            self._target = Target("conveyor", url, self.sdk, LOOP[0])
        elif self.kind == "beanstalkd":
            self._tmp = Path(tempfile.mkdtemp(prefix="beanstalkd-bench-"))
            self._proc, address = start_beanstalkd(self._tmp if self.binlog else None)
            self._target = Target("beanstalkd", address, loop=LOOP[0])
        elif self.kind == "rabbitmq":
            asyncio.run(rabbit_reset(create=True))
            self._target = Target("rabbitmq", RABBIT_URL, loop=LOOP[0])
        else:
            asyncio.run(nats_reset(create=True, storage=self.storage))
            self._target = Target("nats", NATS_URL, loop=LOOP[0], storage=self.storage)
        return self._target

    def prepare_workers(self, workers: int) -> None:
        """Anything the consumers need that is shared between worker processes."""
        if self.kind == "nats":
            asyncio.run(nats_add_consumer(PREFETCH * workers))

    def remaining(self) -> int:
        """Jobs the broker still holds (ready, delayed or handed out and not acked)."""
        assert self._target is not None
        if self.kind == "conveyor":
            return asyncio.run(conveyor_remaining(self._target.address))
        if self.kind == "rabbitmq":
            return asyncio.run(rabbit_remaining())
        if self.kind == "nats":
            return asyncio.run(nats_remaining())
        return beanstalkd_remaining(self._target.address)

    def pid(self) -> int | None:
        if self._proc is not None:
            return self._proc.pid
        if self.kind == "rabbitmq":
            return find_pid("beam.smp", "rabbit")
        if self.kind == "nats":
            return find_pid("nats-server", "")
        return None

    def stop(self) -> None:
        if self._proc is not None:
            stop_popen(self._proc)
            self._proc = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        if self._target is not None:
            if self.kind == "rabbitmq":
                asyncio.run(rabbit_reset(create=False))
            elif self.kind == "nats":
                asyncio.run(nats_reset(create=False, storage=self.storage))
            self._target = None


def all_systems() -> dict[str, System]:
    systems = [
        System("conveyor-memory", "conveyor", "memory", store="memory"),
        System("conveyor-sqlite", "conveyor", "fsync", store="sqlite"),
        System("conveyor-sqlite-normal", "conveyor", "no-fsync", store="sqlite", sync="normal"),
        System("conveyor-memory-sdk", "conveyor", "memory", sdk=True, store="memory"),
        System("conveyor-sqlite-sdk", "conveyor", "fsync", sdk=True, store="sqlite"),
        System("rabbitmq", "rabbitmq", "fsync"),
        System("nats", "nats", "no-fsync"),
        System("nats-memory", "nats", "memory", storage="memory"),
        System("beanstalkd", "beanstalkd", "memory"),
        System("beanstalkd-binlog", "beanstalkd", "fsync", binlog=True),
    ]
    return {s.name: s for s in systems}


DEFAULT_SYSTEMS = [
    "conveyor-memory",
    "conveyor-sqlite",
    "conveyor-sqlite-normal",
    "rabbitmq",
    "nats",
    "nats-memory",
    "beanstalkd",
    "beanstalkd-binlog",
]
SDK_SYSTEMS = ["conveyor-memory-sdk", "conveyor-sqlite-sdk"]
DURABLE_PEERS = ["rabbitmq", "nats", "beanstalkd-binlog"]  # keep accepted jobs on disk
FSYNC_PEERS = ["rabbitmq", "beanstalkd-binlog"]  # ... and fsync them before accepting


# -- processes: every one the harness starts is tracked and stopped by its PID --------------

CHILDREN: list[Any] = []


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def start_conveyor(store: str, sync: str, tmp: Path, *extra: str) -> tuple[Any, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor", "serve", "--host", HOST, "--port", "0",
         "--store", store, "--db", str(tmp / "bench.db"), "--sync", sync,
         "--log-level", "warning",
         # Every bench client connects from loopback: lift the per-address limit.
         "--max-connections-per-address", "50000", "--max-connections", "50000", *extra],
        cwd=conveyor_root(), stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
        stderr=open(tmp / "broker.log", "wb"),  # the child keeps it; closed at its exit
    )  # fmt: skip
    CHILDREN.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("conveyor listening on "):
        stop_popen(proc)
        log = (tmp / "broker.log").read_text(errors="replace")[-2000:]
        raise Failed(f"conveyor did not start: {line!r} {log}")
    return proc, line.split()[3]


def start_beanstalkd(binlog: Path | None) -> tuple[Any, str]:
    port = free_port()
    args = ["beanstalkd", "-l", HOST, "-p", str(port)]
    if binlog is not None:
        args += ["-b", str(binlog), "-f", "0"]  # fsync at every binlog write
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    CHILDREN.append(proc)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), 0.5):
            return proc, f"{HOST}:{port}"
        time.sleep(0.02)
    stop_popen(proc)
    raise Failed("beanstalkd did not start")


def stop_popen(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
    with contextlib.suppress(ValueError):
        CHILDREN.remove(proc)


def stop_process(proc: Any) -> None:
    if proc.is_alive():
        proc.terminate()
        proc.join(5)
        if proc.is_alive():
            proc.kill()
            proc.join()
    with contextlib.suppress(ValueError):
        CHILDREN.remove(proc)


def stop_all() -> None:
    for child in list(CHILDREN):
        if isinstance(child, subprocess.Popen):
            stop_popen(child)
        else:
            stop_process(child)


def spawn(fn: Callable[..., None], *args: Any) -> Any:
    proc = CTX.Process(target=fn, args=args, daemon=True)
    proc.start()
    CHILDREN.append(proc)
    return proc


def find_pid(comm: str, needle: str) -> int | None:
    """The PID of a running process by its name (for the peers' RSS), from /proc."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != comm:
                continue
            if needle and needle not in (entry / "cmdline").read_bytes().decode(errors="replace"):
                continue
            return int(entry.name)
        except OSError:
            continue
    return None


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# -- clients, run inside the publisher and worker processes -------------------------------


async def cancel_and_wait(task: asyncio.Task[None]) -> None:
    """Stop a worker's consuming task, whatever it ends with."""
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


async def wait_event(event: Any) -> None:
    """Wait for a multiprocessing.Event without blocking the loop (in a thread, in short
    waits, so that this stays cancellable and the process can always exit)."""
    loop = asyncio.get_running_loop()
    while not await loop.run_in_executor(None, event.wait, 0.1):
        pass


class ConveyorPublisher:
    """Raw WebSocket publisher: one connection, replies matched by rid. The enqueues made
    in one loop iteration go out together as one ``enqueue_each`` frame of at most
    ``EACH`` jobs, each answered on its own (as the SDK sends them)."""

    EACH = 16

    def __init__(self, url: str) -> None:
        self.url = url
        self.rid = 0
        self.waiting: dict[int, list[asyncio.Future[None]]] = {}
        self.jobs: list[bytes] = []
        self.futures: list[asyncio.Future[None]] = []
        self.scheduled = False
        self.sending: set[asyncio.Future[None]] = set()  # kept until done (not collected)

    async def connect(self) -> None:
        from websockets.asyncio.client import connect

        self.ws = await connect(self.url, max_size=None, compression=None, ping_interval=None)
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                reply = orjson.loads(raw)
                futures = self.waiting.pop(reply["rid"])
                results = reply.get("results") or [{}] * len(futures)  # enqueue_batch: ids
                for future, result in zip(futures, results, strict=True):
                    if reply.get("ok") and "error" not in result:
                        future.set_result(None)
                    else:
                        future.set_exception(RuntimeError(f"refused: {reply}"))
        finally:
            for futures in self.waiting.values():
                for future in futures:
                    if not future.done():
                        future.set_exception(RuntimeError("connection closed"))

    def _send(self, template: bytes, futures: list[asyncio.Future[None]]) -> None:
        self.rid += 1
        self.waiting[self.rid] = futures
        sending = asyncio.ensure_future(self.ws.send(template % self.rid, text=True))
        self.sending.add(sending)
        sending.add_done_callback(self.sending.discard)

    def _ship(self) -> None:
        self.scheduled = False
        if self.jobs:
            jobs, self.jobs = b",".join(self.jobs), []
            futures, self.futures = self.futures, []
            self._send(b'{"op":"enqueue_each","rid":%%d,"jobs":[%s]}' % jobs, futures)

    async def publish(self, seq: int, sent: float) -> None:
        future = asyncio.get_running_loop().create_future()
        self.jobs.append(b'{"queue":"bench","payload":%s}' % job_body(seq, sent))
        self.futures.append(future)
        if len(self.jobs) >= self.EACH:
            self._ship()
        elif not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self._ship)
        await future

    async def publish_batch(self, seqs: list[int]) -> None:
        now = time.monotonic()
        jobs = b",".join(b'{"payload":%s}' % job_body(seq, now) for seq in seqs)
        future = asyncio.get_running_loop().create_future()
        self._send(b'{"op":"enqueue_batch","rid":%%d,"queue":"bench","jobs":[%s]}' % jobs, [future])
        await future

    async def close(self) -> None:
        await self.ws.close()
        self.reader.cancel()


class ConveyorSdkPublisher:
    """The SDK's Client (every enqueue carries an idempotency key, as the SDK does)."""

    def __init__(self, url: str) -> None:
        from conveyor.sdk import Client

        self.client = Client(url)

    async def connect(self) -> None:
        await self.client.__aenter__()

    async def publish(self, seq: int, sent: float) -> None:
        payload = {"seq": seq, "sent": sent, "to": "someone@example.com", "body": FILLER}
        await self.client.enqueue(QUEUE, payload)

    async def publish_batch(self, seqs: list[int]) -> None:
        now = time.monotonic()
        jobs = [{"seq": s, "sent": now, "to": "someone@example.com", "body": FILLER} for s in seqs]
        await self.client.enqueue_many(QUEUE, jobs)

    async def close(self) -> None:
        await self.client.aclose()


class RabbitPublisher:
    """aio-pika, a channel in confirm mode, persistent messages to a durable queue."""

    async def connect(self) -> None:
        import aio_pika

        self.aio_pika = aio_pika
        self.connection = await aio_pika.connect(RABBIT_URL)
        self.channel = await self.connection.channel(publisher_confirms=True)
        self.exchange = self.channel.default_exchange

    async def publish(self, seq: int, sent: float) -> None:
        message = self.aio_pika.Message(
            job_body(seq, sent), delivery_mode=self.aio_pika.DeliveryMode.PERSISTENT
        )
        await self.exchange.publish(message, routing_key=RABBIT_QUEUE)  # returns on confirm

    async def close(self) -> None:
        await self.connection.close()


class NatsPublisher:
    """nats-py, JetStream publish: returns on the stream's publish ack."""

    async def connect(self) -> None:
        import nats

        self.nc = await nats.connect(NATS_URL)
        self.js = self.nc.jetstream()

    async def publish(self, seq: int, sent: float) -> None:
        await self.js.publish(NATS_SUBJECT, job_body(seq, sent))

    async def close(self) -> None:
        await self.nc.close()


class BeanstalkPublisher:
    """beanstalkd's text protocol over asyncio, pipelined (replies come in order).

    greenstalk is synchronous (one command at a time), so with it the publisher could
    not keep 64 puts in flight; the worker processes use greenstalk.
    """

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.host, self.port = host, int(port)
        self.pending: collections.deque[asyncio.Future[None]] = collections.deque()

    async def connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(f"use {TUBE}\r\n".encode())
        line = await self.reader.readline()
        assert line.startswith(b"USING"), line
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            while line := await self.reader.readline():
                future = self.pending.popleft()
                if line.startswith(b"INSERTED"):
                    future.set_result(None)
                else:
                    future.set_exception(RuntimeError(f"put refused: {line!r}"))
        finally:
            for future in self.pending:
                if not future.done():
                    future.set_exception(RuntimeError("connection closed"))

    async def publish(self, seq: int, sent: float) -> None:
        body = job_body(seq, sent)
        future = asyncio.get_running_loop().create_future()
        self.pending.append(future)
        self.writer.write(b"put 1024 0 120 %d\r\n%s\r\n" % (len(body), body))
        await future

    async def close(self) -> None:
        self.writer.close()
        self.task.cancel()


def make_publisher(target: Target) -> Any:
    if target.kind == "conveyor":
        return (
            ConveyorSdkPublisher(target.address)
            if target.sdk
            else ConveyorPublisher(target.address)
        )
    if target.kind == "rabbitmq":
        return RabbitPublisher()
    if target.kind == "nats":
        return NatsPublisher()
    return BeanstalkPublisher(target.address)


def publisher_main(
    target: Target, mode: str, n: int, window: int, rate: float, results: Any, go: Any, count: Any
) -> None:
    """A publisher process. mode: "timed" (window in flight), "fill" (the same, untimed,
    Conveyor in batches), "rate" (a steady rate, each send on its own schedule)."""
    try:
        out = run_client(target, publish_jobs(target, mode, n, window, rate, results, go, count))
        results.put(("result", 0, out))
    except BaseException:
        results.put(("error", 0, traceback.format_exc()))


async def publish_jobs(
    target: Target, mode: str, n: int, window: int, rate: float, results: Any, go: Any, count: Any
) -> dict[str, Any]:
    publisher = make_publisher(target)
    await publisher.connect()
    results.put(("ready", 0, None))
    await wait_event(go)
    start = time.monotonic()
    if mode == "rate":
        slots = asyncio.Semaphore(window)
        tasks: set[asyncio.Task[None]] = set()

        async def one(seq: int) -> None:
            try:
                await publisher.publish(seq, time.monotonic())
                count.value += 1
            finally:
                slots.release()

        for seq in range(n):
            delay = start + seq / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await slots.acquire()
            task = asyncio.create_task(one(seq))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*list(tasks))
    elif mode == "fill" and hasattr(publisher, "publish_batch"):
        chunks = iter(range(0, n, FILL_BATCH))

        async def batch_lane() -> None:
            for first in chunks:
                seqs = list(range(first, min(n, first + FILL_BATCH)))
                await publisher.publish_batch(seqs)
                count.value += len(seqs)

        await asyncio.gather(*(batch_lane() for _ in range(8)))
    else:
        seqs = iter(range(n))

        async def lane() -> None:  # each lane keeps one request in flight
            for seq in seqs:
                await publisher.publish(seq, time.monotonic())
                count.value += 1

        await asyncio.gather(*(lane() for _ in range(window)))
    end = time.monotonic()
    await publisher.close()
    return {"start": start, "end": end, "accepted": count.value}


class Tally:
    """What one worker process saw: job ids, handler start latencies, the last ack."""

    def __init__(self, count: Any, latency: bool) -> None:
        self.count = count
        self.latency = latency
        self.seqs: list[int] = []
        self.lat: list[float] = []
        self.last_ack = 0.0
        # With BENCH_READ_STAMPS set (bench/latency_hops.py): when the worker's client
        # library handed each read's bytes to Python, as (time, bytes) for a WebSocket
        # (the SDK's, the raw worker's), and per job seq for greenstalk's (one reserved
        # job at a time).
        self.stamp_reads = bool(os.environ.get("BENCH_READ_STAMPS"))
        self.raw_reads: list[tuple[float, bytes]] = []
        self.reads: dict[int, float] = {}

    def handle(self, body: Any) -> None:
        """The handler starts: ``body`` is the decoded job."""
        now = time.monotonic()
        self.seqs.append(body["seq"])
        if self.latency:
            self.lat.append(now - body["sent"])

    def acked(self) -> None:
        self.last_ack = time.monotonic()
        self.count.value += 1

    def result(self) -> dict[str, Any]:
        out = {"seqs": self.seqs, "lat": self.lat, "last_ack": self.last_ack}
        if self.stamp_reads:
            for at, data in self.raw_reads:  # a job's first read: the one that carried it
                for seq in _SEQ_IN_FRAME.findall(data):
                    self.reads.setdefault(int(seq), at)
            out["reads"] = self.reads
        return out


_SEQ_IN_FRAME = re.compile(rb'"seq":(\d+)')


def noting_reads(received: Callable[..., None], tally: Tally) -> Callable[..., None]:
    """``received``, a ``data_received`` (bound, or a class's), that first notes the
    time and bytes of each read in ``tally.raw_reads`` (a clock read and an append; the
    seqs are found after the round)."""
    clock, append = time.monotonic, tally.raw_reads.append

    def data_received(*args: Any) -> None:
        append((clock(), args[-1]))
        received(*args)

    return data_received


class _StampedReader:
    """greenstalk's buffered socket reader, noting when each response line came in."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader
        self.at = 0.0

    def readline(self) -> bytes:
        line: bytes = self._reader.readline()
        self.at = time.monotonic()
        return line

    def read(self, size: int) -> bytes:
        data: bytes = self._reader.read(size)
        return data

    def close(self) -> None:
        self._reader.close()


class ConveyorWorker:
    """Raw WebSocket worker: subscribe; for each pushed frame, handle its jobs, then ack
    them in one ``ack_batch`` with a rid; count each job when the reply says it landed."""

    def __init__(self, url: str, name: str) -> None:
        self.url, self.name = url, name
        self.ready = asyncio.Event()

    async def subscribed(self) -> None:
        await self.ready.wait()

    async def connect(self) -> None:
        from websockets.asyncio.client import connect

        self.ws = await connect(self.url, max_size=None, compression=None, ping_interval=None)

    async def run(self, tally: Tally) -> None:
        subscribe = {"op": "subscribe", "rid": "s", "worker_id": self.name, "queues": [QUEUE],
                     "prefetch": PREFETCH}  # fmt: skip
        await self.ws.send(orjson.dumps(subscribe), text=True)
        if tally.stamp_reads:
            self.ws.data_received = noting_reads(self.ws.data_received, tally)  # type: ignore[method-assign]
        rid = 0
        async for raw in self.ws:
            frame = orjson.loads(raw)
            if frame.get("push") == "jobs":
                items = []
                for job in frame["jobs"]:
                    tally.handle(job["payload"])
                    items.append({"id": job["id"], "lease": job["lease"]})
                rid += 1
                ack = {"op": "ack_batch", "rid": rid, "items": items}
                await self.ws.send(orjson.dumps(ack), text=True)
            elif "rid" in frame:
                if not frame.get("ok") or (frame["rid"] != "s" and not all(frame["landed"])):
                    raise RuntimeError(f"unexpected reply: {frame}")
                if frame["rid"] == "s":
                    self.ready.set()
                else:
                    for _ in frame["landed"]:
                        tally.acked()

    async def close(self, task: asyncio.Task[None]) -> None:
        await cancel_and_wait(task)
        await self.ws.close()


class ConveyorSdkWorker:
    """The SDK's Worker: it acks when the handler returns (counted at the handler's end;
    the harness then checks that the broker holds no job)."""

    def __init__(self, url: str, name: str) -> None:
        self.url, self.name = url, name

    async def connect(self) -> None:
        # The Worker connects and subscribes in run(), at "go". Importing the SDK happens
        # here, before "ready", as the other clients' imports do: at "go" it stalled the
        # first jobs of every latency round.
        from conveyor.sdk import Worker

        self.worker = Worker(self.url, queues=[QUEUE], worker_id=self.name, prefetch=PREFETCH)

    async def subscribed(self) -> None:
        # (Worker.url is set once its subscribe is answered; the Worker has no event for
        # it, and this wait happens before "ready", so polling costs no measurement)
        while self.worker.url is None:  # noqa: ASYNC110
            await asyncio.sleep(0.001)

    async def run(self, tally: Tally) -> None:
        from conveyor.sdk import Job

        if tally.stamp_reads:  # every SDK socket of this process: the class's method
            from conveyor.sdk._transport import Socket

            Socket.data_received = noting_reads(Socket.data_received, tally)  # type: ignore[method-assign]

        @self.worker.handler(QUEUE)
        async def handle(job: Job) -> None:
            tally.handle(job.payload)
            tally.acked()

        await self.worker.run()

    async def close(self, task: asyncio.Task[None]) -> None:
        self.worker.stop()
        try:
            await asyncio.wait_for(task, 10)
        except BaseException:
            task.cancel()


class RabbitWorker:
    """aio-pika consumer: prefetch (basic.qos) ``PREFETCH``, manual ack after the handler."""

    async def subscribed(self) -> None:
        await self.ready.wait()

    async def connect(self) -> None:
        import aio_pika

        self.ready = asyncio.Event()
        self.connection = await aio_pika.connect(RABBIT_URL)
        self.channel = await self.connection.channel()
        await self.channel.set_qos(prefetch_count=PREFETCH)
        self.queue = await self.channel.declare_queue(RABBIT_QUEUE, durable=True, passive=True)

    async def run(self, tally: Tally) -> None:
        async def on_message(message: Any) -> None:
            tally.handle(orjson.loads(message.body))
            await message.ack()
            tally.acked()

        await self.queue.consume(on_message)
        self.ready.set()
        await asyncio.Future()

    async def close(self, task: asyncio.Task[None]) -> None:
        await cancel_and_wait(task)
        await self.connection.close()


class NatsWorker:
    """nats-py push subscription bound to a durable JetStream consumer with a deliver group
    (explicit acks; max_ack_pending is ``PREFETCH`` per worker, set on the shared consumer)."""

    async def subscribed(self) -> None:
        await self.ready.wait()

    async def connect(self) -> None:
        import nats

        self.ready = asyncio.Event()
        self.nc = await nats.connect(NATS_URL)
        self.js = self.nc.jetstream()

    async def run(self, tally: Tally) -> None:
        async def on_message(msg: Any) -> None:
            tally.handle(orjson.loads(msg.data))
            await msg.ack()
            tally.acked()

        await self.js.subscribe(
            NATS_SUBJECT, queue=NATS_CONSUMER, durable=NATS_CONSUMER, stream=NATS_STREAM,
            cb=on_message, manual_ack=True,
        )  # fmt: skip
        self.ready.set()
        await asyncio.Future()

    async def close(self, task: asyncio.Task[None]) -> None:
        await cancel_and_wait(task)
        await self.nc.close()


def make_worker(target: Target, name: str) -> Any:
    if target.kind == "conveyor":
        cls = ConveyorSdkWorker if target.sdk else ConveyorWorker
        return cls(target.address, name)
    return RabbitWorker() if target.kind == "rabbitmq" else NatsWorker()


def run_client(target: Target, main: Coroutine[Any, Any, T]) -> T:
    """Run a client process's ``main`` on ``--loop``'s event loop: every client of every
    system on the same one (uvloop, as ``conveyor worker`` picks it when installed, or
    asyncio's), so that no system's figures carry a faster loop than another's."""
    from conveyor.sdk._loop import loop_factory

    with asyncio.Runner(loop_factory=loop_factory(target.loop)) as runner:
        return runner.run(main)


def worker_main(
    target: Target, index: int, latency: bool, results: Any, go: Any, stop: Any, count: Any
) -> None:
    """A worker process: connect, say ready, wait for go, consume until told to stop."""
    try:
        tally = Tally(count, latency)
        if target.kind == "beanstalkd":
            beanstalk_work(target, index, tally, results, go, stop)
        else:
            run_client(target, async_work(target, index, tally, results, go, stop))
        results.put(("result", index, tally.result()))
    except BaseException:
        results.put(("error", index, traceback.format_exc()))


async def async_work(
    target: Target, index: int, tally: Tally, results: Any, go: Any, stop: Any
) -> None:
    worker = make_worker(target, f"bench-{os.getpid()}-{index}")
    await worker.connect()
    task = None
    if tally.latency:
        # The latency workload measures a steady state: every worker is subscribed
        # before the publisher's first job, on every system (the queue is empty until
        # then). A drain's workers subscribe at "go", to a full queue.
        task = asyncio.create_task(worker.run(tally))
        await worker.subscribed()
    results.put(("ready", index, None))
    await wait_event(go)
    if task is None:
        task = asyncio.create_task(worker.run(tally))
    stopping = asyncio.create_task(wait_event(stop))
    done, _ = await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()  # raises what ended it
        raise RuntimeError("worker ended early")
    await worker.close(task)


def beanstalk_work(
    target: Target, index: int, tally: Tally, results: Any, go: Any, stop: Any
) -> None:
    """greenstalk (synchronous): reserve, handle, delete. beanstalkd has no prefetch: the
    nearest setting is one reserved job at a time per worker connection."""
    import greenstalk

    host, port = target.address.rsplit(":", 1)
    client = greenstalk.Client((host, int(port)), watch=TUBE, encoding=None)
    reader = None
    if tally.stamp_reads:
        reader = _StampedReader(client._reader)
        client._reader = reader  # type: ignore[assignment]  # (duck-typed: read and readline)
    results.put(("ready", index, None))
    go.wait()
    while not stop.is_set():
        try:
            job = client.reserve(timeout=1)
        except greenstalk.TimedOutError:
            continue
        body = orjson.loads(job.body)
        tally.handle(body)
        if reader is not None:
            tally.reads[body["seq"]] = reader.at  # the RESERVED line's arrival
        client.delete(job)  # waits for DELETED
        tally.acked()
    client.close()


def idle_main(url: str, index: int, n: int, results: Any, stop: Any) -> None:
    """Hold ``n`` subscribed raw WebSocket workers open; the library answers the broker's
    keepalive pings. Reports how many are still open when told to stop."""
    try:
        raise_nofile()
        asyncio.run(hold_idle(url, index, n, results, stop))
    except BaseException:
        results.put(("error", index, traceback.format_exc()))


async def hold_idle(url: str, index: int, n: int, results: Any, stop: Any) -> None:
    from websockets.asyncio.client import connect
    from websockets.protocol import State

    gate = asyncio.Semaphore(25)
    conns: list[Any] = []

    async def one(i: int) -> None:
        async with gate:
            for attempt in range(10):
                try:
                    ws = await connect(url, compression=None, ping_interval=None, open_timeout=60)
                    break
                except OSError:
                    await asyncio.sleep(0.1 * (attempt + 1))
            else:
                raise RuntimeError("cannot connect")
            frame = {"op": "subscribe", "rid": 1, "worker_id": f"idle-{index}-{i}",
                     "queues": [QUEUE], "prefetch": PREFETCH}  # fmt: skip
            await ws.send(orjson.dumps(frame), text=True)
            reply = orjson.loads(await ws.recv())
            assert reply.get("ok"), reply
            conns.append(ws)

    await asyncio.gather(*(one(i) for i in range(n)))
    results.put(("ready", index, len(conns)))
    await wait_event(stop)
    alive = sum(1 for ws in conns if ws.state is State.OPEN)
    results.put(("result", index, {"alive": alive}))


# -- broker-side checks (depth, reset) from the harness process ----------------------------


async def conveyor_remaining(url: str) -> int:
    from websockets.asyncio.client import connect

    async with connect(url, max_size=None, compression=None) as ws:
        await ws.send(orjson.dumps({"op": "stats", "rid": 1}), text=True)
        reply = orjson.loads(await ws.recv())
    assert reply["ok"], reply
    q = reply["queues"].get(QUEUE)
    return 0 if q is None else int(q["ready"] + q["scheduled"] + q["processing"])


def probe(name: str, url: str) -> None:
    """Skip at once, with the reason, when nothing listens at the URL's host and port."""
    host, port = url.split("@")[-1].split("//")[-1].split("/")[0].rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), 3).close()
    except OSError as exc:
        raise Skip(f"{name} is not reachable at {host}:{port}: {exc}") from None


async def rabbit_check() -> str:
    try:
        import aio_pika
    except ImportError as exc:
        raise Skip("aio-pika is not installed: pip install -r bench/requirements.txt") from exc
    probe("RabbitMQ", RABBIT_URL)
    try:
        connection = await aio_pika.connect(RABBIT_URL, timeout=5)
    except Exception as exc:
        raise Skip(f"RabbitMQ is not reachable at {RABBIT_URL}: {exc!r}") from exc
    underlay = connection.transport.connection if connection.transport else None
    assert underlay is not None, "aio-pika connected without a transport"
    version = underlay.server_properties.get("version", "?")
    if isinstance(version, bytes):
        version = version.decode(errors="replace")
    await connection.close()
    return f"RabbitMQ {version}, aio-pika {importlib.metadata.version('aio-pika')}"


async def rabbit_reset(create: bool) -> None:
    import aio_pika

    async with await aio_pika.connect(RABBIT_URL, timeout=10) as connection:
        channel = await connection.channel()
        await channel.queue_delete(RABBIT_QUEUE)
        if create:
            await channel.declare_queue(RABBIT_QUEUE, durable=True)


async def rabbit_remaining() -> int:
    import aio_pika

    async with await aio_pika.connect(RABBIT_URL, timeout=10) as connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(RABBIT_QUEUE, durable=True, passive=True)
        # Unacked messages are not counted, but every worker has closed its channel by
        # now, which puts whatever it had not acked back in the queue.
        return int(queue.declaration_result.message_count or 0)


async def nats_connect() -> Any:
    """A connection for the harness's own checks: no reconnecting, bounded in time (nats-py
    otherwise keeps retrying a server that is not there)."""
    import nats

    async def quiet(exc: Exception) -> None:
        pass  # a failure to connect is reported by the caller

    async with asyncio.timeout(10):
        return await nats.connect(
            NATS_URL, connect_timeout=5, allow_reconnect=False, max_reconnect_attempts=0,
            error_cb=quiet,
        )  # fmt: skip


async def nats_check() -> str:
    try:
        import nats  # noqa: F401 (is it installed?)
    except ImportError as exc:
        raise Skip("nats-py is not installed: pip install -r bench/requirements.txt") from exc
    probe("NATS", NATS_URL)
    try:
        nc = await nats_connect()
    except Exception as exc:
        raise Skip(f"NATS is not reachable at {NATS_URL}: {exc!r}") from exc
    try:
        await nc.jetstream().account_info()
        version = nc.connected_server_version
        version = f"{version.major}.{version.minor}.{version.patch}"
    except Exception as exc:
        raise Skip(f"NATS at {NATS_URL} answers but JetStream is not enabled: {exc!r}") from exc
    finally:
        await nc.close()
    return f"NATS server {version}, nats-py {importlib.metadata.version('nats-py')}"


async def nats_reset(create: bool, storage: str = "file") -> None:
    from nats.js.api import RetentionPolicy, StorageType, StreamConfig
    from nats.js.errors import NotFoundError

    nc = await nats_connect()
    try:
        js = nc.jetstream()
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(NATS_STREAM)
        if create:
            config = StreamConfig(
                name=NATS_STREAM, subjects=[NATS_SUBJECT], storage=StorageType(storage),
                retention=RetentionPolicy.WORK_QUEUE,
            )  # fmt: skip
            await js.add_stream(config)
    finally:
        await nc.close()


async def nats_add_consumer(max_ack_pending: int) -> None:
    from nats.js.api import AckPolicy, ConsumerConfig

    nc = await nats_connect()
    try:
        config = ConsumerConfig(
            durable_name=NATS_CONSUMER, deliver_subject=f"_bench.deliver.{NATS_CONSUMER}",
            deliver_group=NATS_CONSUMER, ack_policy=AckPolicy.EXPLICIT,
            max_ack_pending=max_ack_pending, ack_wait=120, filter_subject=NATS_SUBJECT,
        )  # fmt: skip
        await nc.jetstream().add_consumer(NATS_STREAM, config)
    finally:
        await nc.close()


async def nats_remaining() -> int:

    nc = await nats_connect()
    try:
        info = await nc.jetstream().stream_info(NATS_STREAM)
        return int(info.state.messages)  # a work-queue stream drops a message when acked
    finally:
        await nc.close()


def beanstalkd_check() -> str:
    try:
        import greenstalk  # noqa: F401
    except ImportError as exc:
        raise Skip("greenstalk is not installed: pip install -r bench/requirements.txt") from exc
    if shutil.which("beanstalkd") is None:
        if os.geteuid() == 0 and shutil.which("apt-get"):
            print("beanstalkd is missing: apt-get install -y beanstalkd", flush=True)
            subprocess.run(
                ["apt-get", "install", "-y", "beanstalkd"], check=False,
                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, timeout=300,
            )  # fmt: skip
        if shutil.which("beanstalkd") is None:
            raise Skip("beanstalkd is not installed (apt-get install -y beanstalkd, as root)")
    version = subprocess.run(["beanstalkd", "-v"], capture_output=True, text=True).stdout
    return f"{version.strip()}, greenstalk {importlib.metadata.version('greenstalk')}"


def beanstalkd_remaining(address: str) -> int:
    import greenstalk

    host, port = address.rsplit(":", 1)
    with greenstalk.Client((host, int(port)), use=TUBE) as client:
        try:
            stats = client.stats_tube(TUBE)
        except greenstalk.NotFoundError:
            return 0  # the tube goes away once empty and unwatched
    keys = ("current-jobs-ready", "current-jobs-reserved", "current-jobs-delayed",
            "current-jobs-buried")  # fmt: skip
    counts: dict[str, Any] = dict(stats)
    return sum(int(counts[k]) for k in keys)


# -- one measurement ----------------------------------------------------------------------


class Run:
    """Collects ready/result/error messages from child processes, within a deadline."""

    def __init__(self, seconds: float) -> None:
        self.results = CTX.Queue()
        self.deadline = time.monotonic() + seconds
        self.seconds = seconds

    def left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Failed(f"timed out after {self.seconds:.0f} s")
        return left

    def collect(self, kind: str, expected: int) -> dict[int, Any]:
        got: dict[int, Any] = {}
        while len(got) < expected:
            left = self.left()
            try:
                what, index, value = self.results.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if what == "error":
                raise Failed(f"a client process failed:\n{value}")
            if what != kind:
                raise Failed(f"expected {kind}, got {what} from {index}")
            got[index] = value
        return got

    def until(self, done: Callable[[], bool], what: str) -> None:
        while not done():
            try:
                self.left()
            except Failed as exc:
                raise Failed(f"{exc} ({what})") from None
            time.sleep(0.005)


def fill(system: System, target: Target, n: int, seconds: float) -> None:
    """Put ``n`` jobs in the queue (untimed), from a publisher process; check the depth."""
    run = Run(seconds)
    go = CTX.Event()
    count = CTX.RawValue("q", 0)
    proc = spawn(publisher_main, target, "fill", n, FILL_WINDOW, 0.0, run.results, go, count)
    try:
        run.collect("ready", 1)
        go.set()
        run.collect("result", 1)
    finally:
        stop_process(proc)
    depth = system.remaining()
    if depth != n:
        raise Failed(f"filled {n:,} jobs but the broker holds {depth:,}")


def measure_enqueue(system: System, n: int, seconds: float, window: int = IN_FLIGHT) -> float:
    """Jobs/s of one publisher keeping ``window`` enqueues in flight (1: one awaited call
    at a time, so the figure is the inverse of the round trip)."""
    target = system.start()
    try:
        run = Run(seconds)
        go = CTX.Event()
        count = CTX.RawValue("q", 0)
        proc = spawn(publisher_main, target, "timed", n, window, 0.0, run.results, go, count)
        try:
            run.collect("ready", 1)
            go.set()
            out = run.collect("result", 1)[0]
        finally:
            stop_process(proc)
        if out["accepted"] != n:
            raise Failed(f"{out['accepted']:,} of {n:,} accepted")
        depth = system.remaining()
        if depth != n:
            raise Failed(f"{n:,} accepted but the broker holds {depth:,}")
        return float(n / (out["end"] - out["start"]))
    finally:
        system.stop()


def measure_serial(system: System, n: int, seconds: float) -> float:
    """Enqueue with one awaited call at a time: the inverse of a round trip."""
    return measure_enqueue(system, n, seconds, window=1)


def run_workers(
    system: System,
    target: Target,
    workers: int,
    n: int,
    seconds: float,
    publish_rate: float = 0.0,
) -> tuple[float, list[dict[str, Any]]]:
    """Start the worker processes; "go"; optionally publish at a steady rate meanwhile; wait
    until ``n`` acks; stop them. Returns the go time and each worker's tally."""
    system.prepare_workers(workers)
    run = Run(seconds)
    go, stop = CTX.Event(), CTX.Event()
    latency = publish_rate > 0
    counts = [CTX.RawValue("q", 0) for _ in range(workers)]
    procs = [
        spawn(worker_main, target, i, latency, run.results, go, stop, counts[i])
        for i in range(workers)
    ]
    publisher = None
    try:
        run.collect("ready", workers)
        if latency:
            published = CTX.RawValue("q", 0)
            publisher = spawn(
                publisher_main, target, "rate", n, IN_FLIGHT, publish_rate, run.results, go,
                published,
            )  # fmt: skip
            run.collect("ready", 1)
        started = time.monotonic()
        go.set()
        run.until(
            lambda: sum(c.value for c in counts) >= n, f"{sum(c.value for c in counts)} acked"
        )
        if publisher is not None:
            run.collect("result", 1)
        time.sleep(0.2)  # a job delivered twice would show up now
        stop.set()
        tallies = list(run.collect("result", workers).values())
    finally:
        for proc in [*procs, publisher]:
            if proc is not None:
                stop_process(proc)
    seqs = [seq for tally in tallies for seq in tally["seqs"]]
    unique = len(set(seqs))
    if unique != n or len(seqs) != n:
        raise Failed(f"{n:,} jobs: {unique:,} handled, {len(seqs) - unique:,} twice")
    left = system.remaining()
    deadline = time.monotonic() + 5  # fire-and-forget acks (RabbitMQ, JetStream) may lag
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = system.remaining()
    if left:
        raise Failed(f"all {n:,} handled, but the broker still holds {left:,}")
    return started, tallies


def measure_drain(system: System, n: int, workers: int, seconds: float) -> float:
    target = system.start()
    try:
        fill(system, target, n, seconds)
        started, tallies = run_workers(system, target, workers, n, seconds)
        return n / (float(max(t["last_ack"] for t in tallies)) - started)
    finally:
        system.stop()


def measure_latency(system: System, rate: float, duration: float, seconds: float) -> list[float]:
    target = system.start()
    try:
        n = int(rate * duration)
        _, tallies = run_workers(system, target, 2, n, seconds, publish_rate=rate)
        lat = sorted(x for t in tallies for x in t["lat"])
        return [quantile(lat, 0.5) * 1000, quantile(lat, 0.99) * 1000, lat[-1] * 1000]
    finally:
        system.stop()


def quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, math.ceil(q * len(values)) - 1)]


# -- cost ---------------------------------------------------------------------------------


def measure_pending_rss(system: System, n: int, seconds: float) -> dict[str, float]:
    """Broker RSS (MB) before and after ``n`` pending jobs. For the shared peers the
    process also holds whatever else it serves, so the difference is the figure."""
    target = system.start()
    try:
        pid = system.pid()
        if pid is None:
            raise Skip("broker process not found")
        before = rss_bytes(pid)
        fill(system, target, n, seconds)
        time.sleep(2)
        after = rss_bytes(pid)
        mb = 2**20
        return {"pid": pid, "before": before / mb, "after": after / mb,
                "growth": (after - before) / mb}  # fmt: skip
    finally:
        system.stop()


def measure_idle(
    system: System, n: int, procs: int, window: float, seconds: float
) -> dict[str, Any]:
    """Conveyor RSS and CPU with ``n`` idle subscribed workers (keepalive pings every 10 s,
    so each connection is pinged once in the 10 s window)."""
    tmp = Path(tempfile.mkdtemp(prefix="conveyor-idle-"))
    raise_nofile()  # the broker inherits the harness's limit
    proc, url = start_conveyor(system.store, system.sync, tmp, "--ping-interval", "10")
    clients = []
    try:
        before = rss_bytes(proc.pid)
        run = Run(seconds)
        stop = CTX.Event()
        share = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
        t0 = time.monotonic()
        clients = [spawn(idle_main, url, i, share[i], run.results, stop) for i in range(procs)]
        connected = sum(run.collect("ready", procs).values())
        ramp = time.monotonic() - t0
        time.sleep(2)
        rss0, cpu0, w0 = rss_bytes(proc.pid), cpu_seconds(proc.pid), time.monotonic()
        time.sleep(window)
        rss1, cpu1, w1 = rss_bytes(proc.pid), cpu_seconds(proc.pid), time.monotonic()
        stop.set()
        alive = sum(r["alive"] for r in run.collect("result", procs).values())
        if proc.poll() is not None:
            raise Failed("the broker died")
        return {
            "connected": connected, "alive": alive, "ramp_s": ramp,
            "rss_before": before / 2**20, "rss": max(rss0, rss1) / 2**20,
            "cpu_pct": 100 * (cpu1 - cpu0) / (w1 - w0), "window": w1 - w0,
        }  # fmt: skip
    finally:
        for client in clients:
            stop_process(client)
        stop_popen(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def measure_claim_cost(large: int, rounds: int, seconds: float) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, str(conveyor_root() / "bench" / "engine_cost.py"), "--large", str(large),
         "--rounds", str(rounds)],
        cwd=conveyor_root(), capture_output=True, text=True, timeout=seconds,
    )  # fmt: skip
    if out.returncode != 0:
        raise Failed(f"engine_cost.py failed: {out.stderr[-1000:]}")
    m = re.search(r"^claim\s+(\d+) ns\s+(\d+) ns\s+([\d.]+)x", out.stdout, re.M)
    if m is None:
        raise Failed(f"cannot read engine_cost.py's output:\n{out.stdout}")
    per_job = re.search(r"memory per pending job .*: (\d+) bytes", out.stdout)
    return {
        "small_ns": float(m[1]), "large_ns": float(m[2]), "ratio": float(m[3]),
        "bytes_per_job": float(per_job[1]) if per_job else float("nan"),
    }  # fmt: skip


# -- reporting ----------------------------------------------------------------------------

Results = dict[str, dict[str, list[float | None]]]  # metric -> system -> value per round


def say(text: str = "") -> None:
    print(text, flush=True)


def fmt(value: float | None, unit: str) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:,.2f}" if unit == "ms" else f"{value:,.0f}"


def summary(values: list[float | None], unit: str) -> str:
    ok = [v for v in values if v is not None]
    if not ok:
        return "failed"
    spread = f"({fmt(min(ok), unit)}-{fmt(max(ok), unit)})" if len(ok) > 1 else ""
    failed = f" {len(values) - len(ok)} failed" if len(ok) < len(values) else ""
    return f"{fmt(statistics.median(ok), unit):>10} {spread:<22}{failed}"


def ratios(conv: list[float | None], peer: list[float | None]) -> list[float]:
    """Conveyor / peer, per round in which both completed."""
    if len(conv) != len(peer):
        return []
    return [c / p for c, p in zip(conv, peer, strict=True) if c is not None and p]


def median_ratio(results: Results, metric: str, conv: str, peer: str) -> float | None:
    per_round = ratios(results[metric].get(conv, []), results[metric].get(peer, []))
    return statistics.median(per_round) if per_round else None


METRICS = [
    ("enqueue", "enqueue, jobs/s (1 publisher, 64 in flight, durable acceptance)", "jobs/s"),
    ("enqueue1", "enqueue, jobs/s (1 publisher, one awaited call at a time)", "jobs/s"),
    ("drain1", "drain, jobs/s (1 worker process, prefetch {prefetch})", "jobs/s"),
    ("drain4", "drain, jobs/s (4 worker processes, prefetch {prefetch} each)", "jobs/s"),
    ("lat_p50", "latency p50, ms (1,000 jobs/s, 2 workers)", "ms"),
    ("lat_p99", "latency p99, ms", "ms"),
    ("lat_max", "latency max, ms", "ms"),
]


def print_results(results: Results, names: list[str], runs: int) -> None:
    conveyors = [n for n in names if n.startswith("conveyor")]
    peers = [n for n in names if not n.startswith("conveyor")]
    say(f"\n== results: median (min-max) of {runs} round(s) ==")
    for metric, title, unit in METRICS:
        say(f"\n{title.format(prefetch=PREFETCH)}")
        for name in names:
            if name in results[metric]:
                say(f"  {name:<24}{summary(results[metric][name], unit)}")
    if not peers or not conveyors:
        return
    say("\n== Conveyor / peer, median of the per-round ratios ==")
    say("(throughput: above 1 means Conveyor is faster; latency: below 1 means lower)")
    header = "".join(f"{p:>19}" for p in peers)
    for metric, _, _ in METRICS:
        say(f"\n{metric:<24}{header}")
        for conv in conveyors:
            cells = []
            for peer in peers:
                r = median_ratio(results, metric, conv, peer)
                cells.append(f"{_r(r):>19}")
            say(f"  {conv:<22}{''.join(cells)}")


def verdict(ok: bool | None) -> str:
    return "n/a (missing data)" if ok is None else ("MET" if ok else "MISSED")


def print_targets(results: Results, names: list[str], cost: dict[str, Any], pending: int) -> None:
    """The targets of docs/benchmarks.md, judged on median per-round ratios from this run."""
    peers = [n for n in names if not n.startswith("conveyor")]
    say("\n== targets, judged on this run's median per-round ratios ==")

    def best(metric: str, conv: str, among: list[str], lower: bool = False) -> tuple[Any, Any]:
        """Conveyor's ratio to the best of ``among``: the one it compares worst against."""
        cands = [(median_ratio(results, metric, conv, p), p) for p in among if p in names]
        cands = [(r, p) for r, p in cands if r is not None]
        if conv not in names or not cands:
            return None, None
        return max(cands) if lower else min(cands)

    def spread(metric: str, conv: str, peer: str) -> str:
        """The per-round ratios' min-max, when there was more than one round."""
        per_round = ratios(results[metric].get(conv, []), results[metric].get(peer, []))
        if len(per_round) < 2:
            return ""
        return f" ({_r(min(per_round))}-{_r(max(per_round))} over {len(per_round)} rounds)"

    def line(text: str, ok: bool | None, detail: str) -> None:
        if detail.endswith("vs None"):
            return  # that Conveyor system or its peers were not run
        say(f"  {text}: {verdict(ok)} ({detail})")

    for metric in ("drain1", "drain4"):
        r, p = best(metric, "conveyor-memory", peers)
        line(f"{metric}: memory >= 1.5x the best peer", None if r is None else r >= 1.5,
             f"{_r(r)} vs {p}")  # fmt: skip
        r, p = best(metric, "conveyor-sqlite", DURABLE_PEERS)
        line(f"{metric}: sqlite >= the best durable peer", None if r is None else r >= 1.0,
             f"{_r(r)} vs {p}")  # fmt: skip
        r, p = best(metric, "conveyor-sqlite", FSYNC_PEERS)
        line(f"  (the same against the peers that fsync: {', '.join(FSYNC_PEERS)})",
             None if r is None else r >= 1.0, f"{_r(r)} vs {p}")  # fmt: skip
    for conv, among in (
        ("conveyor-memory", ["beanstalkd"]),
        ("conveyor-sqlite", ["rabbitmq", "beanstalkd-binlog"]),
        ("conveyor-sqlite-normal", ["nats"]),
        ("conveyor-memory-sdk", ["beanstalkd"]),  # what users run (--sdk-worker)
        ("conveyor-sqlite-sdk", ["rabbitmq", "beanstalkd-binlog"]),
    ):
        r, p = best("enqueue", conv, among)
        line(f"enqueue: {conv} >= the best peer of its durability",
             None if r is None else r >= 1.0, f"{_r(r)} vs {p}")  # fmt: skip
    # The SDK's rows too (--sdk-worker): what users run, publishing and working.
    for conv in ("conveyor-memory", "conveyor-sqlite", *SDK_SYSTEMS):
        vals = [v for v in results["lat_p99"].get(conv, []) if v is not None]
        r, p = best("lat_p99", conv, peers, lower=True)
        p99 = statistics.median(vals) if vals else None
        ok = None if r is None or p99 is None else (r <= 1.0 and p99 < 3.0)
        line(f"latency: {conv} p99 <= the best peer's and < 3 ms", ok,
             f"p99 {fmt(p99, 'ms')} ms, {_r(r)} vs {p}")  # fmt: skip
    for conv in ("conveyor-memory", "conveyor-sqlite", *SDK_SYSTEMS):
        if conv not in cost.get("pending", {}):
            continue
        rss = cost["pending"][conv]
        mb = rss["after"] if isinstance(rss, dict) else None
        how = " (published through the SDK, each with its key)" if conv in SDK_SYSTEMS else ""
        line(f"{pending:,} pending jobs in < 500 MB of RSS: {conv}{how}",
             None if mb is None else mb < 500, f"{fmt(mb, 'MB')} MB")  # fmt: skip
    # What users run: the SDK's Client and Worker against JetStream through nats-py, every
    # client on the same loop; the in-memory store against a memory stream, the durable
    # default against a file stream.
    say("  -- the SDK's rows against NATS JetStream --")
    for conv, peer, drain_min in (
        ("conveyor-memory-sdk", "nats-memory", 1.5),
        ("conveyor-sqlite-sdk", "nats", 1.0),
    ):
        for metric in ("drain1", "drain4"):
            r, p = best(metric, conv, [peer])
            line(f"{metric}: {conv} >= {drain_min:g}x {peer}",
                 None if r is None else r >= drain_min,
                 f"{_r(r)}{spread(metric, conv, peer)} vs {p}")  # fmt: skip
        r, p = best("enqueue1", conv, [peer])
        line(f"enqueue, one awaited call at a time: {conv} >= {peer}",
             None if r is None else r >= 1.0,
             f"{_r(r)}{spread('enqueue1', conv, peer)} vs {p}")  # fmt: skip
        vals = [v for v in results["lat_p99"].get(conv, []) if v is not None]
        p99 = statistics.median(vals) if vals else None
        r, p = best("lat_p99", conv, ["nats-memory"], lower=True)
        ok = None if r is None or p99 is None else (r <= 1.0 and p99 < 1.0)
        line(f"latency: {conv} p99 <= nats-memory's and < 1 ms", ok,
             f"p99 {fmt(p99, 'ms')} ms, {_r(r)} vs {p}")  # fmt: skip
    for conv, idle in cost.get("idle", {}).items():
        if isinstance(idle, dict):
            line(f"{idle['wanted']:,} idle workers held with keepalive: {conv}",
                 idle["alive"] == idle["wanted"],
                 f"{idle['alive']:,} open at the end, {idle['cpu_pct']:.1f}% CPU, "
                 f"{idle['rss']:.0f} MB")  # fmt: skip


def _r(r: float | None) -> str:
    if r is None:
        return "-"
    return f"{r:.2f}x" if r >= 0.1 else f"{r:.2g}x"


# -- main ---------------------------------------------------------------------------------


def machine() -> list[str]:
    mem = next(
        int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )  # fmt: skip
    model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")), platform.processor(),
    )  # fmt: skip
    return [
        f"machine: {os.cpu_count()} cores ({model}), {mem / 2**20:.1f} GiB RAM, "
        f"{platform.system()} {platform.release()}; {load()}",
        f"python: {platform.python_version()} ({sys.executable})",
        f"clients: websockets {importlib.metadata.version('websockets')}, "
        f"orjson {importlib.metadata.version('orjson')}",
    ]


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} (other work on the machine)"


def busy_cores(window: float = 0.25) -> float:
    """Cores in use over ``window`` seconds, whoever uses them (``/proc/stat``)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        idle = values[3] + values[4]  # idle + iowait
        return sum(values) - idle, idle

    busy0, idle0 = sample()
    time.sleep(window)
    busy1, idle1 = sample()
    total = (busy1 - busy0) + (idle1 - idle0)
    return (os.cpu_count() or 1) * (busy1 - busy0) / total if total else 0.0


def settle(limit: float = 15.0, quiet: float = 0.3) -> None:
    """Wait (at most ``limit`` s) until fewer than ``quiet`` cores are busy, so that no
    measurement starts while the one before it is still being cleaned up after (RabbitMQ
    deleting a queue of persistent messages, say). Every system gets the same wait."""
    if not os.path.exists("/proc/stat"):
        return
    start = time.monotonic()
    while (cores := busy_cores()) >= quiet:
        if time.monotonic() - start > limit:
            say(f"  (the machine stayed busy: {cores:.1f} cores in use; measuring anyway)")
            return
    waited = time.monotonic() - start
    if waited > 1.0:
        say(f"  (waited {waited:.1f} s for the machine to settle)")


def timed_round(label: str, fn: Callable[[], Any]) -> Any:
    settle()
    start = time.monotonic()
    try:
        value = fn()
    except Exception as exc:
        say(f"  {label}: FAILED: {type(exc).__name__}: {exc}")
        return None
    say(f"  {label}: {value_text(value)}  [{time.monotonic() - start:.1f} s]")
    return value


def value_text(value: Any) -> str:
    if isinstance(value, list):
        return "p50 {:.2f} ms, p99 {:.2f} ms, max {:.2f} ms".format(*value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {v:,.1f}" if isinstance(v, float) else f"{k} {v}"
                         for k, v in value.items())  # fmt: skip
    return f"{value:,.0f} jobs/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="N for enqueue and drain")
    parser.add_argument("--serial-jobs", type=int, default=20_000,
                        help="N for the enqueue of one awaited call at a time")  # fmt: skip
    parser.add_argument("--runs", type=int, default=None,
                        help="rounds of every workload (3; --quick: 1; 0: cost only)")  # fmt: skip
    parser.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                        help=f"comma-separated, of: {', '.join(all_systems())}")  # fmt: skip
    parser.add_argument("--sdk-worker", action="store_true",
                        help="also run Conveyor with the SDK's Client and Worker")  # fmt: skip
    parser.add_argument("--loop", choices=["auto", "uvloop", "asyncio"], default="auto",
                        help="every client's event loop, publishers and workers of every "
                        "system (auto, as `conveyor worker`: uvloop when installed)")  # fmt: skip
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: 2,000 jobs, 1 round, small cost figures")  # fmt: skip
    parser.add_argument("--rate", type=float, default=1000.0, help="latency: jobs/s")
    parser.add_argument("--duration", type=float, default=5.0, help="latency: seconds")
    parser.add_argument("--pending", type=int, default=1_000_000, help="cost: pending jobs")
    parser.add_argument("--idle", type=int, default=10_000, help="cost: idle workers")
    parser.add_argument("--idle-procs", type=int, default=4, help="client processes for those")
    parser.add_argument("--cost", default="pending,idle,claim",
                        help="which cost figures: pending,idle,claim, or none")  # fmt: skip
    parser.add_argument("--no-peer-cost", action="store_true",
                        help="pending-job RSS for Conveyor only")  # fmt: skip
    parser.add_argument(
        "--snapshot",
        action="store_true",
        help="run Conveyor from a copy of HEAD (git archive), not the working tree, "
        "so that edits made during the run cannot mix versions",
    )
    parser.add_argument("--prefetch", type=int, default=64,
                        help="each worker's window of unacked jobs, for every system")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=180.0,
                        help="seconds allowed for one measurement")  # fmt: skip
    args = parser.parse_args()
    global PREFETCH
    PREFETCH = args.prefetch
    os.environ["BENCH_PREFETCH"] = str(args.prefetch)
    engine_large, engine_rounds = 1_000_000, 15
    if args.runs is None:
        args.runs = 1 if args.quick else 3
    if args.quick:
        args.jobs, args.duration = min(args.jobs, 2_000), 2.0
        args.serial_jobs = min(args.serial_jobs, 2_000)
        args.pending, args.idle = min(args.pending, 100_000), min(args.idle, 1_000)
        engine_large, engine_rounds = 100_000, 5
    known = all_systems()
    wanted = [s.strip() for s in args.systems.split(",") if s.strip()]
    if args.sdk_worker:
        wanted += [s for s in SDK_SYSTEMS if s not in wanted]
    unknown = [s for s in wanted if s not in known]
    if unknown:
        parser.error(f"unknown system(s): {', '.join(unknown)}")
    raise_nofile()
    snapshot = take_snapshot() if args.snapshot else None
    LOOP[0] = args.loop

    began = time.monotonic()
    say(f"bench/compare.py  {time.strftime('%Y-%m-%d %H:%M:%S')}")
    for line in machine():
        say(line)
    size = len(job_body(10_000, time.monotonic()))
    say(
        f"workload: {args.jobs:,} jobs of {size} bytes, {args.runs} round(s); "
        f"latency {args.rate:,.0f} jobs/s for {args.duration:g} s; "
        f"one awaited enqueue at a time: {args.serial_jobs:,} jobs; "
        f"every client on {loop_name(args.loop)}"
    )
    systems: list[System] = []
    for name in wanted:
        system = known[name]
        try:
            version = system.check()
        except Skip as exc:
            say(f"SKIPPED {name}: {exc}")
            continue
        say(f"system {name:<24} durability {system.durability:<9} {version}")
        systems.append(system)
    names = [s.name for s in systems]

    results: Results = {metric: {} for metric, _, _ in METRICS}
    try:
        workloads: list[tuple[str, Callable[[System], Any]]] = [
            ("enqueue", lambda s: measure_enqueue(s, args.jobs, args.timeout)),
            ("enqueue1", lambda s: measure_serial(s, args.serial_jobs, args.timeout)),
            ("drain1", lambda s: measure_drain(s, args.jobs, 1, args.timeout)),
            ("drain4", lambda s: measure_drain(s, args.jobs, 4, args.timeout)),
            ("latency", lambda s: measure_latency(s, args.rate, args.duration, args.timeout)),
        ]
        for r in range(1, args.runs + 1):
            say(f"\n-- round {r} of {args.runs} --")
            # Workload by workload, the systems one after the other (in the opposite order
            # every other round): the figures a ratio divides are taken minutes apart at
            # most, so that a shared machine's load, which drifts, weighs on both alike.
            order = systems if r % 2 else systems[::-1]
            for workload, fn in workloads:
                say(f"{workload}")
                for system in order:
                    value = timed_round(system.name, functools.partial(fn, system))
                    if workload != "latency":
                        results[workload].setdefault(system.name, []).append(value)
                        continue
                    for i, metric in enumerate(("lat_p50", "lat_p99", "lat_max")):
                        results[metric].setdefault(system.name, []).append(
                            value[i] if value else None
                        )
        if args.runs:
            print_results(results, names, args.runs)
        cost: dict[str, Any] = {}
        parts = {p.strip() for p in args.cost.split(",")} - {"none", ""}
        if parts:
            cost = run_cost(systems, args, parts, engine_large, engine_rounds)
        print_targets(results, names, cost, args.pending)
    finally:
        for system in systems:
            with contextlib.suppress(Exception):
                system.stop()
        stop_all()
        if snapshot is not None:
            shutil.rmtree(snapshot, ignore_errors=True)
    if any(s.conveyor for s in systems):
        say(f"\nconveyor at the end of the run: {conveyor_build()}")
    say(f"\ntotal time {time.monotonic() - began:.0f} s; {load()}")


def run_cost(
    systems: list[System], args: Any, parts: set[str], engine_large: int, rounds_: int
) -> dict[str, Any]:
    """The cost figures, once each (not per round). Conveyor with --sync normal holds the
    same table as the default, so it is left out; the SDK's rows publish through the SDK,
    each job with its idempotency key (what users' jobs carry)."""
    cost: dict[str, Any] = {"pending": {}, "idle": {}}
    long = max(args.timeout, 600.0)
    say("\n== cost (once, not per round) ==")
    if "pending" in parts:
        say(f"broker RSS with {args.pending:,} pending jobs of ~100 bytes, MB (for the shared "
            "RabbitMQ and NATS processes, the growth is the figure)")  # fmt: skip
        for system in systems:
            # (The SDK's rows fill through Client.enqueue_many: every job with its key.)
            if system.sync != "full" or (args.no_peer_cost and not system.conveyor):
                continue
            value = timed_round(
                system.name, functools.partial(measure_pending_rss, system, args.pending, long)
            )
            cost["pending"][system.name] = value
    if "idle" in parts:
        say(f"\nConveyor with {args.idle:,} idle subscribed raw WebSocket workers from "
            f"{args.idle_procs} processes (keepalive ping every 10 s; RSS and CPU over 10 s; "
            "RabbitMQ, NATS and beanstalkd not measured)")  # fmt: skip
        for system in systems:
            if not system.conveyor or system.sdk or system.sync != "full":
                continue
            value = timed_round(
                system.name,
                functools.partial(measure_idle, system, args.idle, args.idle_procs, 10.0, long),
            )
            if isinstance(value, dict):
                value["wanted"] = args.idle
            cost["idle"][system.name] = value
    if "claim" in parts:
        say(f"\nengine claim cost, ns per call, at depth 1,000 vs {engine_large:,} "
            "(bench/engine_cost.py, median of its rounds)")  # fmt: skip
        cost["claim"] = timed_round(
            "claim", lambda: measure_claim_cost(engine_large, rounds_, long)
        )
    return cost


if __name__ == "__main__":
    main()
