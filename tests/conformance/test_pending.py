"""What a backend call returns (``Pending``): ``Ready`` for an answer there at once, an
asyncio future for one that comes later, and the server's ``ready`` that reads one."""

from __future__ import annotations

import asyncio

import pytest

from broker.backend import Ready, ready


async def test_a_ready_result_is_done_readable_and_awaitable_without_a_loop_turn() -> None:
    result = Ready([1, 2])
    assert result.done() and result.result() == [1, 2]
    assert ready(result) == [1, 2]
    # Awaiting it yields nothing to the loop: a callback scheduled first has not run.
    ran: list[bool] = []
    asyncio.get_running_loop().call_soon(ran.append, True)
    assert await result == [1, 2]
    assert ran == []


async def test_ready_refuses_a_result_that_is_not_there_yet() -> None:
    later: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    with pytest.raises(RuntimeError, match="answers at once"):
        ready(later)
    later.set_result(3)
    assert ready(later) == 3
