"""A PostgreSQL server that restarts under a broker is an outage, not the broker's end:
calls made meanwhile raise ``Unavailable``, the backend makes its connections again by
itself, and everything committed before is still there.

The server is a private one (``_server.py``), stopped with ``-m immediate`` (every
session cut at once, as a crash of the server would) and started again.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from conveyor.broker.backend import Claim, Enqueue
from conveyor.broker.backend.postgres import PostgresBackend, Unavailable
from conveyor.broker.engine import JobState
from conveyor.broker.scheduler import SteppedScheduler
from conveyor.broker.store import StoreError
from tests.conformance.conftest import START, Heard

from ..conformance.pg import until as _until
from ._server import private_server

# Each wait below is bounded; none decides the test on speed.
_BOUND_S = 30.0


async def test_a_server_restart_makes_calls_unavailable_and_then_they_work_again() -> None:
    with private_server() as server:
        failures: list[StoreError] = []
        backend = await PostgresBackend.open(
            server.dsn,
            SteppedScheduler(start=START),
            max_payload_bytes=1 << 20,
            rng=random.Random(1),
            on_failure=failures.append,
            reconnect_max_s=0.2,
        )
        heard = Heard()
        backend.listen(heard)
        try:
            ids: list[str] = []
            for batch in range(5):
                answers = await backend.enqueue([Enqueue("q", [batch, i]) for i in range(20)])
                ids.extend(answer for answer in answers if isinstance(answer, str))
            assert len(ids) == 100
            ((held,),) = await backend.claim([Claim("w", ("q",), 1)])
            assert backend.is_leader
            heard.forget()

            await asyncio.to_thread(server.crash)
            # The call in flight when the connection is found lost, and every call made
            # while the server is down, raise Unavailable; none stops the backend.
            with pytest.raises(Unavailable, match="unavailable"):
                await asyncio.wait_for(backend.get_jobs(ids), _BOUND_S)
            with pytest.raises(Unavailable):
                await asyncio.wait_for(backend.enqueue([Enqueue("q", "lost")]), _BOUND_S)
            with pytest.raises(Unavailable):
                await asyncio.wait_for(backend.ack([(held.id, held.lease)]), _BOUND_S)
            assert not backend.available
            assert failures == []

            await asyncio.to_thread(server.start)
            await _until(lambda: backend.available, "the main connection made again")
            # Everything committed before the crash is there, the lease held included.
            jobs = await backend.get_jobs(ids)
            assert [job.id if job else None for job in jobs] == ids
            assert [job.state for job in jobs if job and job.id == held.id] == [JobState.PROCESSING]
            assert await backend.ack([(held.id, held.lease)]) == [True]
            (again,) = await backend.enqueue([Enqueue("q", "after")])
            assert isinstance(again, str)
            stats = (await backend.stats(["q"]))["q"]
            assert (stats.ready, stats.totals.enqueued, stats.totals.completed) == (100, 101, 1)
            # Notices may have been missed meanwhile: the listener was told work may be
            # waiting, and the hearing connection (with the lead) is back too.
            await _until(lambda: None in heard.work, "the listener told of work")
            await _until(lambda: backend.is_leader, "the lead taken again")
            assert failures == []
        finally:
            await backend.close()
