"""The SDK's exceptions: one root, one subclass per protocol error code.

::

    ConveyorError                  .code, .message, .field
     ├── BadJson, BadFrame, UnknownOp         the client sent what the broker cannot read
     ├── InvalidArgument (also ValueError)    a field is missing, mistyped or out of range
     │    └── DependencyCycle                 a group's jobs depend on each other in a circle
     ├── Unauthorized, Forbidden              no token / a token without the role
     ├── NotFound, TooLarge, LimitExceeded, Conflict, UnsupportedVersion
     ├── Internal                             the broker hit a bug (no details are sent)
     ├── Unavailable                          the broker is shutting down
     ├── ConnectionFailed                     the broker could not be reached in time
     ├── JobFailed                            client.result: the job died (.error)
     └── JobCancelled                         client.result: the job was cancelled

``NotFound`` has a subclass of its own, ``JobNotFound``: ``client.result`` of a job the
broker does not know (none had that id, or it finished and was not kept). ``JobFailed``,
``JobCancelled`` and ``JobNotFound`` name the job in ``job_id``.

An error code the SDK does not know becomes a plain ``Internal``-like ``ConveyorError``
with that code, as docs/protocol.md §5 asks.
"""

from __future__ import annotations

from typing import Any

from ._wire import ErrorCode

__all__ = [
    "BadFrame",
    "BadJson",
    "Conflict",
    "ConnectionFailed",
    "ConveyorError",
    "DependencyCycle",
    "Forbidden",
    "Internal",
    "InvalidArgument",
    "JobCancelled",
    "JobFailed",
    "JobNotFound",
    "LimitExceeded",
    "NotFound",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "UnknownOp",
    "UnsupportedVersion",
    "error_from_reply",
]


class ConveyorError(Exception):
    """Root of every error the SDK raises. ``code`` is the protocol's stable error code."""

    code: str = "internal"

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        if code is not None:
            self.code = code


class BadJson(ConveyorError):
    code = ErrorCode.BAD_JSON.value


class BadFrame(ConveyorError):
    code = ErrorCode.BAD_FRAME.value


class UnknownOp(ConveyorError):
    code = ErrorCode.UNKNOWN_OP.value


class InvalidArgument(ConveyorError, ValueError):
    """A bad argument; ``field`` names it (``"priority"``, ``"jobs[3].delay_s"``)."""

    code = ErrorCode.INVALID_ARGUMENT.value


class DependencyCycle(InvalidArgument):
    """``enqueue_group``: members depend on each other in a circle (``field`` names one
    member's ``after``); nothing was stored."""

    code = ErrorCode.DEPENDENCY_CYCLE.value


class Unauthorized(ConveyorError):
    code = ErrorCode.UNAUTHORIZED.value


class Forbidden(ConveyorError):
    code = ErrorCode.FORBIDDEN.value


class NotFound(ConveyorError):
    code = ErrorCode.NOT_FOUND.value


class TooLarge(ConveyorError):
    code = ErrorCode.TOO_LARGE.value


class LimitExceeded(ConveyorError):
    code = ErrorCode.LIMIT_EXCEEDED.value


class Conflict(ConveyorError):
    code = ErrorCode.CONFLICT.value


class UnsupportedVersion(ConveyorError):
    code = ErrorCode.UNSUPPORTED_VERSION.value


class Internal(ConveyorError):
    code = ErrorCode.INTERNAL.value


class Unavailable(ConveyorError):
    code = ErrorCode.UNAVAILABLE.value


class ConnectionFailed(ConveyorError):
    """The broker could not be reached (or reached again) within the client's timeout.

    ``refused``: a ``fail_fast`` client's try of some URL was refused (nothing listens
    there: is the broker running?)."""

    code = "connection_failed"
    refused = False


class JobFailed(ConveyorError):
    """The job awaited by ``client.result`` died (its attempts used up, a ``Fail``, or
    expired): ``error`` is its last error (``None`` when it had none)."""

    code = "job_failed"

    def __init__(self, job_id: str, error: str | None) -> None:
        super().__init__(f"job {job_id} failed: {error or 'no error given'}")
        self.job_id = job_id
        self.error = error


class JobCancelled(ConveyorError):
    """The job awaited by ``client.result`` was cancelled before it ended."""

    code = "job_cancelled"

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id} was cancelled")
        self.job_id = job_id


class JobNotFound(NotFound):
    """``client.result`` of a job the broker does not know: no job had that id, or it
    finished on a queue that does not keep finished jobs (``completed_retention_s``)
    before the wait began."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id}: no such job (or it finished and was not kept)")
        self.job_id = job_id


_BY_CODE: dict[str, type[ConveyorError]] = {
    cls.code: cls
    for cls in (
        BadJson,
        BadFrame,
        UnknownOp,
        InvalidArgument,
        DependencyCycle,
        Unauthorized,
        Forbidden,
        NotFound,
        TooLarge,
        LimitExceeded,
        Conflict,
        UnsupportedVersion,
        Internal,
        Unavailable,
    )
}


def error_from_reply(error: dict[str, Any]) -> ConveyorError:
    """The exception for an error reply's ``error`` member."""
    code = str(error.get("code", "internal"))
    message = str(error.get("message", code))
    field = error.get("field")
    cls = _BY_CODE.get(code)
    if cls is None:
        return ConveyorError(message, field=field, code=code)
    return cls(message, field=field)
