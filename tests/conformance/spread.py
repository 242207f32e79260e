"""Three brokers' backends on one PostgreSQL database, called in turn: the conformance
suite run across brokers (kind ``postgres-3``).

``Spread`` is a ``Backend`` whose every call goes to the next of three
``PostgresBackend``s on one database, after the call before it is done (calls take
effect in call order, as on one backend; on three, that order is the callers' to keep).
They share the manual clock and the retry curve's draws, so that their answers are one
backend's. The suite's listener hears what the backend that took the latest call was
told (its own changes, its timer, other brokers' notices), as the broker behind that
backend would.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

from conveyor.broker.backend import Listener
from conveyor.broker.backend.postgres import PostgresBackend
from conveyor.broker.egress import IMMEDIATE
from conveyor.broker.scheduler import SteppedScheduler

SPREAD = 3


class _Heard:
    """One backend's listener: passes on what it is told while its backend is the one
    the latest call went to."""

    def __init__(self, spread: Spread, index: int) -> None:
        self._spread = spread
        self._index = index

    def work_waiting(self, queues: frozenset[str] | None) -> None:
        if self._spread.turn == self._index:
            for listener in self._spread.listeners:
                listener.work_waiting(queues)

    def cancelled(self, job_ids: Sequence[str]) -> None:
        if self._spread.turn == self._index:
            for listener in self._spread.listeners:
                listener.cancelled(job_ids)


class Spread:
    """See the module docstring."""

    name = "postgres"
    durable = True
    shared = True
    gate = IMMEDIATE

    def __init__(self, backends: list[PostgresBackend]) -> None:
        self.backends = backends
        self.listeners: list[Listener] = []
        self.turn = 0  # the backend the latest call went to
        self._next = 0
        self._last: asyncio.Future[Any] | None = None
        for index, backend in enumerate(backends):
            backend.listen(_Heard(self, index))

    @classmethod
    async def open(
        cls,
        dsn: str,
        clock: SteppedScheduler,
        *,
        rng: random.Random | None,
        id_prefix: str | None,
    ) -> Spread:
        shared = random.Random(7) if rng is None else rng
        backends = [
            await PostgresBackend.open(
                dsn, clock, max_payload_bytes=1 << 20, rng=shared, id_prefix=id_prefix
            )
            for _ in range(SPREAD)
        ]
        return cls(backends)

    @property
    def failed(self) -> Any:
        return next((b.failed for b in self.backends if b.failed is not None), None)

    def now(self) -> float:
        return self.backends[0].now()

    def listen(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def __getattr__(self, op: str) -> Any:
        """Every call of the interface: to the next backend, after the call before."""
        if op.startswith("_") or not callable(getattr(self.backends[0], op, None)):
            raise AttributeError(op)

        def call(*args: Any, **kwargs: Any) -> asyncio.Future[Any]:
            index = self._next
            self._next = (index + 1) % SPREAD
            before = self._last

            async def run() -> Any:
                if before is not None and not before.done():
                    await asyncio.wait([before])
                # What the backends do of their own accord (a sweep their timer asked
                # for) is done first too, as one backend does it before its next call.
                await asyncio.sleep(0)
                for backend in self.backends:
                    await backend.settle()
                self.turn = index
                return await getattr(self.backends[index], op)(*args, **kwargs)

            task = asyncio.get_running_loop().create_task(run())
            self._last = task
            return task

        return call

    def claim_bound(self, queue: str) -> int | None:
        return None  # (as each of its backends answers: the table is shared)

    def unfollow(self, ids: Sequence[str], on_finished: Any) -> None:
        """Unfollow on every backend (each ignores the ids it does not follow): a
        follow went to whichever backend had the turn."""
        for backend in self.backends:
            backend.unfollow(ids, on_finished)

    def unwatch(self, ids: Sequence[str], on_event: Any) -> None:
        """Unwatch on every backend, as ``unfollow``."""
        for backend in self.backends:
            backend.unwatch(ids, on_event)

    async def settle(self) -> None:
        for backend in self.backends:
            await backend.settle()

    async def close(self) -> None:
        for backend in reversed(self.backends):
            await backend.close()
