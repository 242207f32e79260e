"""The latency floor under Conveyor: the harness's own clients against a bare relay.

``bench/compare.py`` measures latency from the publisher's enqueue call to a worker's
handler starting (1,000 jobs/s, 2 workers). Part of that is Conveyor, and part is what any
broker in Python reached over WebSockets pays whatever it does: the publisher's and the
worker's event loops and websockets, and a third process in the middle. This script
measures that part alone. Its "relay" is a WebSocket server (websockets, on uvloop when
installed, as ``conveyor serve`` runs) that keeps no job and decides nothing: each
``enqueue_each`` frame is pushed at once to the next subscribed worker (kept until the
first one subscribes) and answered, each ``ack_batch`` answered. The publisher and the
workers are ``compare.py``'s raw Conveyor clients, unchanged, and every round checks that
each job was handled exactly once.

The systems asked for (default: ``conveyor-memory`` and ``beanstalkd``) are measured in
the same run, round after round in turn, and each round's p50 and p99 are printed with
their ratio to the relay's from that round. Besides the harness's systems there is
``py-beanstalkd``: beanstalkd's protocol served by a few dozen lines of Python on uvloop
(``bench/py_beanstalkd.py``), with the harness's beanstalkd clients, unchanged::

    .venv/bin/python bench/relay_floor.py [--systems conveyor-memory,beanstalkd] [--runs 3]

``--workload enqueue1`` measures ``compare.py``'s other per-request figure instead: one
publisher making one awaited enqueue at a time (20,000 of them, ``--serial-jobs``), with
its usual client (the SDK's ``Client`` for ``conveyor-*-sdk``, and for the relays too).
Two relays answer each ``enqueue_each`` and keep its jobs for no one: ``ws-relay`` (the
one above, on websockets' asyncio server) and ``ws-relay-sansio`` (websockets' sans-I/O
protocol on an asyncio ``Protocol`` of its own, as the broker's transport is built). The
ratios to them say how far a system is from what a round trip through a WebSocket server
in Python costs when the server does nothing::

    .venv/bin/python bench/relay_floor.py --workload enqueue1 \
        --systems conveyor-memory-sdk,nats-memory

What it showed is in ``docs/benchmarks.md`` ("Where Conveyor still loses").
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
from typing import Any

import compare  # the harness, beside this file (the script's directory is on the path)
import latency_hops

RATE = 1000.0
SECONDS = 5.0


class Relaying:
    """What the relay decides, shared by both of its servers: each frame in, the frames
    out as ``(connection, bytes)``, for connections of any kind."""

    def __init__(self) -> None:
        self.workers: list[Any] = []
        self.waiting: list[bytes] = []  # pushes made before any worker subscribed
        self.held = 0  # the jobs in those
        self.turn = 0

    def frame(
        self, conn: Any, raw: str | bytes | bytearray | memoryview
    ) -> list[tuple[Any, bytes]]:
        import orjson

        frame = orjson.loads(raw)
        op, rid = frame.get("op"), frame.get("rid")
        out: list[tuple[Any, bytes]] = []
        if op == "subscribe":
            self.workers.append(conn)
            out.append((conn, orjson.dumps({"rid": rid, "ok": True})))
            out.extend((conn, push) for push in self.waiting)
            self.waiting.clear()
            self.held = 0
            return out
        if op == "enqueue_each":
            self.turn += 1
            jobs = [
                {"id": f"{self.turn:x}.{i}", "lease": "l", "payload": job["payload"]}
                for i, job in enumerate(frame["jobs"])
            ]
            push = orjson.dumps({"push": "jobs", "jobs": jobs})
            if self.workers:
                out.append((self.workers[self.turn % len(self.workers)], push))
            else:
                self.waiting.append(push)
                self.held += len(jobs)
            reply: dict[str, Any] = {
                "rid": rid, "ok": True, "results": [{"id": j["id"]} for j in jobs]
            }  # fmt: skip
        elif op == "hello":  # (the SDK's first request)
            reply = {"rid": rid, "ok": True}
        elif op == "stats":  # (what compare.py's depth check asks; the rest is 0)
            counts = {"ready": self.held, "scheduled": 0, "processing": 0}
            reply = {"rid": rid, "ok": True, "queues": {compare.QUEUE: counts}}
        elif op == "ack_batch":
            reply = {"rid": rid, "ok": True, "landed": [True] * len(frame["items"])}
        else:
            raise ValueError(f"the relay speaks no {op!r}")
        out.append((conn, orjson.dumps(reply)))
        return out


def relay_main(ports: Any, sansio: bool) -> None:
    """The relay process: serve until killed; put the port it listens on in ``ports``.

    ``sansio``: websockets' sans-I/O protocol on an asyncio ``Protocol`` of its own, as
    the broker's transport is built; otherwise websockets' asyncio server."""
    relaying = Relaying()

    async def served() -> None:
        from websockets.asyncio.server import ServerConnection, serve

        async def handler(ws: ServerConnection) -> None:
            async for raw in ws:
                for conn, data in relaying.frame(ws, raw):
                    await conn.send(data, text=True)

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
        """The jobs pushed before any worker came (``enqueue1``); the latency workload's
        were all pushed, and the harness checks that each came once."""
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
    parser.add_argument("--workload", choices=["latency", "enqueue1"], default="latency")
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
    # The latency workload's relay has the harness's raw clients; enqueue1's the SDK's
    # Client when a system has it (conveyor-*-sdk).
    sdk = args.workload == "enqueue1" and any(known[name].sdk for name in names)
    systems: list[compare.System] = [Relay(sdk)]
    if args.workload == "enqueue1":
        systems.append(Relay(sdk, sansio=True))
    for name in names:
        system = known[name]
        try:
            system.check()
        except compare.Skip as exc:
            print(f"SKIPPED {name}: {exc}")
            continue
        systems.append(system)
    if args.workload == "enqueue1":
        enqueue1(systems, args.runs, args.serial_jobs)
        return
    print(f"latency at {RATE:,.0f} jobs/s for {SECONDS:.0f} s, 2 workers; ms")
    ratios: dict[str, list[tuple[float, float]]] = {s.name: [] for s in systems[1:]}
    try:
        for run in range(1, args.runs + 1):
            floor: list[float] = []
            for system in systems:
                p50, p99, top = compare.measure_latency(system, RATE, SECONDS, 120)
                line = f"{run}  {system.name:<18} p50 {p50:5.2f}  p99 {p99:5.2f}  max {top:6.2f}"
                if not floor:
                    floor = [p50, p99]
                else:
                    ratios[system.name].append((p50 / floor[0], p99 / floor[1]))
                    line += f"   / relay: p50 {p50 / floor[0]:.2f}x  p99 {p99 / floor[1]:.2f}x"
                print(line, flush=True)
    finally:
        for system in systems:
            system.stop()
        compare.stop_all()
    for name, pairs in ratios.items():
        if pairs:
            p50 = statistics.median(a for a, _ in pairs)
            p99 = statistics.median(b for _, b in pairs)
            print(f"{name:<18} / relay, median of the rounds: p50 {p50:.2f}x  p99 {p99:.2f}x")


def enqueue1(systems: list[compare.System], runs: int, n: int) -> None:
    """Each system's rate of one awaited enqueue at a time, round after round in turn,
    with its ratio to the relay's in that round and the medians of those ratios."""
    print(f"one awaited enqueue at a time, {n:,} jobs, clients on {compare.LOOP[0]}; jobs/s")
    ratios: dict[str, list[float]] = {s.name: [] for s in systems[1:]}
    try:
        for run in range(1, runs + 1):
            floor = 0.0
            for system in systems:
                rate = compare.measure_serial(system, n, 120)
                line = f"{run}  {system.name:<20} {rate:8,.0f} jobs/s  {1e6 / rate:6.1f} us a call"
                if not floor:
                    floor = rate
                else:
                    ratios[system.name].append(rate / floor)
                    line += f"   / relay: {rate / floor:.2f}x"
                print(line, flush=True)
    finally:
        for system in systems:
            system.stop()
        compare.stop_all()
    for name, each in ratios.items():
        if each:
            print(f"{name:<20} / relay, median of the rounds: {statistics.median(each):.2f}x")
    for a in ratios:
        for b in ratios:
            if a.startswith("conveyor") and not b.startswith("conveyor") and ratios[a]:
                each = [x / y for x, y in zip(ratios[a], ratios[b], strict=True)]
                print(f"{a} / {b}, median of the rounds: {statistics.median(each):.2f}x")


if __name__ == "__main__":
    multiprocessing.freeze_support()
    main()
