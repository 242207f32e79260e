"""What a store keeps of an engine table, for tests of ``JobTable.restore``: its rows and
queues as tuples, folded from ``take_changes()`` as a store writes them."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from conveyor.broker.engine import (
    CLAIM_FIELDS,
    QUEUE_FIELDS,
    ROW_FIELDS,
    UPDATE_FIELDS,
    Changes,
    JobTable,
)


class Stored:
    """What a store keeps of a table: its rows and queues as tuples, folded from
    ``take_changes()`` as a store writes them."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[Any, ...]] = {}
        self.queues: dict[str, tuple[Any, ...]] = {}
        self.meta: tuple[str, int, int] = ("t", 0, 0)

    def write(self, changes: Changes) -> None:
        for values in changes.upserts:
            self.rows[values[0]] = values
        for fields, batch in ((UPDATE_FIELDS, changes.updates), (CLAIM_FIELDS, changes.claims)):
            for values in batch:
                row = dict(zip(ROW_FIELDS, self.rows[values[-1]], strict=True))
                row.update(zip(fields, values, strict=True))
                self.rows[values[-1]] = tuple(row[name] for name in ROW_FIELDS)
        for seq in changes.deleted:
            del self.rows[seq]
        for values in changes.queues:
            assert len(values) == len(QUEUE_FIELDS)
            self.queues[values[0]] = values
        self.meta = changes.meta

    def restore(self, clock: Callable[[], float]) -> JobTable:
        return JobTable.restore(
            self.meta, self.queues.values(), self.rows.values(), clock=clock, rng=random.Random(2)
        )
