"""Fixtures for SDK tests: a real broker on port 0, a probe on what it handles, a proxy.

The SDK is exercised as users run it (``Client``, ``SyncClient``, ``Worker``, the CLI),
against a real broker. Tests synchronise on events: a handler sets an ``asyncio.Event``,
or the ``Probe`` (which sees every request the in-process broker handles, with its
result) wakes a waiter each time a request was handled. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import pytest

from conveyor.broker import ops
from conveyor.broker.config import Config
from conveyor.broker.server import Broker, running_broker
from conveyor.sdk import Client, Worker
from conveyor.sdk._wire import Op

WAIT = 5.0  # seconds any single expected event may take before the test fails
ROOT = Path(__file__).resolve().parents[2]  # the repository

BASE_CONFIG = Config(port=0, disconnect_grace_s=0.0, sweep_interval_s=60.0, store="memory")


def with_config(**changes: Any) -> Any:
    """Parametrise the ``config`` fixture of one test: ``@with_config(max_payload_bytes=1024)``."""
    return pytest.mark.parametrize("config", [replace(BASE_CONFIG, **changes)])


@pytest.fixture
def config() -> Config:
    return BASE_CONFIG


@pytest.fixture
async def broker(config: Config) -> AsyncIterator[Broker]:
    async with running_broker(config) as running:
        yield running


@pytest.fixture
async def client(broker: Broker) -> AsyncIterator[Client]:
    async with Client(broker.url, connect_timeout=WAIT, request_timeout=WAIT) as c:
        yield c


# -- the probe ------------------------------------------------------------------------------


@dataclass
class Handled:
    """One request the broker handled successfully: its op, checked fields and result."""

    op: str
    fields: dict[str, Any]
    result: dict[str, Any]
    at: float  # time.monotonic() when it was handled

    @property
    def id(self) -> Any:
        return self.fields.get("id")


def _value(came: Any) -> Any:
    """A reply's result, or ``None`` for one that failed (its error went to the peer)."""
    try:
        return came.result()
    except Exception:
        return None


class Probe:
    """Sees every request any in-process broker handles, and wakes waiters on each."""

    def __init__(self) -> None:
        self.log: list[Handled] = []
        self._changed = asyncio.Event()

    def wrap(self, op: Op, handler: Callable[..., Any]) -> Callable[..., Any]:
        def probed(conn: Any, fields: dict[str, Any]) -> Any:
            result = handler(conn, fields)
            if not hasattr(result, "done"):  # (a wait's is answered on its own: not logged)
                self._logged(op, fields, result if isinstance(result, dict) else None)
            else:  # a reply that is there at once (``Ready``) or comes later: logged then
                result.add_done_callback(lambda came: self._logged(op, fields, _value(came)))
            return result

        return probed

    def _logged(self, op: Op, fields: dict[str, Any], result: Any) -> None:
        self.log.append(Handled(op.value, dict(fields), dict(result or {}), time.monotonic()))
        self._changed.set()

    def poke(self) -> None:
        """Wake the waiters to re-check (for changes that are not broker requests)."""
        self._changed.set()

    def beats(self, job_id: str) -> list[bool]:
        """Whether each lease heartbeat the broker handled for ``job_id`` landed, in order
        (``heartbeat`` and the entries of ``heartbeat_batch`` alike)."""
        landed: list[bool] = []
        for h in self.log:
            if h.op == "heartbeat" and h.id == job_id:
                landed.append(h.result["landed"])
            elif h.op == "heartbeat_batch":
                items = h.fields["items"]
                pairs = zip(items, h.result["landed"], strict=True)
                landed += [ok for item, ok in pairs if item["id"] == job_id]
        return landed

    def handled(self, op: str, job_id: str | None = None) -> list[Handled]:
        """The requests of ``op`` (for ``job_id``) the broker handled, in order. Each entry
        of an ``ack_batch`` counts as an ``ack`` of its own, with its own ``landed``, and
        each entry of an ``enqueue_each`` as an ``enqueue``, with its own result."""
        return [h for h in self._expanded() if h.op == op and (job_id is None or h.id == job_id)]

    def _expanded(self) -> Iterator[Handled]:
        for h in self.log:
            if h.op == "ack_batch":
                for item, landed in zip(h.fields["items"], h.result["landed"], strict=True):
                    yield Handled("ack", dict(item), {"landed": landed}, h.at)
            elif h.op == "enqueue_each":
                for item, result in zip(h.fields["jobs"], h.result["results"], strict=True):
                    yield Handled("enqueue", dict(item), result, h.at)
            else:
                yield h

    async def wait_for(self, predicate: Callable[[], Any], timeout: float = WAIT) -> Any:
        """Return ``predicate()`` once it is truthy, re-checking after each handled request."""
        try:
            async with asyncio.timeout(timeout):
                while True:
                    found = predicate()
                    if found:
                        return found
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            raise AssertionError(
                f"not seen within {timeout} s; the broker handled: {[h.op for h in self.log]}"
            ) from None

    async def report(self, op: str, job_id: str | None, timeout: float = WAIT) -> Handled:
        """The first ``op`` (ack, retry, fail, ...) the broker handled for ``job_id``."""
        found: list[Handled] = await self.wait_for(lambda: self.handled(op, job_id), timeout)
        return found[0]

    async def count(
        self, op: str, n: int, job_id: str | None = None, timeout: float = WAIT
    ) -> list[Handled]:
        """Wait until the broker handled ``op`` (for ``job_id``) ``n`` times; return them all."""

        def enough() -> list[Handled] | None:
            found = self.handled(op, job_id)
            return found if len(found) >= n else None

        found: list[Handled] = await self.wait_for(enough, timeout)
        return found


@pytest.fixture
def probe(monkeypatch: pytest.MonkeyPatch) -> Probe:
    p = Probe()
    for op, handler in list(ops.HANDLERS.items()):
        monkeypatch.setitem(ops.HANDLERS, op, p.wrap(op, handler))
    return p


# -- running a worker -----------------------------------------------------------------------


@contextlib.asynccontextmanager
async def running(worker: Worker, probe: Probe) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``worker`` until the block ends; yield its ``run()`` task once it subscribed."""
    subscribed = len(probe.handled("subscribe"))
    task = asyncio.get_running_loop().create_task(worker.run())
    task.add_done_callback(lambda _: probe.poke())
    try:
        await probe.wait_for(lambda: task.done() or len(probe.handled("subscribe")) > subscribed)
        if task.done():
            task.result()  # raise what stopped it
        yield task
    finally:
        worker.stop()
        try:
            async with asyncio.timeout(worker.shutdown_timeout_s + WAIT):
                await asyncio.shield(task)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def free_port() -> int:
    """A port nothing listens on (bound and released)."""
    (port,) = free_ports(1)
    return port


def free_ports(n: int) -> list[int]:
    """``n`` different ports nothing listens on: all bound at once, then released (one
    at a time, a port released could come back as the next)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


# -- a TCP proxy that can cut connections ---------------------------------------------------


async def _read_ws_frame(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One WebSocket frame as sent (raw bytes) and its unmasked payload."""
    head = await reader.readexactly(2)
    length = head[1] & 0x7F
    extended = b""
    if length == 126:
        extended = await reader.readexactly(2)
        length = int.from_bytes(extended, "big")
    elif length == 127:
        extended = await reader.readexactly(8)
        length = int.from_bytes(extended, "big")
    mask = await reader.readexactly(4) if head[1] & 0x80 else b""
    data = await reader.readexactly(length)
    raw = head + extended + mask + data
    if mask:
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
    return raw, data


class _Pair:
    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream = upstream
        self.dead = False

    def drop(self) -> None:
        """Drop both sockets: nothing more goes either way."""
        self.dead = True
        self.client.transport.abort()
        self.upstream.close()  # after the bytes already written to the broker


class Proxy:
    """Forwards TCP between clients and a broker on 127.0.0.1; can drop connections.

    ``cut_after`` set to some bytes: the first client->broker WebSocket frame whose
    payload contains them is forwarded, then both sockets are dropped (the broker gets
    the request, its reply is lost). ``cut()`` drops every open connection now. It keeps
    accepting new connections either way.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.cut_after: bytes | None = None
        self.cuts = 0
        self.accepted = 0
        self._pairs: set[_Pair] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self.listen_port = 0

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.listen_port}/ws"

    async def __aenter__(self) -> Proxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.listen_port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.cut()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def cut(self) -> None:
        for pair in list(self._pairs):
            pair.drop()
        self._pairs.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        pair = _Pair(writer, up_writer)
        self._pairs.add(pair)
        loop = asyncio.get_running_loop()
        tasks = [
            loop.create_task(self._upstream(pair, reader)),
            loop.create_task(self._downstream(pair, up_reader)),
        ]
        self._tasks.update(tasks)
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._pairs.discard(pair)
            if not pair.dead:
                pair.dead = True
                writer.close()
                up_writer.close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self._tasks.difference_update(tasks)

    async def _upstream(self, pair: _Pair, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            pair.upstream.write(await reader.readuntil(b"\r\n\r\n"))  # the HTTP upgrade
            while not pair.dead:
                raw, data = await _read_ws_frame(reader)
                if pair.dead:
                    return
                pair.upstream.write(raw)
                await pair.upstream.drain()
                if self.cut_after is not None and self.cut_after in data:
                    self.cut_after = None
                    self.cuts += 1
                    self._pairs.discard(pair)
                    pair.drop()
                    return

    async def _downstream(self, pair: _Pair, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(ConnectionError):
            while True:
                data = await reader.read(65536)
                if not data or pair.dead:
                    return
                pair.client.write(data)
                await pair.client.drain()


@pytest.fixture
async def proxy(broker: Broker) -> AsyncIterator[Proxy]:
    port = int(broker.url.rsplit(":", 1)[1].split("/", 1)[0])
    async with Proxy(port) as p:
        yield p


# -- a broker in a subprocess, for SyncClient and the CLI -----------------------------------


class Lines:
    """A subprocess stream read line by line in a thread, so reads can be bounded."""

    def __init__(self, stream: IO[str]) -> None:
        self._lines: queue.Queue[str] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put("")  # end of stream

    def join(self, timeout: float = WAIT) -> None:
        """Wait for the end of the stream (the process exited)."""
        self._thread.join(timeout)

    def next(self, timeout: float = WAIT) -> str:
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout} s") from None


def conveyor(*args: str) -> list[str]:
    """The command line of ``conveyor ARGS`` (as ``python -m conveyor``)."""
    return [sys.executable, "-m", "conveyor", *args]


@pytest.fixture(scope="session")
def broker_process() -> Iterator[str]:
    """``conveyor serve --port 0`` in a subprocess; yields its URL (first stdout line)."""
    proc = subprocess.Popen(
        conveyor("serve", "--port", "0", "--store", "memory", "--log-level", "warning"),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    lines = Lines(proc.stdout)
    try:
        line = lines.next(timeout=15)
        assert line.startswith("conveyor listening on ws://"), line
        yield line.split()[3]
    finally:
        stop(proc)
        lines.join()
        proc.stdout.close()


def stop(proc: subprocess.Popen[str], timeout: float = WAIT) -> int:
    """SIGTERM ``proc`` and wait for it (SIGKILL if it does not exit in time)."""
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
