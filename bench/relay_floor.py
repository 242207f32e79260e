"""The floor under Conveyor: the same clients against a server that does nothing.

Part of every figure ``bench/compare.py`` measures is Conveyor, and part is what any
broker in Python reached over WebSockets pays whatever it does: the clients' event loops
and websockets, and a third process in the middle. This script measures that part alone,
with two "relays" (``Relaying``): WebSocket servers on uvloop, as ``conveyor serve``
runs, that hold the jobs no worker has room for in a deque and push to each subscribed
worker up to its prefetch (in frames of half a window, as the broker does), take an ack
as room given back, and answer an enqueue with made-up ids. Nothing is checked, leased,
timed or kept once acked. ``ws-relay`` runs on websockets' asyncio server,
``ws-relay-sansio`` on websockets' sans-I/O protocol under an asyncio ``Protocol`` of its
own, as the broker's transport is built. Their clients are the ones the harness gives
the systems asked for: the SDK's ``Client`` and ``Worker`` when one is ``conveyor-*-sdk``,
else its raw Conveyor clients, unchanged; every round checks that each job was handled
exactly once.

``--workload`` picks what is measured, as ``compare.py`` measures it:

* ``latency`` (the default): from the enqueue call to the handler, 1,000 jobs/s for 5 s,
  2 workers; each round's p50 and p99, with their ratios to ``ws-relay``'s;
* ``enqueue1``: one awaited enqueue at a time (``--serial-jobs``, 20,000), jobs/s;
* ``drain``: 1 and 4 worker processes draining a full queue (``--jobs``, 100,000), jobs/s.

The systems asked for are measured in the same run, round after round, every system in
turn; the medians of the per-round ratios close the output. Besides the harness's systems
there is ``py-beanstalkd``: beanstalkd's protocol served by a few dozen lines of Python on
uvloop (``bench/py_beanstalkd.py``), with the harness's beanstalkd clients::

    .venv/bin/python bench/relay_floor.py [--systems conveyor-memory,beanstalkd] [--runs 3]
    .venv/bin/python bench/relay_floor.py --workload drain --loop uvloop \
        --systems conveyor-memory-sdk,nats-memory

What it showed is in ``docs/benchmarks.md`` ("Where Conveyor still loses").
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import compare  # the harness, beside this file (the script's directory is on the path)
import latency_hops

RATE = 1000.0
SECONDS = 5.0


class Relaying:
    """What the relay decides, shared by both of its servers: each frame in, the frames
    out as ``(connection, bytes)``, for connections of any kind.

    The least a broker can do: the jobs no worker has room for wait in order; a worker
    has room for its ``prefetch`` jobs, given back by its acks; jobs go to the workers
    with room in turn, in frames of at most half a window (as the broker splits them).
    Nothing is checked, leased, timed or kept once pushed."""

    def __init__(self) -> None:
        self.ready: deque[dict[str, Any]] = deque()
        self.room: dict[Any, int] = {}  # each subscribed worker's free slots
        self.window: dict[Any, int] = {}  # and its prefetch
        self.held = 0  # jobs pushed and not acked
        self.seq = 0
        self.turn = 0

    def frame(
        self, conn: Any, raw: str | bytes | bytearray | memoryview
    ) -> list[tuple[Any, bytes]]:
        import orjson

        frame = orjson.loads(raw)
        op, rid = frame.get("op"), frame.get("rid")
        out: list[tuple[Any, bytes]] = []
        reply: dict[str, Any] = {"rid": rid, "ok": True}
        if op == "subscribe":
            prefetch = frame.get("prefetch") or 64
            self.room[conn] = self.window[conn] = prefetch
        elif op in ("enqueue_each", "enqueue_batch"):
            # (every field the SDK's worker reads from a push, as the broker sends them)
            deadline = time.time() + 30.0
            ids = []
            for job in frame["jobs"]:
                self.seq += 1
                ids.append(job_id := f"{self.seq:x}")
                self.ready.append({
                    "id": job_id, "queue": job.get("queue", frame.get("queue")),
                    "payload": job["payload"], "attempt": 1, "max_attempts": 3,
                    "lease": job_id, "deadline": deadline, "priority": 0,
                    "visibility_timeout_s": 30.0, "timeout_s": None, "partition": None,
                    "dependencies": None,
                })  # fmt: skip
            if op == "enqueue_each":
                reply["results"] = [{"id": job_id} for job_id in ids]
            else:
                reply["ids"] = ids
        elif op == "ack_batch":
            acked = len(frame["items"])
            self.room[conn] += acked
            self.held -= acked
            reply["landed"] = [True] * acked
        elif op == "stats":  # (what compare.py's depth check asks)
            counts = {"ready": len(self.ready), "scheduled": 0, "processing": self.held}
            reply["queues"] = {compare.QUEUE: counts}
        elif op not in ("hello", "unsubscribe"):  # (the SDK's first request; a worker's last)
            raise ValueError(f"the relay speaks no {op!r}")
        self.push(out)  # pushes first, as the broker sends them
        if rid is not None:
            out.append((conn, orjson.dumps(reply)))
        return out

    def push(self, out: list[tuple[Any, bytes]]) -> None:
        """Hand waiting jobs to the workers with room, starting at the next in turn."""
        import orjson

        if not self.ready or not self.room:
            return
        workers = list(self.room)
        self.turn += 1
        for k in range(len(workers)):
            worker = workers[(self.turn + k) % len(workers)]
            room, per = self.room[worker], max(1, (self.window[worker] + 1) // 2)
            while room and self.ready:
                take = min(room, per, len(self.ready))
                jobs = [self.ready.popleft() for _ in range(take)]
                out.append((worker, orjson.dumps({"push": "jobs", "jobs": jobs})))
                room -= take
                self.held += take
            self.room[worker] = room
            if not self.ready:
                return

    def gone(self, conn: Any) -> None:
        """A connection ended: a worker's room goes (what it held is forgotten)."""
        self.room.pop(conn, None)
        self.window.pop(conn, None)


def relay_main(ports: Any, sansio: bool) -> None:
    """The relay process: serve until killed; put the port it listens on in ``ports``.

    ``sansio``: websockets' sans-I/O protocol on an asyncio ``Protocol`` of its own, as
    the broker's transport is built; otherwise websockets' asyncio server."""
    relaying = Relaying()

    async def served() -> None:
        from websockets.asyncio.server import ServerConnection, serve

        async def handler(ws: ServerConnection) -> None:
            try:
                async for raw in ws:
                    for conn, data in relaying.frame(ws, raw):
                        await conn.send(data, text=True)
            finally:
                relaying.gone(ws)

        async with serve(handler, compare.HOST, 0, compression=None, max_size=None) as server:
            ports.put(server.sockets[0].getsockname()[1])
            await asyncio.Future()

    async def bare() -> None:
        from websockets.frames import Frame, Opcode
        from websockets.http11 import Request
        from websockets.server import ServerProtocol

        class Conn(asyncio.Protocol):
            def connection_made(self, transport: Any) -> None:
                self.transport = transport
                self.ws = ServerProtocol(max_size=None)

            def data_received(self, data: bytes) -> None:
                ws = self.ws
                ws.receive_data(data)
                touched = {self}
                for event in ws.events_received():
                    if isinstance(event, Request):
                        ws.send_response(ws.accept(event))
                    elif isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                        for conn, out in relaying.frame(self, event.data):
                            conn.ws.send_text(out)
                            touched.add(conn)
                for conn in touched:
                    chunks = conn.ws.data_to_send()
                    if chunks:
                        conn.transport.write(b"".join(chunks))

            def connection_lost(self, exc: Exception | None) -> None:
                relaying.gone(self)

        server = await asyncio.get_running_loop().create_server(Conn, compare.HOST, 0)
        ports.put(server.sockets[0].getsockname()[1])
        await asyncio.Future()

    main = bare if sansio else served
    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())


class Relay(compare.System):
    """The relay as a system of the harness: latency only, and it holds no job."""

    def __init__(self, sdk: bool, sansio: bool = False) -> None:
        super().__init__("ws-relay-sansio" if sansio else "ws-relay", "conveyor", "memory", sdk=sdk)
        self._relay: Any = None
        self._sansio = sansio

    def start(self) -> compare.Target:
        self.stop()
        ports = compare.CTX.Queue()
        self._relay = compare.spawn(relay_main, ports, self._sansio)
        url = f"ws://{compare.HOST}:{ports.get(timeout=30)}/ws"
        self._target = compare.Target("conveyor", url, self.sdk, compare.LOOP[0])
        return self._target

    def remaining(self) -> int:
        """The jobs the relay holds: waiting, or pushed and not acked."""
        assert self._target is not None
        return compare.System.remaining(self)

    def stop(self) -> None:
        if self._relay is not None:
            compare.stop_process(self._relay)
            self._relay = None
        self._target = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", default="conveyor-memory,beanstalkd")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workload", choices=["latency", "enqueue1", "drain"], default="latency")
    parser.add_argument("--jobs", type=int, default=100_000, help="N for each drain")
    parser.add_argument("--serial-jobs", type=int, default=20_000, help="N for enqueue1")
    parser.add_argument("--loop", choices=["auto", "uvloop", "asyncio"], default="auto",
                        help="every client's event loop (the relay runs on uvloop)")  # fmt: skip
    args = parser.parse_args()
    compare.LOOP[0] = args.loop
    # py-beanstalkd: beanstalkd's protocol served by Python (bench/py_beanstalkd.py), for
    # the harness's beanstalkd clients: what a Python server in the middle costs alone.
    py_beanstalkd = latency_hops.StampedPyBeanstalk()
    known: dict[str, compare.System] = {**compare.all_systems(), "py-beanstalkd": py_beanstalkd}
    names = args.systems.split(",")
    for name in names:
        if name not in known:
            parser.error(f"--systems: no system {name!r} (known: {', '.join(known)})")
    # The relays' clients are the SDK's when a system's are (conveyor-*-sdk).
    sdk = any(known[name].sdk for name in names)
    systems: list[compare.System] = [Relay(sdk), Relay(sdk, sansio=True)]
    for name in names:
        system = known[name]
        try:
            system.check()
        except compare.Skip as exc:
            print(f"SKIPPED {name}: {exc}")
            continue
        systems.append(system)
    measures: list[Measure]
    if args.workload == "enqueue1":
        n = args.serial_jobs
        print(f"one awaited enqueue at a time, {n:,} jobs, clients on {compare.LOOP[0]}; jobs/s")
        measures = [lambda s: {"enqueue1": compare.measure_serial(s, n, 120)}]
    elif args.workload == "drain":
        n, window, loop = args.jobs, compare.PREFETCH, compare.LOOP[0]
        print(
            f"drains of {n:,} jobs from a full queue, prefetch {window}, clients on {loop}; jobs/s"
        )

        def draining(k: int) -> Measure:
            return lambda system: {f"drain{k}": compare.measure_drain(system, n, k, 300)}

        measures = [draining(1), draining(4)]
    else:
        rate = f"{RATE:,.0f} jobs/s for {SECONDS:.0f} s"
        print(f"latency at {rate}, 2 workers, clients on {args.loop}; ms")

        def latency(system: compare.System) -> dict[str, float]:
            p50, p99, top = compare.measure_latency(system, RATE, SECONDS, 120)
            return {"p50": p50, "p99": p99, "max": top}

        measures = [latency]
    rounds(systems, args.runs, measures)


Measure = Callable[[compare.System], dict[str, float]]


def rounds(systems: list[compare.System], runs: int, measures: list[Measure]) -> None:
    """Each measurement (figures by name: ``measure(system)``) of each system, round after
    round, every system in turn, with each figure's ratio to the first relay's in that
    round; then the medians of those ratios, and of each system's figure over each later
    system's (the relay cancels out: ``ws-relay-sansio / nats-memory``)."""
    ratios: dict[str, dict[str, list[float]]] = {}  # figure -> system -> per round
    try:
        for run in range(1, runs + 1):
            for measure in measures:
                floor: dict[str, float] = {}
                for system in systems:
                    figures = measure(system)
                    line = f"{run}  {system.name:<20}" + "".join(
                        f"  {name} {value:9,.2f}" for name, value in figures.items()
                    )
                    if not floor:
                        floor = figures
                    else:
                        line += "   / relay:"
                        for name, value in figures.items():
                            ratios.setdefault(name, {}).setdefault(system.name, [])
                            ratios[name][system.name].append(value / floor[name])
                            line += f" {name} {value / floor[name]:.2f}x"
                    print(line, flush=True)
    finally:
        for system in systems:
            system.stop()
        compare.stop_all()
    for name, by_system in ratios.items():
        for system_name, each in by_system.items():
            print(f"{name:<9} {system_name} / relay, median: {statistics.median(each):.2f}x")
        names = list(by_system)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                each = [x / y for x, y in zip(by_system[a], by_system[b], strict=True)]
                print(f"{name:<9} {a} / {b}, median: {statistics.median(each):.2f}x")


if __name__ == "__main__":
    multiprocessing.freeze_support()
    main()
