"""The table's live rows by sequence number, in pages rather than a dict.

A dict entry costs a pending job about 41 to 52 bytes (its hash, key and value words,
at the table's load factor, plus the index); a slot in a page costs 8. Sequence numbers
are given in increasing order and most jobs leave in about that order, so the live rows
of a table sit in a few dense runs: pages of ``PAGE`` slots hold them.

A page other than the newest is freed when at most ``SPARSE`` of its rows are left
(old jobs that stay: scheduled far ahead, retrying, dead, kept completed): they move to
a dict, so that one old job never pins a page, and a row costs at worst ``PAGE /
SPARSE`` slots of a page or one dict entry. The newest page, the one rows are added to,
stays; once a newer one is made, it is held to the same rule. Every operation is O(1)
(a move is paid for by the rows that filled the page); nothing here scans.
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
    """A map from sequence number (an int >= 0) to row, with ``get``, ``in``, ``[]``,
    ``[]=`` and ``del``, and no iteration (nothing in the engine walks every row)."""

    __slots__ = ("_newest", "_pages", "_sparse", "_top")

    def __init__(self) -> None:
        # Page number -> its ``PAGE`` slots, then its count of live rows (at ``PAGE``).
        self._pages: dict[int, list[Any]] = {}
        # Rows of pages that went sparse.
        self._sparse: dict[int, R] = {}
        self._top = 0  # the newest page's number, and that page
        self._newest: list[Any] = _page()
        self._pages[0] = self._newest

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
        if number == self._top:
            page = self._newest
        else:
            found = self._pages.get(number)
            if found is None:
                if number < self._top:
                    # A freed page's number (its rows moved to the dict, or a restore
                    # out of order): the dict takes it, and no page is made again.
                    self._sparse[seq] = row
                    return
                self._turn_page(number)
                page = self._newest
            else:
                page = found
        slot = seq & _MASK
        if page[slot] is None:
            page[PAGE] += 1
        page[slot] = row

    def __delitem__(self, seq: int) -> None:
        number = seq >> _SHIFT
        page = self._pages.get(number)
        slot = seq & _MASK
        if page is None or page[slot] is None:
            del self._sparse[seq]
            return
        page[slot] = None
        live = page[PAGE] = page[PAGE] - 1
        if live <= SPARSE and number != self._top:
            self._spill(number, page)

    def _turn_page(self, number: int) -> None:
        """Make page ``number`` the newest; the one before is held to the sparse rule."""
        old = self._newest
        if old[PAGE] <= SPARSE:
            self._spill(self._top, old)
        self._newest = self._pages[number] = _page()
        self._top = number

    def _spill(self, number: int, page: list[Any]) -> None:
        """Move a sparse page's rows to the dict and free the page (each row moves at
        most once: a row in the dict stays there)."""
        base = number << _SHIFT
        sparse = self._sparse
        for slot in range(PAGE):
            row = page[slot]
            if row is not None:
                sparse[base + slot] = row
        del self._pages[number]


def _page() -> list[Any]:
    page: list[Any] = [None] * (PAGE + 1)
    page[PAGE] = 0
    return page
