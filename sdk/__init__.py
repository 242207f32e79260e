"""Conveyor's Python SDK: publishers (``Client``, ``SyncClient``) and workers (``Worker``).

::

    from sdk import Client, SyncClient, Worker, Job, JobInfo, Retry, Fail, ConveyorError

    async with Client("ws://127.0.0.1:8765") as client:
        job_id = await client.enqueue("emails", {"to": "a@b.c"})

    worker = Worker("ws://127.0.0.1:8765", queues=["emails"])

    @worker.handler("emails")
    async def send(job: Job) -> None: ...

    await worker.run()

The SDK depends on websockets, orjson and anyio only, and never imports ``broker``.
Errors are ``ConveyorError`` subclasses, one per protocol error code (``sdk._errors``).
"""

from ._client import Client, SyncClient
from ._errors import (
    BadFrame,
    BadJson,
    Conflict,
    ConnectionFailed,
    ConveyorError,
    Forbidden,
    Internal,
    InvalidArgument,
    LimitExceeded,
    NotFound,
    TooLarge,
    Unauthorized,
    Unavailable,
    UnknownOp,
    UnsupportedVersion,
)
from ._types import Fail, Job, JobInfo, Retry
from ._worker import Worker

__all__ = [
    "BadFrame",
    "BadJson",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "ConveyorError",
    "Fail",
    "Forbidden",
    "Internal",
    "InvalidArgument",
    "Job",
    "JobInfo",
    "LimitExceeded",
    "NotFound",
    "Retry",
    "SyncClient",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "UnknownOp",
    "UnsupportedVersion",
    "Worker",
]
