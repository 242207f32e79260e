"""What releasing (or killing) a dependency's waiting jobs costs on PostgreSQL, by how many
other jobs wait (docs/contract.md, DEP-14).

    .venv/bin/python bench/pg_deps_cost.py                   # 1,000 and 50,000 waiting
    .venv/bin/python bench/pg_deps_cost.py --idle 1000,200000 --fan 10

For each size, a database of its own (``conveyor_bench_deps_<random>`` on BENCH_PG, by
default postgresql://postgres@127.0.0.1:5432/postgres, used only to create and drop it)
holds ``idle`` jobs waiting each for a dependency of its own that is never acked, made
through one broker's ``PostgresBackend`` (groups of a dependency and its dependent).
Then one more dependency with ``fan`` jobs waiting for it, claimed. Measured, in a
transaction rolled back after each (so that every round sees the same table): the
statements that run when its ack lands (``conveyor_deps_met``: its edges met, its
dependents released) and when it dies instead (``conveyor_deps_doom``), each under
``EXPLAIN (ANALYZE, BUFFERS)``: the shared buffers touched (the function's own
statements included) and the server's time, median of the rounds; and the plans of
the function's two main statements, with the indexes they read. The buffers are what
would grow with ``idle`` if a release walked the waiting jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
from typing import Any

import psycopg
from psycopg import sql

from conveyor.broker.backend import Claim, Enqueue
from conveyor.broker.backend.postgres import PostgresBackend
from conveyor.broker.scheduler import SteppedScheduler

SERVER = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
START = 1_000_000.0
CHUNK = 500


def _dsn(dbname: str) -> str:
    return SERVER.rsplit("/", 1)[0] + "/" + dbname


def _indexes(node: dict[str, Any]) -> list[str]:
    names = [node["Index Name"]] if "Index Name" in node else []
    for child in node.get("Plans", []):
        names += _indexes(child)
    return names


async def _explain(
    conn: psycopg.AsyncConnection[Any], setup: str, query: str, params: tuple[Any, ...]
) -> tuple[int, float, str]:
    """Shared buffers and server milliseconds of ``query`` after ``setup``, both in a
    transaction rolled back, and the indexes its plan names."""
    async with conn.transaction(force_rollback=True):
        if setup:
            await conn.execute(setup, params[:1])
        cur = await conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params)
        row = await cur.fetchone()
        assert row is not None
        top = row[0][0]
        plan = top["Plan"]
        buffers = int(plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0))
        return buffers, float(top["Execution Time"]), ",".join(sorted(set(_indexes(plan))))


async def measure(idle: int, fan: int, rounds: int) -> dict[str, Any]:
    name = f"conveyor_bench_deps_{secrets.token_hex(6)}"
    async with await psycopg.AsyncConnection.connect(SERVER, autocommit=True) as admin:
        await admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = _dsn(name)
    try:
        backend = await PostgresBackend.open(
            dsn, SteppedScheduler(start=START), max_payload_bytes=1 << 20
        )
        try:
            for start in range(0, idle, CHUNK):
                group: list[Enqueue] = []
                for i in range(start, min(idle, start + CHUNK)):
                    group.append(Enqueue("roots", i, delay_s=86_400.0))
                    group.append(Enqueue("q", i, after=(len(group) - 1,)))
                await backend.enqueue_group(group)
            (dep,) = await backend.enqueue([Enqueue("hot", "dep")])
            assert isinstance(dep, str)
            await backend.enqueue([Enqueue("q", i, after=(dep,)) for i in range(fan)])
            ((_claimed,),) = await backend.claim([Claim("w", ("hot",), 1)])
            seq = int(dep.removeprefix(backend.id_prefix), 16)
            now = backend.now()
        finally:
            await backend.close()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("ANALYZE")
            out: dict[str, Any] = {"idle": idle, "fan": fan}
            for label, setup, query, params in (
                (
                    "ack: conveyor_deps_met",
                    "DELETE FROM conveyor_jobs WHERE seq = %s",
                    "SELECT * FROM conveyor_deps_met(ARRAY[%s]::bigint[], "
                    "ARRAY[NULL]::bytea[], %s)",
                    (seq, now),
                ),
                (
                    "death: conveyor_deps_doom",
                    "",
                    "SELECT conveyor_deps_doom(ARRAY[%s]::bigint[], ARRAY['x'], %s)",
                    (seq, now),
                ),
            ):
                runs = [await _explain(conn, setup, query, params) for _ in range(rounds)]
                out[label] = (
                    statistics.median(r[0] for r in runs),
                    statistics.median(r[1] for r in runs),
                )
            for label, query in (
                (
                    "plan: edges met",
                    "UPDATE conveyor_deps d SET met = true WHERE d.dep = ANY(ARRAY[%s]::bigint[]) "
                    "AND NOT d.met RETURNING d.job",
                ),
                (
                    "plan: dependents released",
                    "UPDATE conveyor_jobs j SET state = 'pending', waiting_for = 0 "
                    "WHERE j.seq IN (SELECT d.job FROM conveyor_deps d "
                    "WHERE d.dep = %s AND NOT d.met) AND j.state = 'waiting'",
                ),
            ):
                buffers, ms, indexes = await _explain(conn, "", query, (seq,))
                out[label] = (buffers, ms, indexes)
            return out
    finally:
        async with await psycopg.AsyncConnection.connect(SERVER, autocommit=True) as admin:
            await admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--idle", default="1000,50000", help="waiting jobs, comma-separated")
    parser.add_argument("--fan", type=int, default=10, help="jobs waiting for the one acked")
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    for idle in (int(n) for n in args.idle.split(",")):
        got = await measure(idle, args.fan, args.rounds)
        print(f"{got.pop('idle'):>8,} waiting, {got.pop('fan')} on the acked job:")
        for label, value in got.items():
            if len(value) == 2:
                print(f"    {label:<28} {value[0]:>6} buffers  {value[1]:8.3f} ms (median)")
            else:
                print(f"    {label:<28} {value[0]:>6} buffers  {value[1]:8.3f} ms  {value[2]}")


if __name__ == "__main__":
    asyncio.run(main())
