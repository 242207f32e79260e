"""The database file across restarts: what the broker refuses, and what it keeps.

* A corrupted or unreadable file stops ``conveyor serve`` at start with exit status 2
  and one message naming the file, and leaves the file as it was: never a silent
  empty table over someone's jobs.
* A clean stop (SIGTERM) and a start keep every job, field for field.
* A lease valid at a SIGKILL stays valid: its worker re-attaches it with ``subscribe``
  after the restart and its ack lands; a lease nobody re-attaches lapses after the
  disconnect grace, and the job goes to the next worker.

Brokers run as real processes (``python -m conveyor serve``) on 127.0.0.1; every wait is
bounded, and every process is stopped in a ``finally``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import socket
import sqlite3
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from conveyor.broker.store import SqliteStore
from conveyor.sdk import Client

from ..server.conftest import RawClient

ROOT = Path(__file__).resolve().parents[2]
START = 15.0  # seconds a broker may take to start listening, or to refuse
WAIT = 5.0  # seconds any other expected event may take
LISTENING = re.compile(rb"conveyor listening on (ws://127\.0\.0\.1:\d+/ws) \(store: sqlite .*\)\n")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def start(
    db: Path,
    *flags: str,
    port: int = 0,
    grace_s: float = 5.0,
    preexec: Callable[[], None] | None = None,
) -> asyncio.subprocess.Process:
    """``conveyor serve`` on ``db`` with ``flags`` added; ``preexec`` runs in the child
    before the broker does (to set its limits)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conveyor", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--store", "sqlite", "--db", str(db), "--disconnect-grace", str(grace_s),
        "--log-level", "warning", *flags,
        cwd=ROOT, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, preexec_fn=preexec,
    )  # fmt: skip


@dataclass
class Served:
    proc: asyncio.subprocess.Process
    url: str
    stderr: str = ""  # what it wrote there, once stopped

    async def stop(self, sig: int = signal.SIGTERM) -> int:
        """Signal the broker and reap it; its exit status."""
        self.proc.send_signal(sig)
        _, err = await asyncio.wait_for(self.proc.communicate(), WAIT)
        self.stderr = err.decode()
        assert self.proc.returncode is not None
        return self.proc.returncode


@contextlib.asynccontextmanager
async def serving(
    db: Path,
    *flags: str,
    port: int = 0,
    grace_s: float = 5.0,
    preexec: Callable[[], None] | None = None,
) -> AsyncIterator[Served]:
    """A broker on ``db``, once it printed its listening line; killed at the end if alive."""
    proc = await start(db, *flags, port=port, grace_s=grace_s, preexec=preexec)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), START)
        match = LISTENING.fullmatch(line)
        assert match, line
        yield Served(proc, match[1].decode())
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()


async def refused(db: Path, *flags: str) -> tuple[int | None, bytes, str]:
    """Start a broker on ``db`` that is to refuse it: its exit status, its stdout and its
    stderr, once it has exited (killed at the end if it did not)."""
    proc = await start(db, *flags)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), START)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()
    return proc.returncode, out, err.decode()


# -- files that must be refused -------------------------------------------------------------


def real_database(path: Path, jobs: int = 2000) -> None:
    """A Conveyor database with ``jobs`` pending jobs, written through the store."""
    store = SqliteStore(path)
    table = store.load(clock=lambda: 1_000_000.0, rng=random.Random(0), max_payload_bytes=1 << 20)
    queue = table.queue("emails")
    for n in range(jobs):
        queue.enqueue({"n": n, "to": "someone@example.com", "body": "x" * 60})
    store.write(table.take_changes())
    store.close()  # the last connection checkpoints: everything is in the main file


def random_bytes(path: Path) -> None:
    path.write_bytes(random.Random(6).randbytes(16384))


def truncated(path: Path) -> None:
    real_database(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def another_programs(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        db.execute("INSERT INTO users (name) VALUES ('ada'), ('grace')")
        db.commit()


def newer_schema(path: Path) -> None:
    real_database(path, jobs=3)
    with contextlib.closing(sqlite3.connect(path)) as db:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        db.execute(f"PRAGMA user_version = {version + 1}")


def a_directory(path: Path) -> None:
    path.mkdir()
    (path / "keep").write_text("not a database")


def contents(path: Path) -> object:
    """What is at ``path`` (bytes, or a directory's listing), to see it was left alone."""
    if path.is_dir():
        return sorted(p.name for p in path.iterdir())
    return path.read_bytes()


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (random_bytes, "unreadable or corrupt database"),
        (truncated, "unreadable or corrupt database"),
        (another_programs, "not a Conveyor database"),
        (newer_schema, "made by a newer Conveyor"),
        (a_directory, "cannot open"),
    ],
    ids=["random bytes", "truncated", "another program's", "newer schema", "a directory"],
)
async def test_a_bad_database_file_stops_the_broker_with_a_message_naming_it(
    tmp_path: Path, make: Callable[[Path], None], says: str
) -> None:
    path = tmp_path / "conveyor.db"
    make(path)
    before = contents(path)
    log = tmp_path / "conveyor.db-claims"  # there if make used the store
    log_before = log.read_bytes() if log.exists() else None
    returncode, out, message = await refused(path)
    assert returncode == 2, message
    assert out == b""  # it never listened
    assert message.startswith(f"conveyor: {path}: "), message
    assert says in message, message
    assert "Traceback" not in message
    assert message.count("\n") == 1, message  # one line
    assert contents(path) == before  # left as it was, not made into an empty table
    # Nothing made or changed beside it either.
    assert (log.read_bytes() if log.exists() else None) == log_before


async def test_a_database_in_a_directory_that_does_not_exist_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "missing" / "conveyor.db"
    returncode, out, message = await refused(path)
    assert returncode == 2, message
    assert out == b""
    assert message == f"conveyor: {path}: cannot open: no directory {path.parent}\n"
    assert not path.parent.exists()  # nothing made on the way


async def test_a_second_broker_on_the_same_database_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "conveyor.db"
    async with serving(db) as first:
        async with Client(first.url, connect_timeout=WAIT, request_timeout=WAIT) as client:
            job = await client.enqueue("emails", {"to": "a@b.c"})
            returncode, out, message = await refused(db)
            assert returncode == 2, message
            assert out == b""  # it never listened
            assert message.startswith(f"conveyor: {db}-claims: locked: "), message
            assert "another Conveyor broker has this database open" in message, message
            assert "Traceback" not in message and message.count("\n") == 1, message
            # The first goes on as before, its job and its claim log untouched.
            info = await client.get_job(job)
            assert info is not None and info.state == "ready"
            await client.enqueue("emails", {"to": "d@e.f"})
        assert await first.stop() == 0
    # Once the first has stopped, a broker starts on the database and finds both jobs.
    async with serving(db) as third:
        async with Client(third.url, connect_timeout=WAIT, request_timeout=WAIT) as client:
            assert (await client.stats("emails"))["emails"]["ready"] == 2


def test_the_truncated_file_held_jobs_before_it_was_cut(tmp_path: Path) -> None:
    # The refusal above is about a file that had jobs: the whole one loads them all.
    path = tmp_path / "whole.db"
    real_database(path)
    store = SqliteStore(path)
    try:
        table = store.load(clock=lambda: 1_000_000.0, rng=random.Random(0), max_payload_bytes=1024)
        assert table.queue("emails").stats().ready == 2000
    finally:
        store.close()


# -- what a restart keeps -------------------------------------------------------------------


async def test_a_clean_restart_keeps_every_job_field_for_field(tmp_path: Path) -> None:
    db = tmp_path / "conveyor.db"
    async with serving(db) as first:
        async with Client(first.url, connect_timeout=WAIT, request_timeout=WAIT) as client:
            ids = [
                await client.enqueue("emails", {"to": "a@b.c"}),
                await client.enqueue(
                    "emails", {"n": [1, 2.5, None], "s": "é"}, priority=7, max_attempts=9, key="k1"
                ),
                await client.enqueue(
                    "reports",
                    "text",
                    delay_s=3600,
                    expires_s=7200,
                    visibility_timeout_s=12.5,
                    backoff_base_s=0.5,
                ),
            ]
            await client.pause("reports")
            # One dead job, failed by a worker with an error.
            worker = RawClient(await connect(first.url))
            try:
                await worker.call("subscribe", worker_id="w", queues=["doomed"], prefetch=1)
                ids.append(await client.enqueue("doomed", {"bad": True}))
                [job] = await worker.jobs(1)
                assert (await worker.call("fail", id=job["id"], lease=job["lease"], error="no"))[
                    "landed"
                ]
            finally:
                await worker.ws.close()
            before = {job_id: await client.get_job(job_id) for job_id in ids}
            stats_before = await client.stats()
        assert await first.stop() == 0

    async with serving(db) as second:
        async with Client(second.url, connect_timeout=WAIT, request_timeout=WAIT) as client:
            after = {job_id: await client.get_job(job_id) for job_id in ids}
            stats_after = await client.stats()
            # The key still names its job: the same enqueue is not stored again.
            assert await client.enqueue("emails", {"again": 1}, key="k1") == ids[1]
        assert await second.stop() == 0

    assert all(before.values())
    assert [info.state for info in before.values() if info] == [
        "ready",
        "ready",
        "scheduled",
        "dead",
    ]
    assert after == before
    assert stats_after == stats_before
    assert stats_after["reports"]["paused"] is True
    assert stats_after["reports"]["scheduled"] == 1
    assert stats_after["doomed"]["dead"] == 1


async def test_a_lease_valid_at_a_sigkill_is_reattached_after_the_restart_and_its_ack_lands(
    tmp_path: Path,
) -> None:
    db = tmp_path / "conveyor.db"
    port = free_port()
    async with serving(db, port=port, grace_s=30.0) as first:
        worker = RawClient(await connect(first.url))
        await worker.call("subscribe", worker_id="w-1", queues=["q"], prefetch=1)
        job_id = (await worker.call("enqueue", queue="q", payload={"n": 1}))["id"]
        [pushed] = await worker.jobs(1)  # pushed only once its claim was on disk
        assert pushed["id"] == job_id
        await first.stop(signal.SIGKILL)
        await worker.ws.close()

    async with serving(db, port=port, grace_s=30.0) as second:
        worker = RawClient(await connect(second.url))
        try:
            job = (await worker.call("get_job", id=job_id))["job"]
            assert (job["state"], job["worker_id"], job["attempts"]) == ("processing", "w-1", 1)
            reply = await worker.call(
                "subscribe",
                worker_id="w-1",
                queues=["q"],
                prefetch=1,
                leases=[{"id": job_id, "lease": pushed["lease"]}],
            )
            assert reply["reattached"] == [job_id]
            ack = await worker.call("ack", id=job_id, lease=pushed["lease"])
            assert ack["landed"] is True
            assert (await worker.call("get_job", id=job_id))["job"] is None
            stats = (await worker.call("stats", queue="q"))["queues"]["q"]
        finally:
            await worker.ws.close()
        assert await second.stop() == 0
    assert (stats["ready"], stats["processing"], stats["totals"]["completed"]) == (0, 0, 1)


async def test_a_lease_nobody_reattaches_after_a_restart_lapses_after_the_grace(
    tmp_path: Path,
) -> None:
    db = tmp_path / "conveyor.db"
    port = free_port()
    async with serving(db, port=port, grace_s=0.5) as first:
        gone = RawClient(await connect(first.url))
        await gone.call("subscribe", worker_id="gone", queues=["q"], prefetch=1)
        job_id = (await gone.call("enqueue", queue="q", payload={"n": 1}))["id"]
        [pushed] = await gone.jobs(1)
        await first.stop(signal.SIGKILL)
        await gone.ws.close()

    async with serving(db, port=port, grace_s=0.5) as second:
        other = RawClient(await connect(second.url))
        try:
            await other.call("subscribe", worker_id="other", queues=["q"], prefetch=1)
            # "gone" never comes back: after the grace its lease lapses, and the job is
            # pushed here as its second attempt (not after its 300 s visibility timeout).
            [again] = await other.jobs(1, timeout=WAIT)
            assert (again["id"], again["attempt"]) == (job_id, 2)
            assert again["lease"] != pushed["lease"]
            late = await other.call("ack", id=job_id, lease=pushed["lease"])
            assert late["landed"] is False
            assert (await other.call("ack", id=job_id, lease=again["lease"]))["landed"] is True
        finally:
            await other.ws.close()
        assert await second.stop() == 0
