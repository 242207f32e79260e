"""When each kind of frame may leave (broker/egress.py): the table, and the gate of a
store that writes nothing."""

from __future__ import annotations

import pytest

from conveyor.broker.egress import IMMEDIATE, Out, Wait, wait_for


@pytest.mark.parametrize(
    ("out", "subscribed", "wait"),
    [
        (Out.REPLY, True, Wait.DURABLE),
        (Out.SUBSCRIBED, False, Wait.DURABLE),
        (Out.PUSH, True, Wait.WRITTEN),
        # Before the subscribe reply is out, a push waits like it, so that it comes first.
        (Out.PUSH, False, Wait.DURABLE),
        # A job's last attempt never leaves before its claim survives a power loss.
        (Out.LAST_PUSH, True, Wait.DURABLE),
        (Out.NOTICE, True, Wait.DURABLE),
        (Out.SNAPSHOT, False, Wait.NOTHING),
        (Out.CLOSE, True, Wait.DURABLE),
    ],
)
def test_what_each_frame_waits_for(out: Out, subscribed: bool, wait: Wait) -> None:
    assert wait_for(out, subscribed) is wait


def test_every_kind_of_frame_has_a_rule() -> None:
    for out in Out:
        for subscribed in (False, True):
            assert isinstance(wait_for(out, subscribed), Wait)


def test_with_nothing_to_write_every_wait_is_met_at_once() -> None:
    delivered: list[bytes] = []
    flushed: list[None] = []
    IMMEDIATE.hold(delivered.append, b"reply")
    IMMEDIATE.hold_early(delivered.append, b"push", lambda: flushed.append(None))
    IMMEDIATE.poke()
    assert delivered == [b"reply", b"push"]
    assert flushed == []  # written at the loop's turn, like any frame
