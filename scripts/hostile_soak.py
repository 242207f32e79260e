"""Hostile soak: a durable broker under a flood of hostile frames, beside normal traffic.

    .venv/bin/python scripts/hostile_soak.py [--frames 100000] [--connections 50]
        [--duration 600] [--seed 1]

A real ``conveyor serve --store sqlite`` process (in a temp dir) is started the way
``scripts/crash_soak.py`` starts it. On one asyncio loop:

1. quiet phase: SDK publishers (``Client``, enqueues with keys) and an SDK ``Worker``
   (acking every job) run alone for ``--quiet`` enqueues;
2. hostile phase: the same normal traffic, while ``--connections`` raw connections (in a
   second process) send
   ``--frames`` hostile frames in all (garbage, bad JSON, lone surrogates, huge numbers,
   deep nesting, binary, unknown ops, real ops with bad arguments, frames over
   ``max_frame_bytes``), and a few more connections pipeline ``get_job`` of a big job
   without reading their replies. Each hostile connection reads what the broker sends
   and reconnects when it is closed (1008 for garbage in a row, 1009 for oversize).

The hostile connections run in a process of their own, so that the normal clients'
latency measures the broker, not a client loop busy with the hostile ones.

The run stops by itself: when the frames are sent, or at ``--duration`` seconds. It
reports whether the broker stayed up (and its exit status on SIGTERM), answered
enqueues lost (ids the SDK got that the worker never saw and ``get_job`` does not
find), the broker's RSS (start, max, end), errors in its log, and the normal
publishers' enqueue latency in the hostile phase against the quiet one. The exit status
is 1 when the broker stopped, lost a job or logged an error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from crash_soak import BrokerProcess, free_port, working
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from conveyor.sdk import Client, ConveyorError, Job, Worker
from conveyor.sdk._wire import OPS

QUEUE = "normal"
BIG_QUEUE = "big"
MAX_FRAME_BYTES = 1 << 20  # the broker's default max_frame_bytes
BIG_PAYLOAD = "x" * (256 << 10)  # the job the stalling connections ask for
RSS_EVERY_S = 0.5
BURST = 8  # hostile frames a connection sends before it waits for their replies
LAST = "last"  # the rid of the ping that ends a burst
DRAIN_S = 60.0  # how long the worker may take to finish the answered jobs at the end


# ------------------------------------------------------------------------ hostile frames

Frame = str | bytes


def _request(**members: Any) -> str:
    return json.dumps(members)  # writes NaN and integers of any size, as a sloppy peer would


def garbage(rng: random.Random) -> Frame:
    return "".join(rng.choice("{}[]:,\"'abc 0\\") for _ in range(rng.randint(1, 80)))


def bad_json(rng: random.Random) -> Frame:
    return rng.choice(
        [
            '{"op": "ping", "rid": 1} x',
            '{"op": "enqueue", "rid": 1, "queue": "q", "payload": NaN}',
            '{"op": "ping", "rid": 1,}',
            "\ufeff" + '{"op": "ping"}',
            '{"op": "ping" "rid": 1}',
        ]
    )


def surrogates(rng: random.Random) -> Frame:
    where = rng.choice(['"key": "\\ud800"', '"payload": "a\\udfff"', '"\\udc00": 1'])
    return '{"op": "enqueue", "rid": 1, "queue": "hostile", "payload": 1, ' + where + "}"


def huge_number(rng: random.Random) -> Frame:
    number = rng.choice([str(2**63), str(2**64), "9" * 400, "1e400", "-0.0", str(-(2**63) - 1)])
    name = rng.choice(["rid", "priority", "max_attempts", "delay_s", "payload"])
    return f'{{"op": "enqueue", "rid": 2, "queue": "hostile", "payload": 1, "{name}": {number}}}'


def deep_nesting(rng: random.Random) -> Frame:
    depth = rng.choice([254, 255, 1023, 1025, 5000])
    payload = "[" * depth + "]" * depth
    return f'{{"op": "enqueue", "rid": 3, "queue": "hostile", "payload": {payload}}}'


def binary(rng: random.Random) -> Frame:
    return rng.randbytes(rng.randint(0, 64))


def bad_op(rng: random.Random) -> Frame:
    return _request(op=rng.choice(["enqueu", "PING", "", "drop_all"]), rid=4)


def bad_args(rng: random.Random) -> Frame:
    """A real op with each of its fields set to a value of a wrong type, or out of range."""
    spec = OPS[rng.choice(sorted(OPS))]
    wrong = [True, -1, 2**64, "", "no spaces", [], {}, None, "x" * 200, float("nan")]
    fields = {f.name: rng.choice(wrong) for f in spec.fields}
    return _request(op=spec.op.value, rid=5, **fields)


def oversize(rng: random.Random) -> Frame:
    return '{"op": "ping", "pad": "' + "x" * MAX_FRAME_BYTES + '"}'


# (maker, weight): oversize frames are rare, since each costs a megabyte and a reconnect.
MAKERS: list[tuple[Callable[[random.Random], Frame], int]] = [
    (garbage, 10),
    (bad_json, 10),
    (surrogates, 10),
    (huge_number, 10),
    (deep_nesting, 5),
    (binary, 10),
    (bad_op, 10),
    (bad_args, 30),
    (oversize, 1),
]


def hostile_frame(rng: random.Random) -> Frame:
    [(maker, _)] = rng.choices(MAKERS, [weight for _, weight in MAKERS])
    return maker(rng)


# ------------------------------------------------------------------------ measurements


@dataclass
class Tally:
    """What the hostile connections saw."""

    budget: int  # hostile frames still to send
    rate: float = 0.0  # hostile frames a second in all, at most (0: as fast as they go)
    started: float = field(default_factory=time.monotonic)
    sent: int = 0
    replies: Counter[str] = field(default_factory=Counter)  # "ok" or the error code
    closes: Counter[int | None] = field(default_factory=Counter)
    connects: int = 0
    elapsed_s: float = 0.0  # from the first frame to the last answer

    async def pace(self) -> None:
        """Wait until the next frame is due at ``rate`` (at once when unlimited)."""
        if self.rate > 0:
            due = self.started + self.sent / self.rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # pacing the sender, not waiting on an event

    def take(self) -> bool:
        """Whether one more frame may be sent (and count it)."""
        if self.budget <= 0:
            return False
        self.budget -= 1
        self.sent += 1
        return True


@dataclass
class Normal:
    """What the normal publishers and the worker saw."""

    answered: set[str] = field(default_factory=set)  # job ids enqueues were answered with
    handled: set[str] = field(default_factory=set)  # job ids the worker's handler saw
    failed: list[str] = field(default_factory=list)  # enqueues that raised
    latencies: list[float] = field(default_factory=list)  # seconds, in the current phase
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def poke(self) -> None:
        """Something above changed: wake ``wait_until``."""
        self.changed.set()

    async def wait_until(self, predicate: Callable[[], bool], within: float) -> bool:
        """Wait (at most ``within`` seconds) until ``predicate()``; whether it holds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                while not predicate():
                    self.changed.clear()
                    await self.changed.wait()
        return predicate()


@dataclass
class Rss:
    """The broker's resident set size in KiB, sampled from /proc."""

    start: int = 0
    peak: int = 0
    end: int = 0


def read_rss_kib(pid: int) -> int | None:
    """VmRSS of ``pid`` in KiB, or None when the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


async def sample_rss(pid: int, rss: Rss) -> None:
    """Update ``rss`` every ``RSS_EVERY_S`` until cancelled or the process is gone."""
    while (kib := read_rss_kib(pid)) is not None:
        rss.start = rss.start or kib
        rss.peak = max(rss.peak, kib)
        rss.end = kib
        await asyncio.sleep(RSS_EVERY_S)  # a sampling period, not a synchronisation


def percentile(values: list[float], q: int) -> float:
    """The ``q``-th percentile of ``values`` (0 when there are none)."""
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


# ------------------------------------------------------------------------ the traffic


async def hostile_connection(url: str, tally: Tally, rng: random.Random) -> None:
    """Send hostile frames in bursts while the budget lasts, reconnecting when closed."""
    while tally.budget > 0:
        try:
            ws = await connect(url, max_size=None, open_timeout=30, close_timeout=1)
        except (OSError, InvalidHandshake, TimeoutError):
            tally.closes[None] += 1
            continue
        tally.connects += 1
        try:
            while tally.budget > 0:
                await tally.pace()
                await burst(ws, tally, rng)
        except (ConnectionClosed, TimeoutError):
            pass
        finally:
            await ws.close()
            tally.closes[ws.close_code] += 1


async def burst(ws: ClientConnection, tally: Tally, rng: random.Random) -> None:
    """Up to ``BURST`` hostile frames and a ``ping``; count the replies until the ping's.

    The replies of a connection leave in order, so the ping's comes last. (A frame over
    the limit closes the connection at once, and the replies before it may be lost.)
    """
    for _ in range(BURST):
        if not tally.take():
            break
        await ws.send(hostile_frame(rng))
    await ws.send(json.dumps({"op": "ping", "rid": LAST}))
    async with asyncio.timeout(DRAIN_S):
        while True:
            reply = json.loads(await ws.recv())
            if reply.get("rid") == LAST:
                return
            if "push" not in reply:
                tally.replies["ok" if reply["ok"] else reply["error"]["code"]] += 1


async def stalling_connection(url: str, job_id: str, gets: int, stop: asyncio.Event) -> int:
    """Pipeline ``gets`` get_job requests for a big job and never read; the close code."""
    ws = await connect(url, max_size=None, max_queue=1, close_timeout=1)
    try:
        for rid in range(gets):
            await ws.send(json.dumps({"op": "get_job", "rid": rid, "id": job_id}))
        await stop.wait()
    except ConnectionClosed:
        pass
    finally:
        await ws.close()
    return ws.close_code or 0


async def publish(client: Client, normal: Normal, name: str, stop: asyncio.Event) -> None:
    """Enqueue small jobs with keys, one at a time, until ``stop``; time each."""
    n = 0
    while not stop.is_set():
        n += 1
        started = time.perf_counter()
        try:
            job_id = await client.enqueue(QUEUE, {"n": n, "by": name}, key=f"{name}-{n}")
        except ConveyorError as exc:
            normal.failed.append(f"{name}-{n}: {exc}")
            continue
        normal.latencies.append(time.perf_counter() - started)
        normal.answered.add(job_id)
        normal.poke()


def make_worker(url: str, normal: Normal) -> Worker:
    worker = Worker(url, queues=[QUEUE], worker_id="soak-worker", prefetch=32)

    @worker.handler(QUEUE)
    async def handle(job: Job) -> None:
        normal.handled.add(job.id)
        normal.poke()

    return worker


async def run_publishers(url: str, normal: Normal, publishers: int, stop: asyncio.Event) -> None:
    """``publishers`` SDK clients publishing until ``stop``."""
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(Client(url)) for _ in range(publishers)]
        await asyncio.gather(
            *(publish(client, normal, f"p{i}", stop) for i, client in enumerate(clients))
        )


# ------------------------------------------------------------------------ the run


@dataclass
class Settings:
    frames: int = 100_000
    rate: float = 0.0  # hostile frames a second, at most; 0: as fast as they go
    connections: int = 50
    duration_s: float = 600.0
    seed: int = 1
    quiet: int = 3000  # enqueues in the quiet phase
    publishers: int = 4
    stallers: int = 4  # connections that pipeline get_job of a big job and never read
    stall_gets: int = 100  # get_job requests each of them sends


@dataclass
class Report:
    quiet: list[float]
    hostile: list[float]
    tally: Tally
    rss: Rss
    lost: int
    answered: int
    failed: int
    alive: bool
    exit_code: int | None
    log_errors: int
    stall_closes: list[int]
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.alive and self.exit_code == 0 and not self.lost and not self.log_errors


async def quiet_phase(url: str, normal: Normal, settings: Settings) -> list[float]:
    """Normal traffic alone until ``settings.quiet`` enqueues were answered."""
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(
        run_publishers(url, normal, settings.publishers, stop)
    )
    await normal.wait_until(lambda: len(normal.latencies) >= settings.quiet, settings.duration_s)
    stop.set()
    await task
    latencies, normal.latencies = normal.latencies, []
    return latencies


async def hostile_traffic(
    url: str, settings: Settings, big_id: str
) -> tuple[Tally, list[int], bool]:
    """The hostile connections and the stallers, until the frames are sent or the
    duration is up; what they saw, the stallers' close codes, whether it timed out."""
    loop = asyncio.get_running_loop()
    tally = Tally(budget=settings.frames, rate=settings.rate)
    stop = asyncio.Event()
    stallers = [
        loop.create_task(stalling_connection(url, big_id, settings.stall_gets, stop))
        for _ in range(settings.stallers)
    ]
    rng = random.Random(settings.seed)
    senders = [
        loop.create_task(hostile_connection(url, tally, random.Random(rng.random())))
        for _ in range(settings.connections)
    ]
    started = time.monotonic()
    _, pending = await asyncio.wait(senders, timeout=settings.duration_s)
    timed_out = bool(pending)
    tally.budget = 0  # the senders stop at their next frame
    await asyncio.gather(*senders)
    tally.elapsed_s = time.monotonic() - started
    stop.set()
    closes = await asyncio.gather(*stallers)
    return tally, list(closes), timed_out


def hostile_process(url: str, settings: Settings, big_id: str, out: Connection) -> None:
    """The hostile side's process: ``hostile_traffic`` on a loop of its own."""
    out.send(asyncio.run(hostile_traffic(url, settings, big_id)))
    out.close()


async def hostile_phase(
    url: str, normal: Normal, settings: Settings, big_id: str
) -> tuple[list[float], Tally, list[int], bool]:
    """Normal traffic here while the hostile side runs in its own process; the normal
    latencies and what ``hostile_traffic`` returned."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    publishers = loop.create_task(run_publishers(url, normal, settings.publishers, stop))
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=hostile_process, args=(url, settings, big_id, sender))
    child.start()
    sender.close()
    try:
        tally, closes, timed_out = await loop.run_in_executor(None, receiver.recv)
    finally:
        await loop.run_in_executor(None, child.join)
        stop.set()
        await publishers
    return normal.latencies, tally, closes, timed_out


async def count_lost(url: str, normal: Normal) -> int:
    """Answered enqueues that the worker never saw and the broker does not hold."""
    async with Client(url) as client:
        unseen = normal.answered - normal.handled
        return sum([await client.get_job(job_id) is None for job_id in unseen])


def count_log_errors(path: Path) -> int:
    """Lines of the broker's log that show a traceback or an error."""
    text = path.read_text(errors="replace")
    return sum("Traceback" in line or " ERROR " in line for line in text.splitlines())


async def run(settings: Settings, tmp: Path) -> Report:
    """The whole soak; see the module docstring."""
    log_path = tmp / "broker.log"
    normal, rss = Normal(), Rss()
    with log_path.open("ab") as log:
        broker = BrokerProcess(free_port(), tmp / "soak.db", 1.0, log)
        await broker.start()
        assert broker.proc is not None
        proc = broker.proc
        sampler = asyncio.get_running_loop().create_task(sample_rss(proc.pid, rss))
        try:
            async with working([make_worker(broker.url, normal)]):
                async with Client(broker.url) as client:
                    big_id = await client.enqueue(BIG_QUEUE, BIG_PAYLOAD)
                quiet = await quiet_phase(broker.url, normal, settings)
                hostile, tally, stall_closes, timed_out = await hostile_phase(
                    broker.url, normal, settings, big_id
                )
                # The worker gets a while to see every answered job; get_job finds the rest.
                await normal.wait_until(lambda: normal.answered <= normal.handled, DRAIN_S)
            alive = proc.returncode is None
            lost = await count_lost(broker.url, normal) if alive else len(normal.answered)
            sampler.cancel()
            exit_code = await broker.terminate() if alive else proc.returncode
        finally:
            sampler.cancel()
            await broker.kill()
    return Report(
        quiet=quiet,
        hostile=hostile,
        tally=tally,
        rss=rss,
        lost=lost,
        answered=len(normal.answered),
        failed=len(normal.failed),
        alive=alive,
        exit_code=exit_code,
        log_errors=count_log_errors(log_path),
        stall_closes=stall_closes,
        timed_out=timed_out,
    )


def results_table(report: Report) -> str:
    """The report as a small table."""
    q50, q99 = percentile(report.quiet, 50), percentile(report.quiet, 99)
    h50, h99 = percentile(report.hostile, 50), percentile(report.hostile, 99)
    t = report.tally
    rows = [
        ("broker alive at end", str(report.alive)),
        ("exit status on SIGTERM", str(report.exit_code)),
        ("hostile frames sent", f"{t.sent} in {t.elapsed_s:.1f}s ({t.connects} connects)"),
        ("duration cap hit", str(report.timed_out)),
        ("replies to hostile frames", ", ".join(f"{k} {v}" for k, v in t.replies.most_common())),
        ("hostile closes", ", ".join(f"{k} {v}" for k, v in t.closes.most_common())),
        ("stalling connections closed", str(Counter(report.stall_closes).most_common())),
        ("normal enqueues answered", f"{report.answered} ({report.failed} failed)"),
        ("answered enqueues lost", str(report.lost)),
        ("broker log errors/tracebacks", str(report.log_errors)),
        ("broker RSS start/max/end", f"{report.rss.start // 1024} / "
         f"{report.rss.peak // 1024} / {report.rss.end // 1024} MiB"),
        ("enqueue p50 quiet/hostile", f"{q50 * 1e3:.2f} / {h50 * 1e3:.2f} ms "
         f"(x{h50 / q50 if q50 else 0:.2f})"),
        ("enqueue p99 quiet/hostile", f"{q99 * 1e3:.2f} / {h99 * 1e3:.2f} ms "
         f"(x{h99 / q99 if q99 else 0:.2f})"),
        ("enqueues timed quiet/hostile", f"{len(report.quiet)} / {len(report.hostile)}"),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=100_000, help="hostile frames (100000)")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="hostile frames a second at most (0: no cap)"
    )
    parser.add_argument("--connections", type=int, default=50, help="hostile connections (50)")
    parser.add_argument("--duration", type=float, default=600.0, help="cap in seconds (600)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the hostile frames (1)")
    parser.add_argument("--quiet", type=int, default=3000, help="quiet-phase enqueues (3000)")
    parser.add_argument("--stallers", type=int, default=4, help="stalling connections (4)")
    args = parser.parse_args(argv)
    settings = Settings(
        frames=args.frames,
        rate=args.rate,
        connections=args.connections,
        duration_s=args.duration,
        seed=args.seed,
        quiet=args.quiet,
        stallers=args.stallers,
    )
    print(
        f"hostile soak: {settings.frames} frames over {settings.connections} connections, "
        f"{settings.stallers} stalling connections, cap {settings.duration_s:.0f}s",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="conveyor-hostile-") as tmp:
        report = asyncio.run(run(settings, Path(tmp)))
        print(results_table(report))
        if report.log_errors:
            print((Path(tmp) / "broker.log").read_text()[-3000:])
    print("RESULT: " + ("OK" if report.ok else "FAILED"))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
