"""The in-memory store: the table lives in the process and dies with it."""

from __future__ import annotations

import random
from collections.abc import Callable

from ..engine import Changes, JobTable

__all__ = ["MemoryStore"]


class MemoryStore:
    """No persistence at all: fastest, and a restart forgets every job."""

    name = "memory"
    durable = False
    slow_commits = False

    def load(
        self,
        *,
        clock: Callable[[], float],
        rng: random.Random,
        max_payload_bytes: int,
        id_prefix: str | None = None,
    ) -> JobTable:
        return JobTable(
            clock=clock, rng=rng, max_payload_bytes=max_payload_bytes, id_prefix=id_prefix
        )

    def commit_now(  # pragma: no cover - never called
        self, changes: Changes, written: Callable[[], None] = lambda: None
    ) -> bool:
        raise RuntimeError("the memory store keeps no changes")

    async def commit(  # pragma: no cover - never called
        self, changes: Changes, written: Callable[[], None] = lambda: None
    ) -> None:
        raise RuntimeError("the memory store keeps no changes")

    def close(self) -> None:
        pass
