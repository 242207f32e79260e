"""Conveyor: a job queue broker that pushes work to workers over WebSockets.

The package a publisher or a worker imports::

    from conveyor import Client, SyncClient, Worker, Job, Retry, Fail

    async with Client("ws://127.0.0.1:8765") as client:
        job_id = await client.enqueue("emails", {"to": "a@b.c"})

Its subpackages: ``conveyor.sdk`` (what this module re-exports: the publishers, the worker
runtime and the client commands), ``conveyor.broker`` (``conveyor serve``: the job table
engine, its stores and the WebSocket server) and ``conveyor.web`` (the dashboard's files,
which the broker serves).
"""

from .sdk import (
    BadFrame,
    BadJson,
    Client,
    Conflict,
    ConnectionFailed,
    ConveyorError,
    DependencyCycle,
    Fail,
    Forbidden,
    Group,
    Internal,
    InvalidArgument,
    Job,
    JobCancelled,
    JobEvent,
    JobFailed,
    JobInfo,
    JobNotFound,
    JobPage,
    LimitExceeded,
    NotFound,
    RateLimited,
    Retry,
    ScheduleInfo,
    SchedulePage,
    SyncClient,
    Task,
    TooLarge,
    Unauthorized,
    Unavailable,
    UnknownOp,
    UnsupportedVersion,
    Worker,
    enqueue_tx,
    enqueue_tx_async,
)

__version__ = "0.1.0"

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
    "__version__",
    "enqueue_tx",
    "enqueue_tx_async",
]
