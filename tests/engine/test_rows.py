"""The table's rows by sequence number (``Rows``): a dict's answers in pages of slots,
where an old job never pins a page (``docs/contract.md``, CST-1: no scans, bounded
memory per job)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conveyor.broker.engine._rows import PAGE, SPARSE, Rows

# Each step: ("add",) the next seq; ("add_at", seq) any seq (a restore, a replace);
# ("del", i) the i-th live seq (mod their count); ("get", seq).
steps = st.lists(
    st.one_of(
        st.tuples(st.just("add")),
        st.tuples(st.just("add_at"), st.integers(1, 6 * PAGE)),
        st.tuples(st.just("del"), st.integers(0, 10_000)),
        st.tuples(st.just("get"), st.integers(1, 6 * PAGE)),
    ),
    max_size=400,
)


@settings(max_examples=300, deadline=None)
@given(start=st.integers(0, 3 * PAGE), steps=steps)
def test_rows_answer_as_a_dict_does(start: int, steps: list[tuple[Any, ...]]) -> None:
    rows: Rows[str] = Rows()
    model: dict[int, str] = {}
    seq = start
    for step in steps:
        if step[0] == "add":
            seq += 1
            rows[seq] = model[seq] = f"r{seq}"
        elif step[0] == "add_at":
            rows[step[1]] = model[step[1]] = f"x{step[1]}"
        elif step[0] == "del":
            if model:
                gone = sorted(model)[step[1] % len(model)]
                del rows[gone], model[gone]
        else:
            assert rows.get(step[1]) == model.get(step[1])
        for live in model:
            assert rows[live] == model[live]
            assert live in rows
    for probe in range(1, seq + 2):
        assert (probe in rows) == (probe in model)


def test_a_missing_seq_is_a_key_error() -> None:
    rows: Rows[str] = Rows()
    rows[1] = "a"
    with pytest.raises(KeyError):
        rows[2]
    with pytest.raises(KeyError):
        del rows[2]
    assert rows.get(2) is None


def test_old_jobs_left_among_many_gone_hold_no_pages() -> None:
    """One job kept of every page's worth (a scheduled or dead job among a drained
    stream): the pages go, and the kept rows sit in the dict, not one page each."""
    rows: Rows[int] = Rows()
    pages = 200
    for seq in range(1, pages * PAGE + 1):
        rows[seq] = seq
    kept = set(range(1, pages * PAGE + 1, PAGE))
    for seq in range(1, pages * PAGE + 1):
        if seq not in kept:
            del rows[seq]
    assert len(rows._pages) <= 1  # (only the newest page may stay)
    assert all(rows[seq] == seq for seq in kept)


def test_a_page_keeps_its_rows_while_more_than_a_few_are_live() -> None:
    rows: Rows[int] = Rows()
    everything = range(1, 3 * PAGE + 1)
    for seq in everything:
        rows[seq] = seq
    second = range(PAGE, 2 * PAGE)  # the seqs of page 1, a full page, not the newest
    gone = set(second[: PAGE - SPARSE - 1])
    for seq in gone:
        del rows[seq]
    assert 1 in rows._pages  # SPARSE + 1 live rows: the page stays
    last = second[PAGE - SPARSE - 1]
    del rows[last]
    gone.add(last)
    assert 1 not in rows._pages and len(rows._sparse) == SPARSE
    assert all(rows[seq] == seq for seq in everything if seq not in gone)
    assert not any(seq in rows for seq in gone)


def test_rows_far_apart_hold_no_page_each() -> None:
    """A restore of a table whose live rows are far apart (one in a thousand seqs): they
    go to the dict as each page stops being the newest, not one page each."""
    rows: Rows[int] = Rows()
    seqs = range(1, 1000 * PAGE, 1000)
    for seq in seqs:
        rows[seq] = seq
    assert len(rows._pages) == 1
    assert all(rows[seq] == seq for seq in seqs)
