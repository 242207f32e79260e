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


def relay_main(ports: Any) -> None:
    """The relay process: serve until killed; put the port it listens on in ``ports``."""
    import orjson
    from websockets.asyncio.server import ServerConnection, serve

    async def main() -> None:
        workers: list[ServerConnection] = []
        waiting: list[bytes] = []  # pushes made before any worker subscribed
        turn = 0

        async def handler(ws: ServerConnection) -> None:
            nonlocal turn
            async for raw in ws:
                frame = orjson.loads(raw)
                op, rid = frame.get("op"), frame.get("rid")
                if op == "subscribe":
                    workers.append(ws)
                    await ws.send(orjson.dumps({"rid": rid, "ok": True}), text=True)
                    for push in waiting:
                        await ws.send(push, text=True)
                    waiting.clear()
                    continue
                if op == "enqueue_each":
                    turn += 1
                    jobs = [
                        {"id": f"{turn:x}.{i}", "lease": "l", "payload": job["payload"]}
                        for i, job in enumerate(frame["jobs"])
                    ]
                    push = orjson.dumps({"push": "jobs", "jobs": jobs})
                    if workers:
                        await workers[turn % len(workers)].send(push, text=True)
                    else:
                        waiting.append(push)
                    reply = {"rid": rid, "ok": True, "results": [{"id": j["id"]} for j in jobs]}
                elif op == "ack_batch":
                    reply = {"rid": rid, "ok": True, "landed": [True] * len(frame["items"])}
                else:
                    raise ValueError(f"the relay speaks no {op!r}")
                await ws.send(orjson.dumps(reply), text=True)

        async with serve(handler, compare.HOST, 0, compression=None, max_size=None) as server:
            ports.put(server.sockets[0].getsockname()[1])
            await asyncio.Future()

    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())


class Relay(compare.System):
    """The relay as a system of the harness: latency only, and it holds no job."""

    def __init__(self) -> None:
        super().__init__("ws-relay", "conveyor", "memory")
        self._relay: Any = None

    def start(self) -> compare.Target:
        self.stop()
        ports = compare.CTX.Queue()
        self._relay = compare.spawn(relay_main, ports)
        self._target = compare.Target("conveyor", f"ws://{compare.HOST}:{ports.get(timeout=30)}/ws")
        return self._target

    def remaining(self) -> int:
        return 0  # it keeps nothing; the harness still checks each job came once

    def stop(self) -> None:
        if self._relay is not None:
            compare.stop_process(self._relay)
            self._relay = None
        self._target = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", default="conveyor-memory,beanstalkd")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    # py-beanstalkd: beanstalkd's protocol served by Python (bench/py_beanstalkd.py), for
    # the harness's beanstalkd clients: what a Python server in the middle costs alone.
    py_beanstalkd = latency_hops.StampedPyBeanstalk()
    known: dict[str, compare.System] = {**compare.all_systems(), "py-beanstalkd": py_beanstalkd}
    systems: list[compare.System] = [Relay()]
    for name in args.systems.split(","):
        if name not in known:
            parser.error(f"--systems: no system {name!r} (known: {', '.join(known)})")
        system = known[name]
        try:
            system.check()
        except compare.Skip as exc:
            print(f"SKIPPED {name}: {exc}")
            continue
        systems.append(system)
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


if __name__ == "__main__":
    multiprocessing.freeze_support()
    main()
