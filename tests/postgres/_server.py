"""A PostgreSQL server of a test's own, which the test may stop and start again: made
with ``initdb`` in a temporary directory, run as the user ``postgres`` on a free port of
127.0.0.1, and stopped (and its directory removed) when the test is done.

Autovacuum is off, so that nothing but the test writes on it (a poll that watches the
server's transactions sees only the test's). ``fsync`` is off: a server stopped with
``-m immediate`` still keeps what it committed (the operating system has it), which is
what a restart test needs; only a machine crash would lose it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

PG_BIN = Path(os.environ.get("CONVEYOR_PG_BIN", "/usr/lib/postgresql/15/bin"))
# Every command here ends in bounded time, or the test fails.
_TIMEOUT_S = 60


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PrivateServer:
    """One server: ``start``, ``crash`` (an immediate stop: no checkpoint, every session
    cut), ``start`` again; ``dsn`` reaches its database ``postgres``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.port = _free_port()
        self.dsn = f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"

    def _run(self, *args: str) -> None:
        done = subprocess.run(
            ["runuser", "-u", "postgres", "--", *args],
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stderr.strip()}")

    def init(self) -> None:
        self._run(
            str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
            "-E", "UTF8", "--no-sync",
        )  # fmt: skip

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c autovacuum=off -c fsync=off"
        )
        self._run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"),
            "-w", "-t", "30", "-o", options, "start",
        )  # fmt: skip

    def crash(self) -> None:
        self._run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "-t", "30",
            "stop",
        )  # fmt: skip

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()


@contextlib.contextmanager
def private_server() -> Iterator[PrivateServer]:
    """A new server, started; stopped and removed after, whatever happened."""
    root = Path(tempfile.mkdtemp(prefix="conveyor-pg-"))
    shutil.chown(root, "postgres", "postgres")
    server = PrivateServer(root)
    try:
        server.init()
        server.start()
        yield server
    finally:
        try:
            if server.running():
                server.crash()
        finally:
            shutil.rmtree(root, ignore_errors=True)
