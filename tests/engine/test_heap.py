"""The engine's lazy heaps: ``Line`` (leases) agrees with ``Heap`` and with a plain list.

They are how every operation stays O(log n) in a queue's depth (``docs/contract.md``,
CST-1)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.broker.engine._heap import Heap, Line


class Row:
    __slots__ = ("_entry", "name")

    def __init__(self, name: int) -> None:
        self.name = name
        self._entry: tuple[Any, ...] | None = None


# Each step: ("push", key, in_order), ("forget", i), ("pop",), ("top",), ("load", keys).
steps = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(0, 40), st.booleans()),
        st.tuples(st.just("forget"), st.integers(0, 1000)),
        st.tuples(st.just("pop")),
        st.tuples(st.just("top")),
    ),
    max_size=300,
)


@settings(max_examples=300, deadline=None)
@given(loaded=st.lists(st.integers(0, 40), max_size=20), steps=steps)
def test_line_gives_what_a_heap_gives(loaded: list[int], steps: list[tuple[Any, ...]]) -> None:
    """Whatever order keys come in (mostly rising, as deadlines do, or not), a ``Line``
    and a ``Heap`` fed the same entries agree on every ``top`` and ``pop``, on their
    size, and with the smallest live entry of a plain list."""
    line, heap = Line("_entry"), Heap("_entry")
    # Two rows per name, one per structure: each keeps its entry in the row's attribute.
    rows: dict[int, tuple[Row, Row]] = {}
    live: dict[int, tuple[int, int]] = {}  # name -> key of its live entry
    last = 0
    for name, key in enumerate(loaded):
        rows[name] = (Row(name), Row(name))
        line.append((key, name, rows[name][0]))
        heap.append((key, name, rows[name][1]))
        live[name] = (key, name)
    line.rebuild()
    heap.rebuild()
    for step in steps:
        if step[0] == "push":
            _, key, in_order = step
            if in_order:
                last = key = last + key % 3  # never below the one before
            name = len(rows)
            rows[name] = (Row(name), Row(name))
            line.push((key, name, rows[name][0]))
            heap.push((key, name, rows[name][1]))
            live[name] = (key, name)
        elif step[0] == "forget" and live:
            name = sorted(live)[step[1] % len(live)]
            line.forget(rows[name][0])
            heap.forget(rows[name][1])
            del live[name]
        elif step[0] in ("pop", "top"):
            a, b = line.top(), heap.top()
            want = min(live.values(), default=None)
            assert (a and a[:2]) == (b and b[:2]) == want
            if step[0] == "pop" and want is not None:
                assert line.pop()[:2] == heap.pop()[:2] == want
                assert rows[want[1]][0]._entry is None
                del live[want[1]]
        assert len(line) == len(heap) == len(live)
        for name in live:
            entry = rows[name][0]._entry
            assert entry is not None and entry[:2] == live[name]
    assert sorted(e[:2] for e in line.entries() if e[-1]._entry is e) == sorted(live.values())


def test_in_order_entries_skip_the_heap() -> None:
    """Deadlines of one timeout come in order: they stay in the line, and the stale ones
    their acks leave are dropped from its head, not sifted out of a heap."""
    line = Line("_entry")
    rows = [Row(i) for i in range(100)]
    for i, row in enumerate(rows):
        line.push((1000.0 + i, i, row))
    assert not line.items
    for row in rows[:60]:
        line.forget(row)
    top = line.top()
    assert top is not None and top[1] == 60
    assert len(line._line) == 40 and line.stale == 0
    early = Row(100)
    line.push((999.0, 100, early))  # a lease ended early goes to the heap, and first
    assert line.top() == (999.0, 100, early) and len(line.items) == 1
    assert line.pop() == (999.0, 100, early)
    assert line.pop()[1] == 60
    for row in rows[61:]:
        line.forget(row)
    assert line.top() is None and len(line) == 0
    with pytest.raises(IndexError):
        line.pop()
