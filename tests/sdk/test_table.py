"""The plain-text formatter of the client commands (``conveyor/sdk/_table.py``)."""

from __future__ import annotations

import datetime

import pytest

from conveyor.sdk._table import Column, ago, duration, fields, table, when

UTC = datetime.UTC
# 2024-05-01 12:00:00 UTC
NOON = datetime.datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC).timestamp()


def test_columns_are_as_wide_as_their_widest_cell_and_numbers_align_right() -> None:
    out = table(
        [Column("QUEUE"), Column("READY", right=True), Column("PAUSED")],
        [["emails", "3", "no"], ["a-much-longer-queue", "12345", "yes"]],
    )
    assert out.split("\n") == [
        "QUEUE                READY  PAUSED",
        "emails                   3  no",
        "a-much-longer-queue  12345  yes",
    ]


def test_a_heading_wider_than_every_cell_sets_the_width() -> None:
    out = table([Column("ID"), Column("PROCESSING", right=True)], [["x", "1"]])
    assert out == "ID  PROCESSING\nx            1"


def test_no_rows_prints_the_headings_alone() -> None:
    assert table([Column("A"), Column("B")], []) == "A  B"


def test_a_cell_over_its_limit_is_cut_with_an_ellipsis_and_kept_on_one_line() -> None:
    out = table(
        [Column("ERROR", limit=10), Column("N", right=True)], [["a\nb\tc d e f g h i", "1"]]
    )
    assert out.split("\n") == ["ERROR       N", "a b c d e…  1"]
    assert table([Column("E", limit=10)], [["0123456789"]]) == "E\n0123456789"  # fits as is


def test_a_row_with_the_wrong_number_of_cells_is_refused() -> None:
    with pytest.raises(ValueError, match="row 1 has 1 cells for 2 columns"):
        table([Column("A"), Column("B")], [["1", "2"], ["3"]])


def test_fields_align_their_values_and_continue_long_ones_underneath() -> None:
    out = fields([("id", "j1"), ("payload", '{\n  "to": 1\n}'), ("last_error", "")])
    assert out.split("\n") == [
        "id:         j1",
        "payload:    {",
        '              "to": 1',
        "            }",
        "last_error:",
    ]
    assert fields([]) == ""


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (0, "0 s"),
        (0.45, "0.4 s"),
        (9.99, "9.9 s"),
        (12.7, "12 s"),
        (59.9, "59 s"),
        (60, "1 min"),
        (200, "3 min 20 s"),
        (180, "3 min"),
        (45 * 60 + 20, "45 min"),
        (3600 * 2 + 5 * 60, "2 h 5 min"),
        (3600 * 23 + 59 * 60, "23 h"),
        (86_400 * 4 + 3 * 3600, "4 d 3 h"),
        (86_400 * 40, "40 d"),
        (-200, "3 min 20 s"),  # the sign is for ago() and when() to say
        (float("nan"), "?"),
    ],
)
def test_durations_are_said_in_their_largest_units_rounded_down(seconds: float, said: str) -> None:
    assert duration(seconds) == said


def test_ago_says_which_way_and_now_for_a_moment() -> None:
    assert ago(NOON - 5, NOON) == "5 s ago"
    assert ago(NOON + 180, NOON) == "in 3 min"
    assert ago(NOON + 0.3, NOON) == "now"
    assert ago(NOON - 0.4, NOON) == "now"


def test_when_is_a_local_date_and_time_with_how_far_it_is() -> None:
    assert when(NOON - 5, NOON, tz=UTC) == "2024-05-01 11:59:55 (5 s ago)"
    assert when(NOON + 180, NOON, tz=UTC) == "2024-05-01 12:03:00 (in 3 min)"
    assert when(None, NOON, tz=UTC) == "-"
    # In the zone given: 12:00 UTC is 14:00 at UTC+2.
    plus_two = datetime.timezone(datetime.timedelta(hours=2))
    assert when(NOON, NOON, tz=plus_two) == "2024-05-01 14:00:00 (now)"


def test_when_short_leaves_out_the_date_of_a_time_today_only() -> None:
    assert when(NOON + 60, NOON, tz=UTC, short=True) == "12:01:00 (in 1 min)"
    yesterday = NOON - 86_400 * 2
    assert when(yesterday, NOON, tz=UTC, short=True) == "2024-04-29 12:00:00 (2 d ago)"


def test_when_uses_the_local_zone_by_default() -> None:
    local = datetime.datetime.fromtimestamp(NOON).strftime("%Y-%m-%d %H:%M:%S")
    assert when(NOON, NOON) == f"{local} (now)"
