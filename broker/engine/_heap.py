"""A binary heap with lazy deletion, the engine's one index structure.

Entries are tuples whose last element is the row they stand for. The row keeps a
reference to its live entry in the attribute this heap was made with; an entry whose
row points elsewhere is stale. Removing a row from the middle is O(1) (``forget``):
its entry stays behind, is skipped when it reaches the top, and is dropped for good
when stale entries outnumber live ones (a rebuild that is O(1) amortised per forget).
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from typing import Any

__all__ = ["Heap"]

# Below this many stale entries a rebuild is not worth its cost.
_MIN_STALE_TO_COMPACT = 64


class Heap:
    """A min-heap of ``(key..., row)`` tuples; ``getattr(row, attr)`` is the live entry."""

    __slots__ = ("_attr", "items", "stale")

    def __init__(self, attr: str) -> None:
        self._attr = attr
        self.items: list[tuple[Any, ...]] = []
        self.stale = 0

    def __len__(self) -> int:
        """Live entries."""
        return len(self.items) - self.stale

    def push(self, entry: tuple[Any, ...]) -> None:
        """Add ``entry`` and make it its row's live entry (the row must have none)."""
        heappush(self.items, entry)
        setattr(entry[-1], self._attr, entry)

    def append(self, entry: tuple[Any, ...]) -> None:
        """Add ``entry`` without ordering it: call ``rebuild()`` before any other use."""
        self.items.append(entry)
        setattr(entry[-1], self._attr, entry)

    def rebuild(self) -> None:
        """Restore heap order after ``append`` calls, in O(n)."""
        heapify(self.items)

    def top(self) -> tuple[Any, ...] | None:
        """The smallest live entry, or ``None``. Drops stale entries it meets."""
        items = self.items
        attr = self._attr
        while items:
            entry = items[0]
            if getattr(entry[-1], attr) is entry:
                return items[0]  # (not `entry`: mypy narrows it to Any after `is`)
            heappop(items)
            self.stale -= 1
        return None

    def pop(self) -> tuple[Any, ...]:
        """Remove the live top entry; call only right after ``top()`` returned it."""
        entry = heappop(self.items)
        setattr(entry[-1], self._attr, None)
        return entry

    def forget(self, row: Any) -> None:
        """Unlink ``row``'s live entry without searching for it (it goes stale)."""
        setattr(row, self._attr, None)
        self.stale += 1
        if self.stale > _MIN_STALE_TO_COMPACT and self.stale * 2 > len(self.items):
            attr = self._attr
            self.items = [e for e in self.items if getattr(e[-1], attr) is e]
            heapify(self.items)
            self.stale = 0
