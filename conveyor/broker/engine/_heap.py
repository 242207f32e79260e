"""A binary heap with lazy deletion, the engine's claim index structure, and the sorted
indexes a listing reads (``Ranked``, ``Log``).

Entries are tuples whose last element is the row they stand for. The row keeps a
reference to its live entry in the attribute this heap was made with; an entry whose
row points elsewhere is stale. Removing a row from the middle is O(1) (``forget``):
its entry stays behind, is skipped when it reaches the top, and is dropped for good
when stale entries outnumber live ones (a rebuild that is O(1) amortised per forget).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Iterator
from heapq import heapify, heappop, heappush
from typing import Any

from sortedcontainers import SortedList

__all__ = ["IN_FIFO", "Fifo", "Heap", "Line", "Log", "Ranked"]

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

    def entries(self) -> list[tuple[Any, ...]]:
        """Every entry, stale ones included, in no particular order."""
        return self.items

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


_IN_FIFO = ("in a fifo",)  # a row's ``_entry`` while it waits in a Fifo


class _Lane:
    """One priority's line of a ``Fifo``: its rows oldest first, from ``head`` on (a list
    and a start index rather than a deque, so that a listing can bisect it)."""

    __slots__ = ("head", "rows")

    def __init__(self) -> None:
        self.rows: list[Any] = []
        self.head = 0


class Fifo:
    """Fresh ready rows, one first-in-first-out line per priority.

    A job that is ready when it is enqueued gets the largest ``(ready time, seq)`` so
    far (the clock never goes back, seq only grows), so among fresh rows of one
    priority arrival order *is* claim order: an O(1) append and pop from the front, and
    8 bytes per row instead of a heap entry. Rows come here once, at enqueue; every later
    return to ready (retry, redrive, a matured delay, a lapsed lease) goes to the heap,
    so a row is never in a line twice and ``row._entry is _IN_FIFO`` tells a live
    place from a stale one. Removal from the middle is lazy, as in ``Heap``. A fresh
    row's ready time is its enqueue time, which never changes, so a line is sorted by
    ``(enqueued_at, seq)``, stale rows included: ``lanes`` lets a listing bisect it.
    """

    __slots__ = ("_levels", "_lines", "size", "stale")

    def __init__(self) -> None:
        self._lines: dict[int, _Lane] = {}  # priority -> rows, oldest first
        self._levels: list[int] = []  # -priority of every line, a heap
        self.size = 0  # rows in the lines, stale ones included
        self.stale = 0

    def append(self, row: Any) -> None:
        """Add a fresh ready row (its key must exceed every key in its line)."""
        line = self._lines.get(row.priority)
        if line is None:
            line = self._lines[row.priority] = _Lane()
            heappush(self._levels, -row.priority)
        line.rows.append(row)
        row._entry = _IN_FIFO
        self.size += 1

    def top(self) -> Any:
        """The live row the highest-priority line would give next, or ``None``."""
        levels, lines = self._levels, self._lines
        while levels:
            line = lines[-levels[0]]
            if self._skip_stale(line):
                return line.rows[line.head]
            del lines[-heappop(levels)]
        return None

    def _skip_stale(self, line: _Lane) -> bool:
        """Move ``line``'s head past stale rows; whether a live row is left."""
        rows, head = line.rows, line.head
        end = len(rows)
        while head < end and rows[head]._entry is not _IN_FIFO:
            head += 1
            self.size -= 1
            self.stale -= 1
        line.head = head
        return head < end

    def pop(self) -> Any:
        """Remove the row ``top()`` just returned."""
        line = self._lines[-self._levels[0]]
        rows = line.rows
        row = rows[line.head]
        line.head += 1
        if line.head > _MIN_STALE_TO_COMPACT and line.head * 2 > len(rows):
            del rows[: line.head]  # (amortised O(1): at most once per half of the line)
            line.head = 0
        row._entry = None
        self.size -= 1
        return row

    def forget(self, row: Any) -> None:
        """Unlink ``row`` without searching for it (its place goes stale)."""
        row._entry = None
        self.stale += 1
        if self.stale > _MIN_STALE_TO_COMPACT and self.stale * 2 > self.size:
            for line in self._lines.values():
                line.rows = [r for r in line.rows[line.head :] if r._entry is _IN_FIFO]
                line.head = 0
            self.size -= self.stale
            self.stale = 0

    def lanes(self) -> list[tuple[int, list[Any], int]]:
        """``(priority, rows, head)`` of each line: the live rows are those of
        ``rows[head:]`` whose ``_entry is IN_FIFO``. For reading only, at once."""
        return [(priority, line.rows, line.head) for priority, line in self._lines.items()]

    def oldest_ready_at(self) -> float | None:
        """The earliest ready time of a live row, or ``None``: each line's head is its
        oldest, so O(priorities), not O(rows)."""
        oldest = None
        for line in self._lines.values():
            if self._skip_stale(line):
                at = line.rows[line.head].ready_at
                if oldest is None or at < oldest:
                    oldest = at
        return oldest


#: What a live row's ``_entry`` is while it waits in a ``Fifo``.
IN_FIFO = _IN_FIFO


class Ranked:
    """A sorted index of ``(key..., seq, row)`` entries, for listing a state page by page:
    O(log n) to add or remove an entry, O(log n + k) to read k entries from any key on
    (keyset pagination). The row keeps its live entry in ``row._rank`` (the caller knows
    which index a row is in, by its state), so a removal needs no search. A B-tree-like list of
    lists (``sortedcontainers.SortedList``) under a typed face."""

    __slots__ = ("_items",)

    def __init__(self, entries: Iterable[tuple[Any, ...]] = ()) -> None:
        self._items = SortedList(entries)
        for entry in self._items:
            entry[-1]._rank = entry

    def __len__(self) -> int:
        return len(self._items)

    def add(self, entry: tuple[Any, ...]) -> None:
        self._items.add(entry)
        entry[-1]._rank = entry

    def remove(self, row: Any) -> None:
        """Take ``row``'s entry out (the row must be in this index)."""
        self._items.remove(row._rank)
        row._rank = None

    def from_key(self, low: tuple[Any, ...] | None) -> Iterator[tuple[Any, ...]]:
        """The entries not below ``low`` (all when ``None``), smallest first."""
        if low is None:
            return iter(self._items)
        return iter(self._items.irange(minimum=low))

    def to_key(self, high: tuple[Any, ...] | None) -> Iterator[tuple[Any, ...]]:
        """The entries not above ``high`` (all when ``None``), largest first."""
        if high is None:
            return iter(reversed(self._items))
        return iter(self._items.irange(maximum=high, reverse=True))

    def at(self, index: int) -> tuple[Any, ...]:
        """The entry at position ``index`` (negative counts from the end), O(log n)."""
        return self._items[index]  # type: ignore[no-any-return]


class Log:
    """Entries ``(number, row)`` appended in increasing ``number`` (claims in the order
    they were made): an O(1) append, an O(1) lazy removal, O(log n) to find a number.

    As in ``Heap``, ``row._rank`` is the live entry; a
    removed entry stays behind, stale, until stale entries outnumber live ones and the
    log is rebuilt (O(1) amortised per removal). Reading skips stale entries.
    """

    __slots__ = ("_entries", "stale")

    def __init__(self) -> None:
        self._entries: list[tuple[int, Any]] = []
        self.stale = 0

    def __len__(self) -> int:
        return len(self._entries) - self.stale

    def add(self, entry: tuple[int, Any]) -> None:
        """Append ``entry``, whose number must exceed every number in the log."""
        self._entries.append(entry)
        entry[-1]._rank = entry

    def extend(self, entries: Iterable[tuple[int, Any]]) -> None:
        """Add entries in any order (a restore), sorting the log once."""
        for entry in entries:
            self.add(entry)
        self._entries.sort(key=_number)

    def remove(self, row: Any) -> None:
        row._rank = None
        self.stale += 1
        entries = self._entries
        if self.stale > _MIN_STALE_TO_COMPACT and self.stale * 2 > len(entries):
            self._entries = [e for e in entries if e[-1]._rank is e]
            self.stale = 0

    def after(self, number: int | None) -> Iterator[tuple[int, Any]]:
        """The live entries whose number is above ``number`` (all when ``None``), in order."""
        entries = self._entries
        start = 0 if number is None else bisect_right(entries, number, key=_number)
        for i in range(start, len(entries)):
            entry = entries[i]
            if entry[-1]._rank is entry:
                yield entry


def _number(entry: tuple[int, Any]) -> int:
    return entry[0]


class Line(Heap):
    """A ``Heap`` for keys that mostly come in order, such as lease deadlines (claim time
    plus the job's visibility timeout, where most jobs share one timeout).

    An entry whose key is not below the last one appended joins a first-in-first-out
    line: O(1) in and, at the head, out, where a heap paid O(log n) twice per job (a
    push at the claim, a pop of the stale entry its ack left). Any other entry (a
    shorter timeout, a lease ended early, a clock that stepped back) goes to a heap.
    ``top`` is the smaller of the two heads. Same protocol as ``Heap``: the row's
    attribute points to its live entry, and removal is lazy.
    """

    __slots__ = ("_line", "_top_in_line")

    def __init__(self, attr: str) -> None:
        super().__init__(attr)  # its ``items``: the heap of the entries out of order
        self._line: deque[tuple[Any, ...]] = deque()  # keys in order
        self._top_in_line = False  # which side the last top() found its entry on

    def __len__(self) -> int:
        return len(self._line) + len(self.items) - self.stale

    def push(self, entry: tuple[Any, ...]) -> None:
        line = self._line
        if not line or entry >= line[-1]:
            line.append(entry)
        else:
            heappush(self.items, entry)
        setattr(entry[-1], self._attr, entry)

    def entries(self) -> list[tuple[Any, ...]]:
        """Every entry, stale ones included, in no particular order."""
        return [*self._line, *self.items]

    def top(self) -> tuple[Any, ...] | None:
        """The live entry with the smallest key, or ``None``; ``pop`` removes it."""
        attr = self._attr
        line = self._line
        head = None
        while line:
            entry = line[0]
            if getattr(entry[-1], attr) is entry:
                head = line[0]
                break
            line.popleft()
            self.stale -= 1
        heap = self.items
        while heap:
            entry = heap[0]
            if getattr(entry[-1], attr) is entry:
                if head is None or entry < head:
                    self._top_in_line = False
                    return heap[0]  # (not `entry`: mypy narrows it to Any after `is`)
                break
            heappop(heap)
            self.stale -= 1
        self._top_in_line = True
        return head

    def pop(self) -> tuple[Any, ...]:
        """Remove and return the live entry ``top`` gives. Raises ``IndexError`` when
        there is none. (Pops are rare: a lapse, a re-key after a heartbeat; the stale
        entries acks leave go in ``top``.)"""
        if self.top() is None:
            raise IndexError("pop from an empty Line")
        entry = self._line.popleft() if self._top_in_line else heappop(self.items)
        setattr(entry[-1], self._attr, None)
        return entry

    def forget(self, row: Any) -> None:
        setattr(row, self._attr, None)
        self.stale += 1
        if self.stale > _MIN_STALE_TO_COMPACT and self.stale * 2 > len(self._line) + len(
            self.items
        ):
            attr = self._attr
            self._line = deque(e for e in self._line if getattr(e[-1], attr) is e)
            self.items = [e for e in self.items if getattr(e[-1], attr) is e]
            heapify(self.items)
            self.stale = 0
