"""The fallback poll: a change made without a notice (SQL run with the triggers off)
only delays the news, by one poll at most; a poll that finds nothing changed tells
nothing.

On a private server (``_server.py``), so that no one else's transactions change what
the poll watches.
"""

from __future__ import annotations

import asyncio
import random

import psycopg

from conveyor.broker.backend import Claim
from conveyor.broker.backend.postgres import PostgresBackend
from conveyor.broker.scheduler import SteppedScheduler
from tests.conformance.conftest import START, Heard

from ..conformance.pg import until as _until
from ._server import private_server

POLL_S = 1.0


async def _poll(backend: PostgresBackend, clock: SteppedScheduler) -> None:
    """Move the clock one poll on and wait (on the real clock) until that poll ran: its
    timer is set again for the next one."""
    await asyncio.sleep(0)
    clock.advance(POLL_S)
    assert backend._poll_timer is None  # the poll is asked for
    await _until(lambda: backend._poll_timer is not None, "the poll ran")


async def test_a_job_inserted_without_a_notice_is_told_at_the_next_poll() -> None:
    with private_server() as server:
        clock = SteppedScheduler(start=START)
        backend = await PostgresBackend.open(
            server.dsn, clock, max_payload_bytes=1 << 20, rng=random.Random(1), poll_s=POLL_S
        )
        heard = Heard()
        backend.listen(heard)
        try:
            await backend.set_queue("q")
            await _poll(backend, clock)  # (it sees the queue made)
            heard.forget()
            await _poll(backend, clock)
            assert heard.work == []  # nothing changed: nothing told

            async with await psycopg.AsyncConnection.connect(server.dsn) as conn:
                # Triggers off: no notice, as a change made by hand could be.
                await conn.execute("SET session_replication_role = replica")
                await conn.execute(
                    "INSERT INTO conveyor_jobs (seq, queue, state, payload, priority, "
                    "max_attempts, visibility_timeout_s, backoff_base_s, backoff_max_s, "
                    "enqueued_at, ready_at) VALUES (nextval('conveyor_job_seq'), 'q', "
                    "'pending', '1', 0, 3, 30, 1, 60, %s, %s)",
                    (clock.now(), clock.now()),
                )
                await conn.commit()
            await asyncio.sleep(0.3)  # (had a notice been sent, it would be here by now)
            assert heard.work == []
            await _poll(backend, clock)
            assert heard.work == [None]  # work may be waiting, of any queue
            (got,) = await backend.claim([Claim("w", ("q",), 5)])
            assert [job.payload_json for job in got] == [b"1"]
        finally:
            await backend.close()
