"""The engine's one exception.

``InvalidArgument`` (a ``ValueError``) is raised for a bad argument: a wrong type, a
value out of range, a bad queue name, a payload that is not strict JSON or is too large.
Its ``field`` names the offending argument (``"priority"``, ``"jobs[3].delay_s"``) and
its message starts with that name. A call that raises has changed nothing.

A failed *validity predicate* (a lapsed or foreign lease, an unknown id) is never an
exception: those operations answer ``False`` or ``None`` (``docs/contract.md``, HND-2).
"""

from __future__ import annotations

__all__ = ["DependencyCycle", "InvalidArgument", "PayloadTooLarge"]


class InvalidArgument(ValueError):
    """An argument broke a guard (``docs/contract.md``, ENQ-7); nothing was changed."""

    code = "invalid_argument"

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem

    def within(self, prefix: str) -> InvalidArgument:
        """The same error, its field placed under ``prefix`` (``jobs[3]`` + ``.priority``)."""
        return type(self)(f"{prefix}.{self.field}", self.problem)


class PayloadTooLarge(InvalidArgument):
    """The encoded payload is over the table's ``max_payload_bytes``."""

    code = "too_large"


class DependencyCycle(InvalidArgument):
    """The jobs of a group depend on each other in a circle (DEP-4): none can ever run."""

    code = "dependency_cycle"
