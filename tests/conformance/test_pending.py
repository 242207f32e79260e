"""What a backend call returns (``Pending``): ``Ready`` for an answer there at once, an
asyncio future for one that comes later, and the server's ``ready`` that reads one."""

from __future__ import annotations

import asyncio

import pytest

from conveyor.broker.backend import Ready, ready, then


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
    with pytest.raises(RuntimeError, match="not there yet"):
        ready(later)
    later.set_result(3)
    assert ready(later) == 3


async def test_then_makes_a_result_at_once_from_one_there_and_later_from_one_to_come() -> None:
    assert isinstance(then(Ready(2), lambda x: x * 10), Ready)
    assert ready(then(Ready(2), lambda x: x * 10)) == 20
    later: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    made = then(later, lambda x: x * 10)
    seen: list[int] = []
    made.add_done_callback(lambda done: seen.append(done.result()))
    assert not made.done() and seen == []
    later.set_result(3)
    await asyncio.sleep(0)  # (the future's callbacks run at the loop's next turn)
    # The callbacks of what ``then`` made ran in the callback that settled it.
    assert seen == [30] and await made == 30
    failing: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    broken = then(failing, lambda x: x * 10)
    failing.set_exception(ValueError("no"))
    await asyncio.sleep(0)
    with pytest.raises(ValueError, match="no"):
        broken.result()
