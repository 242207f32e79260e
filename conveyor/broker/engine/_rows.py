"""The table's live rows by sequence number, in pages rather than a dict.

A dict entry costs a pending job about 41 to 52 bytes (its hash, key and value words,
at the table's load factor, plus the index); a slot in a page costs 8. Sequence numbers
are given in increasing order and most jobs leave in about that order, so the live rows
of a table sit in a few dense runs: pages of ``PAGE`` slots hold them.

A page is freed when its last row leaves. A page left with at most ``SPARSE`` live rows
(old jobs that stay: scheduled far ahead, retrying, dead, kept completed) moves them to
a dict and is freed too, so that one old job never pins a page: at worst a row costs
``PAGE / SPARSE`` slots in a page or one dict entry, never more. The newest page is not
moved while rows are still added to it; once a newer one is made, it is held to the same
rule. Every operation is O(1) (a move is paid for by the rows that filled the page);
nothing here scans.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

__all__ = ["PAGE", "SPARSE", "Rows"]

_SHIFT = 8
#: Slots per page.
PAGE = 1 << _SHIFT
_MASK = PAGE - 1
#: A page with this many live rows or fewer (and not the newest) hands them to the dict.
SPARSE = PAGE // 8

R = TypeVar("R")


class Rows(Generic[R]):
    """A map from sequence number (an int > 0) to row, with ``get``, ``in``, ``[]``,
    ``[]=`` and ``del``, and no iteration (nothing in the engine walks every row)."""

    __slots__ = ("_live", "_pages", "_sparse", "_top")

    def __init__(self) -> None:
        # Page number -> its slots; the page's live count is kept apart, in ``_live``.
        self._pages: dict[int, list[Any]] = {}
        self._live: dict[int, int] = {}
        # Rows of pages that went sparse.
        self._sparse: dict[int, R] = {}
        self._top = -1  # the newest page number a row was added to

    def get(self, seq: int) -> R | None:
        page = self._pages.get(seq >> _SHIFT)
        if page is not None:
            row: R | None = page[seq & _MASK]
            if row is not None:
                return row
        return self._sparse.get(seq)

    def __contains__(self, seq: int) -> bool:
        return self.get(seq) is not None

    def __getitem__(self, seq: int) -> R:
        row = self.get(seq)
        if row is None:
            raise KeyError(seq)
        return row

    def __setitem__(self, seq: int, row: R) -> None:
        """Add ``row`` under ``seq``, or replace the row there."""
        number = seq >> _SHIFT
        page = self._pages.get(number)
        if page is None:
            if number < self._top:
                # A freed page's number (a row that moved to the dict, or a restore out
                # of order): the dict holds it, so no page is made again for a few rows.
                self._sparse[seq] = row
                return
            top = self._pages.get(self._top)
            if top is not None and self._live[self._top] <= SPARSE:
                # The newest page is newest no more: it may go sparse now (a restore of
                # rows far apart, say), as any other page would by a delete.
                self._spill(self._top, top)
            page = self._pages[number] = [None] * PAGE
            self._live[number] = 0
            self._top = number
        slot = seq & _MASK
        if page[slot] is None:
            self._live[number] += 1
        page[slot] = row

    def __delitem__(self, seq: int) -> None:
        number = seq >> _SHIFT
        page = self._pages.get(number)
        slot = seq & _MASK
        if page is None or page[slot] is None:
            del self._sparse[seq]
            return
        page[slot] = None
        live = self._live[number] - 1
        if live == 0:
            del self._pages[number], self._live[number]
        elif live <= SPARSE and number != self._top:
            self._spill(number, page)
        else:
            self._live[number] = live

    def _spill(self, number: int, page: list[Any]) -> None:
        """Move a sparse page's rows to the dict and free the page (each row moves at
        most once: a row in the dict stays there)."""
        base = number << _SHIFT
        sparse = self._sparse
        for slot, row in enumerate(page):
            if row is not None:
                sparse[base + slot] = row
        del self._pages[number], self._live[number]
