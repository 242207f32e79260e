"""The event loop ``conveyor serve`` and ``conveyor worker`` run on (``--loop``).

Both commands take the same choices, help text and refusals from here: uvloop when it
is installed (``auto``, the default), or asyncio's own loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["LOOPS", "LOOP_HELP", "UVLOOP_MISSING", "loop_factory", "loop_problem"]

LOOPS = ("auto", "uvloop", "asyncio")
LOOP_HELP = "event loop: uvloop when installed (auto, the default), or asyncio (CONVEYOR_LOOP)"
UVLOOP_MISSING = "conveyor: --loop uvloop: uvloop is not installed (pip install uvloop)"


def loop_problem(choice: str) -> str | None:
    """What is wrong with ``choice`` as a loop (a message naming the field), or ``None``."""
    if choice in LOOPS:
        return None
    return f"loop: must be auto, uvloop or asyncio, got {choice!r}"


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop to run on, for ``choice`` one of ``LOOPS``: uvloop's when asked
    for, or (``auto``) when it is installed; ``None`` for asyncio's own (the default of
    ``asyncio.Runner``, which takes the result as its ``loop_factory``).

    Raises ``ImportError`` for ``uvloop`` when it is not installed.
    """
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory
