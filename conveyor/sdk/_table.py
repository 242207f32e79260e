"""Plain-text output for people: tables, field lists, times and durations.

The ``conveyor`` client commands print with these unless given ``--json``. No third-party
table library: columns are as wide as their widest cell, numbers align right, and a cell
too long for its column's ``limit`` ends in ``…``. Times are never epoch floats: a local
date and time with how far it is from ``now`` ("in 3 min", "5 s ago").

Every function is pure: ``now`` (epoch seconds) and the time zone come in as arguments
(the zone defaults to the machine's local one), so the output is testable to the
character.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Column", "ago", "duration", "fields", "table", "when"]

_ELLIPSIS = "…"


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a ``table``: its heading, whether its cells align right (numbers),
    and the most characters a cell may show (``None``: no limit)."""

    heading: str
    right: bool = False
    limit: int | None = None


def _clip(text: str, limit: int | None) -> str:
    """``text`` on one line, at most ``limit`` characters (the last one ``…`` when cut)."""
    text = " ".join(text.split()) if "\n" in text or "\t" in text else text
    if limit is None or len(text) <= limit:
        return text
    return text[: max(limit - 1, 0)] + _ELLIPSIS


def table(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> str:
    """``rows`` under ``columns``' headings, two spaces between columns, each column as
    wide as its widest cell (heading included). No trailing spaces; no final newline.

    Raises ``ValueError`` for a row with another number of cells than there are columns.
    """
    clipped: list[list[str]] = []
    for number, row in enumerate(rows):
        if len(row) != len(columns):
            raise ValueError(f"row {number} has {len(row)} cells for {len(columns)} columns")
        clipped.append(
            [_clip(cell, column.limit) for cell, column in zip(row, columns, strict=True)]
        )
    widths = [len(column.heading) for column in columns]
    for row in clipped:
        widths = [max(width, len(cell)) for width, cell in zip(widths, row, strict=True)]
    lines = []
    for row in [[column.heading for column in columns], *clipped]:
        cells = [
            cell.rjust(width) if column.right else cell.ljust(width)
            for cell, width, column in zip(row, widths, columns, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def fields(pairs: Sequence[tuple[str, str]]) -> str:
    """One ``name: value`` per line, the values aligned; no final newline. A value of
    several lines continues under its first, indented as far."""
    if not pairs:
        return ""
    width = max(len(name) for name, _ in pairs) + 1  # (the colon)
    lines = []
    for name, value in pairs:
        first, *rest = value.split("\n") or [""]
        lines.append(f"{name + ':':<{width}} {first}".rstrip())
        lines.extend(f"{'':<{width}} {line}".rstrip() for line in rest)
    return "\n".join(lines)


def duration(seconds: float) -> str:
    """A length of time as people say it, to its largest unit or two: ``"0.4 s"``,
    ``"12 s"``, ``"3 min"``, ``"3 min 20 s"``, ``"2 h 5 min"``, ``"4 d 3 h"``.

    Rounded down, so that a job "ready for 59 s" is not said to be so for a minute; the
    sign is dropped (``ago`` and ``when`` say which way). Not a finite number: ``"?"``.
    """
    if not math.isfinite(seconds):
        return "?"
    seconds = abs(seconds)
    if seconds < 10 and seconds != int(seconds):
        return f"{math.floor(seconds * 10) / 10:g} s"
    whole = int(seconds)
    for unit, size, smaller, smaller_size in (
        ("d", 86_400, "h", 3600),
        ("h", 3600, "min", 60),
        ("min", 60, "s", 1),
    ):
        if whole >= size:
            big, rest = divmod(whole, size)
            small = rest // smaller_size
            # The smaller unit only while the larger is small: "3 min 20 s", not "45 min 20 s".
            if small and big < 10:
                return f"{big} {unit} {small} {smaller}"
            return f"{big} {unit}"
    return f"{whole} s"


def ago(at: float, now: float) -> str:
    """How far ``at`` is from ``now``: ``"5 s ago"``, ``"in 3 min"``, or ``"now"`` within
    half a second either way."""
    delta = at - now
    if abs(delta) < 0.5:
        return "now"
    return f"in {duration(delta)}" if delta > 0 else f"{duration(delta)} ago"


def when(
    at: float | None, now: float, *, tz: datetime.tzinfo | None = None, short: bool = False
) -> str:
    """An epoch time as a local date and time with how far it is from ``now``:
    ``"2024-05-01 14:03:22 (5 s ago)"``; ``"-"`` for ``None``.

    ``short`` (for table cells) leaves out the date of a time on ``now``'s day:
    ``"14:03:22 (in 3 min)"``. ``tz`` is the zone shown (the machine's own by default).
    """
    if at is None:
        return "-"
    if not math.isfinite(at):
        return "?"
    moment = datetime.datetime.fromtimestamp(at, tz).astimezone(tz)
    today = datetime.datetime.fromtimestamp(now, tz).astimezone(tz).date()
    shown = moment.strftime("%H:%M:%S")
    if not short or moment.date() != today:
        shown = f"{moment:%Y-%m-%d} {shown}"
    return f"{shown} ({ago(at, now)})"
