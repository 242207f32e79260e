"""Tasks: a typed function as a queue's handler, and the way to enqueue its calls.

``@worker.task("emails")`` on ``async def send_email(to: str, subject: str = "hi")``
makes a ``Task``: the worker runs the function for each job of ``emails``, called with
the job's payload as keyword arguments (a function whose first parameter is named
``job`` gets the ``Job`` there too); a publisher that imports the module enqueues a call
with ``await send_email.enqueue(to="a@b.c")``, its arguments checked against the
function's signature before anything is sent (a missing or unknown one raises
``TypeError`` naming it). The payload is the JSON object of the arguments given (the
defaults are the worker's to fill in).

Where ``.enqueue`` sends the job: to a client shared by every task of the worker, made
on first use for the worker's ``urls`` and ``token`` (a ``SyncClient``: its own thread
and event loop, so that it serves every thread and event loop of the process; closed at
exit, or by ``Worker.close_tasks_client()``). ``.enqueue_sync`` is the same, blocking.
``.options(client=..., delay_s=..., priority=..., key=..., timeout_s=...)`` binds a
client of the caller's own (a ``Client`` for ``.enqueue``, a ``SyncClient`` for
``.enqueue_sync``) and the per-job options of ``Client.enqueue``.
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from ._client import Client, SyncClient
from ._types import Fail, Job

if TYPE_CHECKING:
    from ._worker import Worker

__all__ = ["Task", "TaskCall", "TaskMaker"]

P = ParamSpec("P")
R = TypeVar("R")


def takes_job(fn: Callable[..., Any]) -> bool:
    """Whether ``fn``'s first parameter is ``job`` (a positional one): it gets the Job."""
    params = list(inspect.signature(fn).parameters.values())
    return (
        bool(params)
        and params[0].name == "job"
        and params[0].kind
        in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        )
    )


class TaskMaker:
    """What ``@worker.task(queue)`` applies to the function (typed for both forms: with
    a leading ``job: Job`` parameter, or without)."""

    def __init__(self, worker: Worker, queue: str, timeout_s: float | None) -> None:
        self._worker = worker
        self._queue = queue
        self._timeout_s = timeout_s

    @overload
    def __call__(self, fn: Callable[Concatenate[Job, P], R]) -> Task[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R]) -> Task[P, R]: ...
    def __call__(self, fn: Callable[..., Any]) -> Task[Any, Any]:
        task: Task[Any, Any] = Task(self._worker, self._queue, fn)
        self._worker.handler(self._queue, timeout_s=self._timeout_s)(task.handler())
        return task


class Task(Generic[P, R]):
    """A function registered with ``@worker.task(queue)``: see the module docstring.

    ``fn`` is the function as written; ``queue`` its queue. ``P`` is the signature a call
    is enqueued with (the function's, less a leading ``job``), which mypy checks.
    """

    def __init__(self, worker: Worker, queue: str, fn: Callable[..., Any]) -> None:
        self.worker = worker
        self.queue = queue
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "task")
        self.__doc__ = getattr(fn, "__doc__", None)
        self._job = takes_job(fn)
        signature = inspect.signature(fn)
        params = list(signature.parameters.values())
        # What a call is checked against: the signature less the Job's parameter.
        self._signature = signature.replace(parameters=params[1:] if self._job else params)
        self._is_async = inspect.iscoroutinefunction(fn)

    def __repr__(self) -> str:
        return f"<Task {self.__name__} on {self.queue!r}>"

    # -- publishing --------------------------------------------------------------------

    def payload(self, *args: P.args, **kwargs: P.kwargs) -> dict[str, Any]:
        """The payload a call with these arguments is enqueued as: the arguments given,
        by name. Raises ``TypeError`` naming a missing or unknown argument."""
        try:
            bound = self._signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.__name__}(): {exc}") from None
        payload: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            kind = self._signature.parameters[name].kind
            if kind is inspect.Parameter.VAR_POSITIONAL:
                if value:
                    raise TypeError(f"{self.__name__}(): *{name} cannot be enqueued")
            elif kind is inspect.Parameter.VAR_KEYWORD:
                payload.update(value)
            else:
                payload[name] = value
        return payload

    async def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """Enqueue a call of this task through the worker's shared client; its job id."""
        return await TaskCall(self).enqueue(*args, **kwargs)

    def enqueue_sync(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """``enqueue``, blocking (for threads and scripts; not from an event loop)."""
        return TaskCall(self).enqueue_sync(*args, **kwargs)

    def options(
        self,
        *,
        client: Client | SyncClient | None = None,
        priority: int | None = None,
        delay_s: float | None = None,
        run_at: float | None = None,
        expires_s: float | None = None,
        visibility_timeout_s: float | None = None,
        max_attempts: int | None = None,
        backoff_base_s: float | None = None,
        key: str | None = None,
        timeout_s: float | None = None,
    ) -> TaskCall[P]:
        """This task with a client of the caller's own and per-job options (those of
        ``Client.enqueue``; ``None``: not set): ``await task.options(delay_s=60)
        .enqueue(to="a@b.c")``."""
        given = {
            "priority": priority, "delay_s": delay_s, "run_at": run_at,
            "expires_s": expires_s, "visibility_timeout_s": visibility_timeout_s,
            "max_attempts": max_attempts, "backoff_base_s": backoff_base_s, "key": key,
            "timeout_s": timeout_s,
        }  # fmt: skip
        return TaskCall(self, client, {k: v for k, v in given.items() if v is not None})

    # -- running (the worker's side) ---------------------------------------------------

    def handler(self) -> Callable[[Job], Awaitable[Any]] | Callable[[Job], Any]:
        """The job handler that runs this task: async for an async function, plain (run
        in a thread by the worker) for a plain one. The function's return value is the
        job's result."""
        if self._is_async:

            async def run_async(job: Job) -> Any:
                args, kwargs = self._arguments(job)
                return await self.fn(*args, **kwargs)

            return run_async

        def run(job: Job) -> Any:
            args, kwargs = self._arguments(job)
            return self.fn(*args, **kwargs)

        return run

    def _arguments(self, job: Job) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The call a job stands for. A payload that cannot be one (not an object, or
        arguments the function does not take) fails the job: retrying cannot mend it."""
        payload = job.payload
        if not isinstance(payload, dict):
            raise Fail(
                f"{self.__name__}: the payload must be an object of keyword arguments, "
                f"got {type(payload).__name__}"
            )
        try:
            self._signature.bind(**payload)
        except TypeError as exc:
            raise Fail(f"{self.__name__}(): {exc}") from None
        return ((job,) if self._job else ()), payload


@dataclass(frozen=True, slots=True)
class TaskCall(Generic[P]):
    """A task bound to a client and per-job options (``Task.options``)."""

    task: Task[P, Any]
    client: Client | SyncClient | None = None
    opts: dict[str, Any] = field(default_factory=dict)

    async def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """Enqueue a call: through ``client`` (a ``Client``), or the worker's shared one."""
        payload = self.task.payload(*args, **kwargs)  # (checked before anything is sent)
        client = self.client
        if isinstance(client, SyncClient):
            raise TypeError("enqueue: a SyncClient's task call is enqueue_sync()")
        if client is not None:
            return await client.enqueue(self.task.queue, payload, **self.opts)
        shared = self.task.worker._publisher
        if shared is None:  # connected in a thread: this event loop goes on meanwhile
            shared = await asyncio.to_thread(_shared, self.task.worker)
        try:
            future = shared._enqueue_soon(self.task.queue, payload, **self.opts)
        except RuntimeError:  # (closed meanwhile)
            raise RuntimeError("the tasks' client is closed") from None
        return await asyncio.wrap_future(future)

    def enqueue_sync(self, *args: P.args, **kwargs: P.kwargs) -> str:
        """``enqueue``, blocking: through ``client`` (a ``SyncClient``), or the shared one."""
        payload = self.task.payload(*args, **kwargs)
        client = self.client
        if isinstance(client, Client):
            raise TypeError("enqueue_sync: a Client's task call is `await enqueue()`")
        if client is None:
            client = _shared(self.task.worker)
        return client.enqueue(self.task.queue, payload, **self.opts)


_lock = threading.Lock()


def _shared(worker: Worker) -> SyncClient:
    """The worker's tasks' client, connected on first use (see the module docstring)."""
    client: SyncClient | None = worker._publisher
    if client is not None:
        return client
    with _lock:
        if worker._publisher is None:
            made = SyncClient(worker.urls, worker.token, name=f"{worker.name}-tasks")
            made.__enter__()
            atexit.register(made.close)
            worker._publisher = made
        shared: SyncClient = worker._publisher
    return shared
