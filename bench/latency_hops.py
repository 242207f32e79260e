"""Where the latency goes: each job's time from the enqueue call to its handler, in hops.

``bench/compare.py``'s latency workload (a steady 1,000 jobs/s for 5 s, 2 workers, the
harness's own clients), with a server that notes, for every job, when the read that
carried its request began and when it started and ended the write of the frame that
pushed it to a worker, and workers that note when their client library handed them each
read (``compare.Tally``, with ``BENCH_READ_STAMPS`` set). The payload's ``sent`` (the
publisher's clock before the enqueue call) and the handler's start (the tally) close the
ends. One host clock (``CLOCK_MONOTONIC``) serves every process, so each job's latency
splits into four hops that add up to it:

* **publisher**: from the enqueue call to the server's read: the client's send path, the
  socket, the server's wake;
* **server**: from that read to the start of the write of the push: parsing and decoding
  the request, the job's rules, the claim, framing (with ``--sync full``, the commit's
  write too): the server's own Python;
* **wire**: from there to the worker's read: the write call, the socket, the worker's
  wake (negative when the worker, on the other core, reads before the server's write call
  has returned);
* **worker**: from its read to the handler's start: parsing and decoding the push,
  starting the handler: the worker's own Python.

``(write)`` is the server's write call alone (inside ``wire``).

Conveyor's broker is the real one, run by this script with three of its methods wrapped
(``Socket.data_received``, ``Connection._on_message`` and
``Socket.write_text_frames``: a clock read and an append each); ``py-beanstalkd``
(``bench/py_beanstalkd.py``, beanstalkd's protocol in a few dozen lines of Python, with
beanstalkd's own clients) notes the same times, for a server that does almost nothing in
between::

    .venv/bin/python bench/latency_hops.py [--systems conveyor-memory-sdk,py-beanstalkd]
        [--runs 3] [--loop auto|uvloop|asyncio]

Printed per round: the total's p50 and p99, each hop's p50, p90 and p99 taken on its
own, and each hop's mean over the slowest 1% of jobs. What it showed is in
``docs/benchmarks.md`` ("Where Conveyor still loses").
"""

from __future__ import annotations

import argparse
import atexit
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import compare  # the harness, beside this file (the script's directory is on the path)

RATE = 1000.0
JOBS = 5000
HERE = Path(__file__).resolve().parent
_SENT = re.compile(rb'"seq":(\d+),"sent":([0-9.eE+-]+)')


def serve_stamped(stamps_path: str, argv: list[str]) -> int:
    """Run ``conveyor serve`` with the two stamps; write them to ``stamps_path`` at exit.
    The broker is imported from the working directory (``compare.conveyor_root()`` of the
    process that started this one: a ``--snapshot`` copy, say)."""
    sys.path.insert(0, os.getcwd())
    from conveyor.broker import cli, connection

    reads: list[tuple[float, bytes]] = []
    starts: list[tuple[float, list[bytes]]] = []
    writes: list[tuple[float, list[bytes]]] = []
    clock = time.monotonic
    read_at = [0.0]  # when the read being handled began
    received = connection.Socket.data_received
    on_message = connection.Connection._on_message
    write_frames = connection.Socket.write_text_frames

    def stamped_received(self: Any, data: bytes) -> None:
        read_at[0] = clock()
        received(self, data)

    def stamped_on_message(self: Any, message: str | bytes) -> None:
        data = message.encode() if isinstance(message, str) else bytes(message)
        if b'"enqueue' in data:
            reads.append((read_at[0], data))
        on_message(self, message)

    def stamped_write(self: Any, outbox: Any, limit: int) -> int:
        start = clock()
        queued = list(outbox)
        taken_bytes: int = write_frames(self, outbox, limit)
        end = clock()
        taken = queued[: len(queued) - len(outbox)]  # what this write took
        pushes = [bytes(frame) for frame in taken if b'"push":"jobs"' in frame]
        if pushes:
            starts.append((start, pushes))
            writes.append((end, pushes))
        return taken_bytes

    def dump() -> None:
        with open(stamps_path, "wb") as out:
            read_entries = [(at, [data]) for at, data in reads]
            for kind, entries in ((b"R", read_entries), (b"S", starts), (b"W", writes)):
                for at, frames in entries:
                    for frame in frames:
                        for seq, sent in _SENT.findall(frame):
                            out.write(b"%s %s %s %r\n" % (kind, seq, sent, at))

    connection.Socket.data_received = stamped_received  # type: ignore[method-assign]
    connection.Connection._on_message = stamped_on_message  # type: ignore[method-assign]
    connection.Socket.write_text_frames = stamped_write  # type: ignore[method-assign]
    atexit.register(dump)
    return cli.main(argv)


class Stamped(compare.System):
    """A system of the harness whose server notes its reads and writes in ``stamps``."""

    stamps = ""

    def finish(self) -> str:
        """Stop the server (it writes its stamps then); return the stamps' path."""
        if self._proc is not None:
            compare.stop_popen(self._proc)
            self._proc = None
        return self.stamps

    def stop(self) -> None:
        self.finish()
        super().stop()


class StampedConveyor(Stamped):
    """A Conveyor system of the harness, its broker run by ``serve_stamped``."""

    def __init__(self, base: compare.System) -> None:
        super().__init__(base.name, "conveyor", base.durability, base.sdk, base.store, base.sync)

    def start(self) -> compare.Target:
        self.stop()
        self._tmp = Path(tempfile.mkdtemp(prefix="conveyor-hops-"))
        self.stamps = str(self._tmp / "stamps")
        args = ["serve", "--host", compare.HOST, "--port", "0", "--store", self.store,
                "--db", str(self._tmp / "bench.db"), "--sync", self.sync,
                "--log-level", "warning"]  # fmt: skip
        self._proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--serve-stamped", self.stamps,
             "--", *args],
            cwd=compare.conveyor_root(), stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        compare.CHILDREN.append(self._proc)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().decode()
        if not line.startswith("conveyor listening on "):
            raise compare.Failed(f"conveyor did not start: {line!r}")
        self._target = compare.Target("conveyor", line.split()[3], self.sdk, compare.LOOP[0])
        return self._target


class StampedPyBeanstalk(Stamped):
    """``py_beanstalkd.py`` noting its reads of puts and its writes of jobs."""

    def __init__(self) -> None:
        super().__init__("py-beanstalkd", "beanstalkd", "memory")

    def check(self) -> str:
        compare.beanstalkd_check()  # greenstalk, for the workers
        return "bench/py_beanstalkd.py"

    def start(self) -> compare.Target:
        self.stop()
        self._tmp = Path(tempfile.mkdtemp(prefix="py-beanstalkd-hops-"))
        self.stamps = str(self._tmp / "stamps")
        port = compare.free_port()
        self._proc = subprocess.Popen(
            [sys.executable, str(HERE / "py_beanstalkd.py"), str(port), self.stamps],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        )  # fmt: skip
        compare.CHILDREN.append(self._proc)
        assert self._proc.stdout is not None
        if not self._proc.stdout.readline().startswith(b"listening on "):
            raise compare.Failed("py_beanstalkd.py did not start")
        self._target = compare.Target("beanstalkd", f"{compare.HOST}:{port}")
        return self._target


def read_stamps(path: str) -> dict[int, tuple[float, float, float, float]]:
    """The server's stamps: seq -> (sent, request read, push write started, push write
    ended), for every job with all of them."""
    stamps: dict[bytes, dict[int, float]] = {b"R": {}, b"S": {}, b"W": {}}
    sent_of: dict[int, float] = {}
    with open(path, "rb") as lines:
        for line in lines:
            kind, seq, sent, at = line.split()
            stamps[kind][int(seq)] = float(at)
            sent_of[int(seq)] = float(sent)
    read, start, wrote = stamps[b"R"], stamps[b"S"], stamps[b"W"]
    return {
        seq: (sent_of[seq], read[seq], start[seq], at)
        for seq, at in wrote.items()
        if seq in read and seq in start
    }


def quantile(values: list[float], q: float) -> float:
    return compare.quantile(sorted(values), q)


HOPS = ("publisher", "server", "wire", "worker")


def measure(system: Stamped) -> list[tuple[float, ...]]:
    """One round: for every job, (total, publisher, server, wire, worker, write) seconds:
    the four hops, which add up to the total, and the server's write call alone."""
    target = system.start()
    os.environ["BENCH_READ_STAMPS"] = "1"  # the workers note their reads (compare.Tally)
    try:
        _, tallies = compare.run_workers(system, target, 2, JOBS, 120, publish_rate=RATE)
        stamps = read_stamps(system.finish())
    finally:
        del os.environ["BENCH_READ_STAMPS"]
        system.stop()
    rows: list[tuple[float, ...]] = []
    for tally in tallies:
        worker_reads = tally["reads"]
        for seq, latency in zip(tally["seqs"], tally["lat"], strict=True):
            if seq in stamps and seq in worker_reads:
                sent, read, start, wrote = stamps[seq]
                handler = sent + latency
                got = worker_reads[seq]
                rows.append(
                    (latency, read - sent, start - read, got - start, handler - got, wrote - start)
                )
    if len(rows) < JOBS * 0.99:
        raise compare.Failed(f"only {len(rows):,} of {JOBS:,} jobs have every stamp")
    return rows


def report(name: str, rows: list[tuple[float, ...]]) -> None:
    ms = 1000.0
    rows.sort()
    slowest = rows[int(len(rows) * 0.99) :]
    total = [r[0] for r in rows]
    print(f"{name:<20} jobs {len(rows):,}  total p50 {quantile(total, 0.5) * ms:.3f}  "
          f"p99 {quantile(total, 0.99) * ms:.3f} ms")  # fmt: skip
    for index, hop in enumerate((*HOPS, "(write)"), start=1):
        values = [r[index] for r in rows]
        worst = sum(r[index] for r in slowest) / len(slowest)
        print(f"    {hop:<10} p50 {quantile(values, 0.5) * ms:.3f}  p90 "
              f"{quantile(values, 0.9) * ms:.3f}  p99 {quantile(values, 0.99) * ms:.3f}  "
              f"mean in the slowest 1%: {worst * ms:.3f} ms")  # fmt: skip


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve-stamped":
        sys.exit(serve_stamped(sys.argv[2], sys.argv[4:]))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", default="conveyor-memory-sdk,py-beanstalkd")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--loop", choices=["auto", "uvloop", "asyncio"], default="auto",
                        help="every client's event loop, as in compare.py")  # fmt: skip
    args = parser.parse_args()
    compare.LOOP[0] = args.loop
    known = compare.all_systems()
    systems: list[Stamped] = []
    for name in args.systems.split(","):
        if name == "py-beanstalkd":
            systems.append(StampedPyBeanstalk())
        elif name in known and known[name].conveyor:
            systems.append(StampedConveyor(known[name]))
        else:
            parser.error(f"--systems: {name!r} is neither a Conveyor system nor py-beanstalkd")
    for system in systems:
        system.check()
    print(f"latency at {RATE:,.0f} jobs/s, {JOBS:,} jobs, 2 workers (every client on "
          f"{compare.loop_name(args.loop)}); hops in ms")  # fmt: skip
    try:
        for run in range(1, args.runs + 1):
            for system in systems:
                print(f"round {run}: ", end="")
                report(system.name, measure(system))
    finally:
        for system in systems:
            system.stop()
        compare.stop_all()


if __name__ == "__main__":
    multiprocessing.freeze_support()
    main()
