"""Conveyor's Python SDK: publishers (``Client``, ``SyncClient``) and workers (``Worker``).

::

    from conveyor.sdk import Client, SyncClient, Worker, Job, JobInfo, Retry, Fail, ConveyorError

    async with Client("ws://127.0.0.1:8765") as client:
        job_id = await client.enqueue("emails", {"to": "a@b.c"})

    worker = Worker("ws://127.0.0.1:8765", queues=["emails"])

    @worker.handler("emails")
    async def send(job: Job) -> None: ...

    @worker.task("reports")  # a typed function; then `await build.enqueue(month=3)`
    async def build(month: int, fmt: str = "pdf") -> None: ...

    await worker.run()

    # In your own PostgreSQL transaction, when the broker keeps its table there:
    job_id = enqueue_tx(conn, "emails", {"to": "a@b.c"})  # (or await enqueue_tx_async)

The SDK depends on websockets, orjson and anyio only, and never imports ``conveyor.broker``
(``enqueue_tx`` takes a connection of psycopg 3 or asyncpg, and imports neither).
Errors are ``ConveyorError`` subclasses, one per protocol error code (``sdk._errors``).
"""

from ._client import Client, SyncClient
from ._errors import (
    BadFrame,
    BadJson,
    Conflict,
    ConnectionFailed,
    ConveyorError,
    DependencyCycle,
    Forbidden,
    Internal,
    InvalidArgument,
    JobCancelled,
    JobFailed,
    JobNotFound,
    LimitExceeded,
    NotFound,
    TooLarge,
    Unauthorized,
    Unavailable,
    UnknownOp,
    UnsupportedVersion,
)
from ._tasks import Task
from ._types import (
    Fail,
    Group,
    Job,
    JobEvent,
    JobInfo,
    JobPage,
    RateLimited,
    Retry,
    ScheduleInfo,
    SchedulePage,
)
from ._worker import Worker
from .transactional import enqueue_tx, enqueue_tx_async

__all__ = [
    "BadFrame",
    "BadJson",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "ConveyorError",
    "DependencyCycle",
    "Fail",
    "Forbidden",
    "Group",
    "Internal",
    "InvalidArgument",
    "Job",
    "JobCancelled",
    "JobEvent",
    "JobFailed",
    "JobInfo",
    "JobNotFound",
    "JobPage",
    "LimitExceeded",
    "NotFound",
    "RateLimited",
    "Retry",
    "ScheduleInfo",
    "SchedulePage",
    "SyncClient",
    "Task",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "UnknownOp",
    "UnsupportedVersion",
    "Worker",
    "enqueue_tx",
    "enqueue_tx_async",
]
