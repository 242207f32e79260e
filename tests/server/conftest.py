"""Fixtures for server tests: a real broker on port 0, and raw WebSocket clients.

Tests synchronise on frames (``RawClient.request`` waits for the reply with the same
``rid``; ``next_push`` waits for a pushed frame), never on sleeps. Every wait has a
timeout so that a broken broker fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect

from conveyor.broker import connection
from conveyor.broker.config import Config
from conveyor.broker.scheduler import Scheduler
from conveyor.broker.server import Broker, running_broker

WAIT = 5.0  # seconds any single expected frame may take before the test fails


class RawClient:
    """A bare protocol client: one connection, frames as dicts, pushes kept aside."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self._rids = itertools.count(1)
        self._replies: dict[Any, dict[str, Any]] = {}
        self.pushes: list[dict[str, Any]] = []

    async def send(self, frame: dict[str, Any] | str | bytes) -> None:
        if isinstance(frame, dict):
            frame = orjson.dumps(frame).decode()
        await self.ws.send(frame)

    async def recv(self, timeout: float = WAIT) -> dict[str, Any]:
        """The next frame of any kind."""
        raw = await asyncio.wait_for(self.ws.recv(), timeout)
        frame: dict[str, Any] = orjson.loads(raw)
        return frame

    async def reply(self, rid: Any, timeout: float = WAIT) -> dict[str, Any]:
        """The reply to ``rid``, keeping any push that comes first."""
        async with asyncio.timeout(timeout):
            while rid not in self._replies:
                frame = await self.recv(timeout)
                if "push" in frame:
                    self.pushes.append(frame)
                else:
                    self._replies[frame.get("rid")] = frame
        return self._replies.pop(rid)

    async def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request and return its reply (ok or error)."""
        rid = next(self._rids)
        await self.send({"op": op, "rid": rid, **fields})
        return await self.reply(rid)

    async def call(self, op: str, **fields: Any) -> dict[str, Any]:
        """``request`` that asserts success."""
        frame = await self.request(op, **fields)
        assert frame["ok"] is True, frame
        return frame

    async def next_push(self, kind: str = "jobs", timeout: float = WAIT) -> dict[str, Any]:
        """The next pushed frame of ``kind`` (earlier ones kept by ``reply`` count first)."""
        async with asyncio.timeout(timeout):
            while True:
                for i, frame in enumerate(self.pushes):
                    if frame["push"] == kind:
                        return self.pushes.pop(i)
                frame = await self.recv(timeout)
                if "push" in frame:
                    self.pushes.append(frame)
                else:
                    self._replies[frame.get("rid")] = frame

    async def jobs(self, n: int, timeout: float = WAIT) -> list[dict[str, Any]]:
        """Exactly the next ``n`` pushed jobs, across as many frames as they come in."""
        got: list[dict[str, Any]] = []
        async with asyncio.timeout(timeout):
            while len(got) < n:
                got.extend((await self.next_push("jobs"))["jobs"])
        assert len(got) == n, f"expected {n} jobs, got {len(got)}"
        return got

    async def closed(self, timeout: float = WAIT) -> int | None:
        """Read until the broker closes the connection; return the close code."""
        async with asyncio.timeout(timeout):
            try:
                while True:
                    await self.ws.recv()
            except Exception:  # ConnectionClosed*, the end we wait for
                pass
        return self.ws.close_code


ClientFactory = Callable[..., Awaitable[RawClient]]


BASE = Config(port=0, disconnect_grace_s=0.0, sweep_interval_s=60.0, store="memory")


@pytest.fixture
def no_errors_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Fail the test if the broker (or websockets on its behalf) logs an error."""
    caplog.set_level(logging.INFO)
    yield
    records = caplog.get_records("setup") + caplog.get_records("call")
    errors = [r for r in records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


@pytest.fixture
def store_kind() -> str:
    """The store under the broker; modules about job flow run on both (``BOTH_STORES``)."""
    return "memory"


@pytest.fixture
def config_changes() -> dict[str, Any]:
    """Settings one test changes (see ``with_config``)."""
    return {}


@pytest.fixture
def config(store_kind: str, config_changes: dict[str, Any], tmp_path: Path) -> Config:
    """The broker's settings for one test."""
    return replace(BASE, store=store_kind, db_path=str(tmp_path / "conveyor.db"), **config_changes)


#: ``pytestmark = BOTH_STORES`` runs a module's tests on the memory and the SQLite store.
BOTH_STORES = pytest.mark.parametrize("store_kind", ["memory", "sqlite"])


@pytest.fixture
def scheduler() -> Scheduler | None:
    """The broker's clock and timers: the loop's and the wall clock's (``None``), unless a
    module makes time a test's to move (a ``SteppedScheduler``)."""
    return None


@pytest.fixture
async def broker(config: Config, scheduler: Scheduler | None) -> AsyncIterator[Broker]:
    async with running_broker(config, scheduler=scheduler) as running:
        yield running


@pytest.fixture
async def client(broker: Broker) -> AsyncIterator[ClientFactory]:
    """``await client(**connect_kwargs)`` opens a raw client to the test's broker."""
    opened: list[ClientConnection] = []

    async def open_client(**kwargs: Any) -> RawClient:
        ws = await connect(broker.url, **kwargs)
        opened.append(ws)
        return RawClient(ws)

    yield open_client
    for ws in opened:
        await ws.close()


def stalled_socket(url: str) -> socket.socket:
    """A connected socket with a small receive buffer, so a peer that stops reading shows."""
    host, port = url.removeprefix("ws://").split("/")[0].rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.setblocking(False)
    return sock


async def http_get(
    broker: Broker,
    target: str,
    headers: dict[str, str] | list[tuple[str, str]] | None = None,
    host: str | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """``GET target`` written byte for byte; the status, headers (lower-cased) and body.
    ``host`` replaces the ``Host`` header's value (the broker's address by default)."""
    assert broker.server is not None
    host_header = host
    host, port = next(iter(broker.server.sockets)).getsockname()[:2]
    reader, writer = await asyncio.open_connection(host, port)
    try:
        lines = [
            f"GET {target} HTTP/1.1",
            f"Host: {f'{host}:{port}' if host_header is None else host_header}",
            "Connection: close",
        ]
        pairs = headers.items() if isinstance(headers, dict) else headers or []
        lines += [f"{name}: {value}" for name, value in pairs]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        async with asyncio.timeout(WAIT):
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            status_line, *header_lines = head.removesuffix("\r\n\r\n").split("\r\n")
            found: dict[str, str] = {}
            for line in header_lines:
                name, _, value = line.partition(":")
                found[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(found["content-length"]))
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    return int(status_line.split()[1]), found, body


def with_config(**changes: Any) -> Any:
    """Change the broker's settings for one test: ``@with_config(max_prefetch=4)``."""
    return pytest.mark.parametrize("config_changes", [changes])


def record_writes(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every frame the brokers' connections write from now on, in the order written (the
    broker's own write path, ``Socket.write_text_frames``)."""
    written: list[bytes] = []
    write = connection.Socket.write_text_frames

    def recording(self: Any, outbox: Any, limit: int) -> int:
        queued = list(outbox)
        taken = write(self, outbox, limit)
        written.extend(queued[: len(queued) - len(outbox)])  # what this call took
        return taken

    monkeypatch.setattr(connection.Socket, "write_text_frames", recording)
    return written
