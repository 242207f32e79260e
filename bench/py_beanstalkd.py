"""A minimal beanstalkd in Python: the floor of any Python broker's latency.

``bench/relay_floor.py`` runs it beside the real beanstalkd (C), with the harness's own
beanstalkd clients unchanged on both: the same publisher, the same greenstalk workers,
the same protocol. Only the server differs, so the gap between the two is what a
Python process in the middle costs on the latency path, before any WebSocket framing,
JSON or job rules.

It speaks the part of beanstalkd's text protocol the harness uses (``use``, ``watch``,
``ignore``, ``put``, ``reserve-with-timeout``, ``delete``, ``stats-tube``, ``quit``),
with one FIFO per tube and no priorities, delays, TTRs or binlog. It runs on uvloop when
installed, as ``conveyor serve`` does, and is not a broker: it keeps nothing a client
could rely on.

    python bench/py_beanstalkd.py PORT [STAMPS]   # serve on 127.0.0.1:PORT until killed

With ``STAMPS``, it notes when it read each ``put`` (the start of the read that carried
it) and when it started and ended the write of each job to a worker, and writes those
times to that file when it stops (``bench/latency_hops.py``
splits each job's latency with them).
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import re
import signal
import sys
import time
from typing import Any

HOST = "127.0.0.1"
# With STAMPS: (monotonic time, "R" for a put read, "S" or "W" for the start or end of a
# job's write, its body).
STAMPS: list[tuple[float, str, bytes]] | None = None


class Tube:
    def __init__(self) -> None:
        self.ready: collections.deque[tuple[int, bytes]] = collections.deque()
        self.waiting: collections.deque[Conn] = collections.deque()  # reservers, in order
        self.reserved = 0


class Server:
    def __init__(self) -> None:
        self.tubes: dict[bytes, Tube] = collections.defaultdict(Tube)
        self.next_id = 0
        self.owner: dict[int, tuple[bytes, Conn]] = {}  # reserved job -> tube, reserver


class Conn(asyncio.Protocol):
    """One client: commands are read from ``buf`` as whole lines (and bodies)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.buf = bytearray()
        self.use = b"default"
        self.watching = [b"default"]
        self.timer: asyncio.TimerHandle | None = None
        self.waiting_on: list[Tube] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()

    def data_received(self, data: bytes) -> None:
        read_at = time.monotonic() if STAMPS is not None else 0.0
        buf = self.buf
        buf += data
        out: list[bytes] = []
        while True:
            end = buf.find(b"\r\n")
            if end < 0:
                break
            line = bytes(buf[:end])
            if line.startswith(b"put "):
                size = int(line.rsplit(b" ", 1)[1])
                if len(buf) < end + 2 + size + 2:
                    break  # the body is not all here yet
                body = bytes(buf[end + 2 : end + 2 + size])
                del buf[: end + 2 + size + 2]
                if STAMPS is not None:
                    STAMPS.append((read_at, "R", body))
                out.append(self.put(body))
                continue
            del buf[: end + 2]
            reply = self.command(line)
            if reply:
                out.append(reply)
        if out:
            self.transport.write(b"".join(out))

    def command(self, line: bytes) -> bytes:
        words = line.split()
        verb = words[0]
        if verb == b"reserve-with-timeout":
            return self.reserve(int(words[1]))
        if verb == b"delete":
            job = int(words[1])
            owned = self.server.owner.pop(job, None)
            if owned is None:
                return b"NOT_FOUND\r\n"
            self.server.tubes[owned[0]].reserved -= 1
            return b"DELETED\r\n"
        if verb == b"use":
            self.use = words[1]
            return b"USING %s\r\n" % self.use
        if verb == b"watch":
            if words[1] not in self.watching:
                self.watching.append(words[1])
            return b"WATCHING %d\r\n" % len(self.watching)
        if verb == b"ignore":
            if words[1] in self.watching and len(self.watching) > 1:
                self.watching.remove(words[1])
            return b"WATCHING %d\r\n" % len(self.watching)
        if verb == b"stats-tube":
            tube = self.server.tubes.get(words[1])
            if tube is None:
                return b"NOT_FOUND\r\n"
            body = b"---\ncurrent-jobs-ready: %d\ncurrent-jobs-reserved: %d\n" % (
                len(tube.ready),
                tube.reserved,
            )
            body += b"current-jobs-delayed: 0\ncurrent-jobs-buried: 0\n"
            return b"OK %d\r\n%s\r\n" % (len(body), body)
        if verb == b"quit":
            self.transport.close()
            return b""
        return b"UNKNOWN_COMMAND\r\n"

    def put(self, body: bytes) -> bytes:
        server = self.server
        server.next_id += 1
        job = server.next_id
        tube = server.tubes[self.use]
        while tube.waiting:
            conn = tube.waiting.popleft()
            if conn.waiting_on:  # still waiting (not timed out, not closed)
                conn.give(self.use, tube, job, body)
                return b"INSERTED %d\r\n" % job
        tube.ready.append((job, body))
        return b"INSERTED %d\r\n" % job

    def reserve(self, timeout: int) -> bytes:
        for name in self.watching:
            tube = self.server.tubes[name]
            if tube.ready:
                job, body = tube.ready.popleft()
                tube.reserved += 1
                self.server.owner[job] = (name, self)
                if STAMPS is not None:  # (written with this command's other replies)
                    now = time.monotonic()
                    STAMPS.append((now, "S", body))
                    STAMPS.append((now, "W", body))
                return b"RESERVED %d %d\r\n%s\r\n" % (job, len(body), body)
        if timeout <= 0:
            return b"TIMED_OUT\r\n"
        self.waiting_on = [self.server.tubes[name] for name in self.watching]
        for tube in self.waiting_on:
            tube.waiting.append(self)
        self.timer = asyncio.get_running_loop().call_later(timeout, self.timed_out)
        return b""

    def give(self, name: bytes, tube: Tube, job: int, body: bytes) -> None:
        self._stop_waiting()
        tube.reserved += 1
        self.server.owner[job] = (name, self)
        if STAMPS is not None:
            STAMPS.append((time.monotonic(), "S", body))
        self.transport.write(b"RESERVED %d %d\r\n%s\r\n" % (job, len(body), body))
        if STAMPS is not None:
            STAMPS.append((time.monotonic(), "W", body))

    def timed_out(self) -> None:
        self.timer = None
        self._stop_waiting()
        self.transport.write(b"TIMED_OUT\r\n")

    def _stop_waiting(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        for tube in self.waiting_on:
            try:
                tube.waiting.remove(self)
            except ValueError:
                pass  # already taken off by put
        self.waiting_on = []


async def serve(port: int) -> None:
    server = Server()
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(lambda: Conn(server), HOST, port)
    stopped = loop.create_future()
    loop.add_signal_handler(signal.SIGTERM, stopped.set_result, None)  # atexit runs then
    async with listener:
        print(f"listening on {HOST}:{port}", flush=True)
        await stopped


def main() -> None:
    global STAMPS
    port = int(sys.argv[1])
    if len(sys.argv) > 2:
        STAMPS = []
        atexit.register(write_stamps, sys.argv[2], STAMPS)
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(port))
    else:
        uvloop.run(serve(port))


def write_stamps(path: str, stamps: list[tuple[float, str, bytes]]) -> None:
    """One line per stamp: ``R|S|W <seq> <sent> <time>`` (the seq and sent of the harness's
    job bodies, the format ``bench/latency_hops.py`` reads)."""
    found = re.compile(rb'"seq":(\d+),"sent":([0-9.eE+-]+)')
    with open(path, "wb") as out:
        for at, kind, body in stamps:
            for seq, sent in found.findall(body):
                out.write(b"%s %s %s %r\n" % (kind.encode(), seq, sent, at))


if __name__ == "__main__":
    main()
