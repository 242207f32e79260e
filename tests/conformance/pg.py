"""A PostgreSQL database of a test's own: made with a unique name, dropped after.

The server is the one CI runs (``CONVEYOR_TEST_PG``, default 127.0.0.1:5432 as user
``postgres``). A test that needs it fails when it cannot be reached: never skipped,
so that a missing server cannot pass for a green suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
from collections.abc import AsyncIterator, Callable, Iterator

import psycopg
import pytest
from psycopg import sql

from conveyor.broker.backend.postgres import PostgresBackend
from conveyor.broker.scheduler import SteppedScheduler

SERVER = os.environ.get("CONVEYOR_TEST_PG", "host=127.0.0.1 port=5432 user=postgres")


async def _admin() -> psycopg.AsyncConnection[tuple[object, ...]]:
    try:
        return await psycopg.AsyncConnection.connect(
            f"{SERVER} dbname=postgres", autocommit=True, connect_timeout=10
        )
    except psycopg.OperationalError as exc:
        pytest.fail(
            f"PostgreSQL is not reachable at {SERVER!r} (set CONVEYOR_TEST_PG): {exc}",
            pytrace=False,
        )


@contextlib.asynccontextmanager
async def database() -> AsyncIterator[str]:
    """The DSN of a new, empty database, dropped (with whatever still holds it) after."""
    name = f"conveyor_test_{os.getpid()}_{secrets.token_hex(6)}"
    admin = await _admin()
    try:
        await admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield f"{SERVER} dbname={name}"
        finally:
            await admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
    finally:
        await admin.close()


@contextlib.contextmanager
def database_sync() -> Iterator[str]:
    """``database``, for a test without an event loop (a module's fixture)."""
    name = f"conveyor_test_{os.getpid()}_{secrets.token_hex(6)}"
    try:
        admin = psycopg.connect(f"{SERVER} dbname=postgres", autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        pytest.fail(
            f"PostgreSQL is not reachable at {SERVER!r} (set CONVEYOR_TEST_PG): {exc}",
            pytrace=False,
        )
    with admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            yield f"{SERVER} dbname={name}"
        finally:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


async def empty(dsn: str) -> None:
    """Empty the backend's tables in the database ``dsn``, if it has them (its schema
    stays: a backend opened next finds it up to date and an empty table)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT to_regclass('conveyor_jobs') IS NOT NULL")
        row = await cur.fetchone()
        if row is not None and row[0]:
            await conn.execute(
                "TRUNCATE conveyor_jobs, conveyor_queues, conveyor_counts, conveyor_meta, "
                "conveyor_parts, conveyor_part_news, conveyor_schedules RESTART IDENTITY"
            )


async def until(
    check: Callable[[], bool], what: str = "the awaited change", bound_s: float = 30.0
) -> None:
    """Wait on the real clock (news travels through the server, which tells no event
    here) until ``check()``; fail naming ``what`` past ``bound_s``, a bound that decides
    nothing on speed."""
    loop = asyncio.get_running_loop()
    end = loop.time() + bound_s
    while not check():
        assert loop.time() < end, f"not in {bound_s} s: {what}"
        await asyncio.sleep(0.01)


async def open_backend(dsn: str, clock: SteppedScheduler, seed: int = 0) -> PostgresBackend:
    """A broker's backend on the database ``dsn`` (its schema made), on ``clock``."""
    return await PostgresBackend.open(
        dsn, clock, max_payload_bytes=1 << 20, rng=random.Random(seed)
    )


async def db_now(dsn: str) -> float:
    """The database server's clock now: what ``conveyor_enqueue`` stamps its jobs with."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
        row = await cur.fetchone()
        assert row is not None
        return float(row[0])  # type: ignore[arg-type]
