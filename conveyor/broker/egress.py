"""When a frame may leave the broker: one tag per kind of frame, one table of waits.

Every outgoing frame is tagged where it is made (``Out``), and ``wait_for`` says what it
waits for before it goes to its connection's outbox. This is the one place that rule
lives; ``Connection.emit`` applies it through the commit gate.

- ``REPLY`` waits until everything changed before it is durable: a reply confirms, and
  what it confirms must survive a power loss.
- ``SUBSCRIBED`` (the reply to ``subscribe``) waits as a ``REPLY``; after it the
  connection's pushes may leave early.
- ``PUSH`` (a ``jobs`` push with no job on its last attempt) waits until its claims are
  written: a killed broker keeps them; a power loss may hand those jobs out again, at
  the cost of an attempt each still has.
- ``LAST_PUSH`` (a ``jobs`` push with a job on its last attempt) waits until durable:
  once out, no power loss may start that job again (``max_attempts`` 1 is at most one
  start).
- ``NOTICE`` (a ``cancelled`` push) waits until durable: it reports a change.
- ``SNAPSHOT`` (the dashboard's feed) waits for nothing: it confirms nothing.
- ``CLOSE`` (the close frame) waits until durable, behind every frame made before it: a
  close never overtakes a reply.

A ``PUSH`` made before its connection's ``subscribe`` was answered waits as a ``REPLY``,
so that the reply comes first. With the memory store nothing is ever written or synced:
``IMMEDIATE``, the gate it uses, meets every wait at once. Pure: no I/O.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Protocol

__all__ = ["IMMEDIATE", "Gate", "Out", "Wait", "wait_for"]


class Out(enum.Enum):
    """What an outgoing frame is (see the module's table)."""

    REPLY = "reply"
    SUBSCRIBED = "subscribed"
    PUSH = "push"
    LAST_PUSH = "last push"
    NOTICE = "notice"
    SNAPSHOT = "snapshot"
    CLOSE = "close"


class Wait(enum.Enum):
    """What a frame waits for before it may go to its outbox."""

    NOTHING = "nothing"
    WRITTEN = "written"  # the changes before it are written (a killed broker keeps them)
    DURABLE = "durable"  # ... and synced (a power loss keeps them)


_WAITS = {
    Out.REPLY: Wait.DURABLE,
    Out.SUBSCRIBED: Wait.DURABLE,
    Out.PUSH: Wait.WRITTEN,
    Out.LAST_PUSH: Wait.DURABLE,
    Out.NOTICE: Wait.DURABLE,
    Out.SNAPSHOT: Wait.NOTHING,
    Out.CLOSE: Wait.DURABLE,
}


def wait_for(out: Out, subscribed: bool) -> Wait:
    """What a frame of kind ``out`` waits for, on a connection whose ``subscribe`` reply
    has (``subscribed``) or has not yet gone out."""
    if out is Out.PUSH and not subscribed:
        return Wait.DURABLE
    return _WAITS[out]


Deliver = Callable[[bytes], None]


class Gate(Protocol):
    """Where frames wait: the commit gate of a durable store, or ``IMMEDIATE``."""

    def hold(self, deliver: Deliver, data: bytes) -> None:
        """``deliver(data)`` once everything changed so far is durable."""
        ...

    def hold_early(self, deliver: Deliver, data: bytes, flush: Callable[[], None]) -> None:
        """``deliver(data)`` once everything changed so far is written; ``flush`` puts it
        on the wire before a sync that follows."""
        ...

    def poke(self) -> None:
        """The table changed without a frame: commit it soon."""
        ...


class _Immediate:
    """The gate of a store that writes nothing: every wait is met at once."""

    def hold(self, deliver: Deliver, data: bytes) -> None:
        deliver(data)

    def hold_early(self, deliver: Deliver, data: bytes, flush: Callable[[], None]) -> None:
        deliver(data)

    def poke(self) -> None:
        pass


IMMEDIATE: Gate = _Immediate()
