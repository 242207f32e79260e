"""What a schedule's firing costs on PostgreSQL, by how many schedules the database holds.

    .venv/bin/python bench/pg_schedule_cost.py             # 10 and 10,000 idle schedules
    .venv/bin/python bench/pg_schedule_cost.py --idle 10,100000 --ticks 300

One broker's ``PostgresBackend`` on a stepped clock, in a database of its own
(``conveyor_bench_sched_<random>`` on BENCH_PG, by default
postgresql://postgres@127.0.0.1:5432/postgres, used only to create and drop it). It holds
one schedule of every second and ``idle`` others that are not due within the run (every
day, their first tick a day away). Each tick: the clock steps one second, the timer fires,
the backend fires the due schedule (a transaction: the due rows locked, the job
inserted, the schedule row updated; then the earliest tick looked up) and the test waits
for it to be done. Reported per firing, for each size: the wall time (median and 90th
percentile, the client's side: the round trips and the server's work), and the shared
buffers the two schedule statements touch (``EXPLAIN (ANALYZE, BUFFERS)`` of each, with
the plan's index), which is what would grow with the table if a pass scanned it. The
sizes take turns tick by tick, each in its own database, so that they share the load of
the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import secrets
import statistics
import time
from typing import Any

import psycopg
from psycopg import sql

from conveyor.broker.backend.postgres import (
    _DUE_SCHEDULES,
    _NEXT_SCHEDULE,
    PostgresBackend,
)
from conveyor.broker.engine import ScheduleSpec
from conveyor.broker.scheduler import SteppedScheduler

SERVER = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
START = 1_000_000.0
DAY = 86_400.0


def _dsn(dbname: str) -> str:
    return SERVER.rsplit("/", 1)[0] + "/" + dbname


async def _explain(dsn: str, query: str, params: dict[str, Any]) -> tuple[int, str]:
    """Shared buffers hit and read by ``query`` and the index its plan uses."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params)
        row = await cur.fetchone()
        assert row is not None
        plan = row[0][0]["Plan"]

        def indexes(node: dict[str, Any]) -> list[str]:
            names = [node["Index Name"]] if "Index Name" in node else []
            for child in node.get("Plans", []):
                names += indexes(child)
            return names

        # (A node's buffers count its children's: the top one's are the statement's.)
        buffers = int(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0))
        names = indexes(plan)
        return buffers, ",".join(sorted(set(names))) or "(no index)"


class Table:
    """One database holding ``idle`` schedules not due in the run, and one due every
    second, with one broker's backend on a stepped clock."""

    def __init__(self, idle: int) -> None:
        self.idle = idle
        self.name = f"conveyor_bench_sched_{secrets.token_hex(6)}"
        self.dsn = _dsn(self.name)
        self.clock = SteppedScheduler(start=START)
        self.backend: PostgresBackend | None = None
        self.times: list[float] = []

    async def open(self) -> None:
        with psycopg.connect(SERVER, autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
        self.backend = backend = await PostgresBackend.open(
            self.dsn, self.clock, max_payload_bytes=1 << 20, rng=random.Random(7)
        )
        # The idle ones, set together (calls made meanwhile share one transaction).
        await asyncio.gather(
            *(
                backend.set_schedule(
                    ScheduleSpec(
                        id=f"idle-{i:06d}", queue="idle", every_s=DAY, start_at=START + DAY
                    )
                )
                for i in range(self.idle)
            )
        )
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            await conn.execute("ANALYZE conveyor_schedules")
        await backend.set_schedule(ScheduleSpec(id="hot", queue="hot", every_s=1.0))

    async def tick(self) -> None:
        """One second on: the timer fires and the backend fires the hot schedule."""
        assert self.backend is not None
        await asyncio.sleep(0)
        began = time.perf_counter()
        self.clock.advance(1.0)
        await asyncio.sleep(0)
        await self.backend.settle()
        self.times.append(time.perf_counter() - began)

    async def report(self) -> dict[str, Any]:
        assert self.backend is not None
        (info,) = await self.backend.schedules(["hot"])
        assert info.fired == len(self.times), info
        due = await _explain(self.dsn, _DUE_SCHEDULES, {"now": self.clock.now(), "n": 100})
        nxt = await _explain(self.dsn, _NEXT_SCHEDULE, {})
        times = sorted(self.times)
        return {
            "idle": self.idle,
            "median_ms": statistics.median(times) * 1000,
            "p90_ms": times[int(len(times) * 0.9)] * 1000,
            "due_buffers": due[0],
            "due_index": due[1],
            "next_buffers": nxt[0],
            "next_index": nxt[1],
        }

    async def close(self) -> None:
        if self.backend is not None:
            await self.backend.close()
        with psycopg.connect(SERVER, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name))
            )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", default="10,10000", help="idle schedules, comma-separated")
    parser.add_argument("--ticks", type=int, default=200, help="firings measured per size")
    args = parser.parse_args()
    print(
        f"{'idle':>8} {'fire median ms':>15} {'p90 ms':>8} "
        f"{'due buffers':>12} {'min buffers':>12}  indexes"
    )
    tables = [Table(int(n)) for n in args.idle.split(",")]
    try:
        for table in tables:
            await table.open()
        # The sizes take turns, tick by tick, so that they share whatever else the
        # machine is doing.
        for _ in range(args.ticks):
            for table in tables:
                await table.tick()
        for table in tables:
            got = await table.report()
            print(
                f"{got['idle']:>8} {got['median_ms']:>15.2f} {got['p90_ms']:>8.2f} "
                f"{got['due_buffers']:>12} {got['next_buffers']:>12}  "
                f"{got['due_index']} / {got['next_index']}"
            )
    finally:
        for table in tables:
            await table.close()


if __name__ == "__main__":
    asyncio.run(main())
