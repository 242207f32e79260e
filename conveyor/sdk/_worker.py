"""The worker runtime: subscribe, run handlers, heartbeat leases, report outcomes.

A ``Worker`` holds one reconnecting session. Each pushed job runs in an asyncio task
that runs no other job meanwhile (a runner, which takes the next job once it is idle; see
``_start``); one loop for the whole worker beats the leases of running jobs (a
``heartbeat_batch`` about every third of each job's visibility timeout); a job is
reported when its handler ends:

* the handler returns: ``ack``. The acks of every handler that ended in the same
  event-loop iteration go out as one ``ack_batch`` frame, so a busy worker sends one
  frame per burst of jobs, not one per job. A return value other than ``None`` is the
  job's result, sent with its ack (``client.result`` hands it to a publisher); one that
  is not strict JSON, or larger than the broker's ``max_payload_bytes``, fails the job
  instead (``fail``, dead-lettered, the error naming the size or the fault): retrying
  would make the same result again;
* it raises ``Retry(delay_s, error)``: ``retry`` (the broker's backoff curve when
  ``delay_s`` is ``None``);
* it raises ``Fail(error)``: ``fail`` (dead-lettered at once);
* it raises ``RateLimited(delay_s, key)``: ``back_off`` (the job is ready again, its
  attempt not spent, and nothing of that partition key, or of the queue, is pushed for
  ``delay_s`` seconds);
* it raises anything else: ``retry`` with the error ``"<Type>: <message>"``;
* the broker cancels the job (a ``cancelled`` push): the handler is cancelled and
  nothing is reported (the job is gone);
* it runs past its time limit (the job's ``timeout_s``, else the handler's, else the
  queue's in ``timeouts``; none by default): ``retry`` with the error ``TimeoutError:
  handler ran past its 30 s time limit``, at once. An async handler's task is cancelled
  and not waited for; a plain ``def`` handler's thread cannot be stopped and runs on in
  the background, its result ignored. Without a limit a hung handler's lease is
  heartbeaten for ever.

Logging (the standard ``logging`` module, so configure it to see them): the logger
``conveyor.worker`` says when the worker is connected (its broker, queues, prefetch),
and ``conveyor.worker.jobs`` one line as each job ends: INFO for ``ok``, an explicit
``Retry`` and a retry's ``dead after N attempts``, WARNING for a ``Fail`` and a time
limit, ERROR with the traceback for a handler's exception. Whether INFO is on is asked
once per pushed frame: with it off a job's end costs no clock read and no formatting.

A handler's ``job.progress(value)`` is kept as the job's latest progress and sent in a
``progress`` frame at most once per ``progress_interval_s`` for the whole worker, and
never while a frame of that job's is unanswered; a job's last value goes out before its
report (docs/worker.md, "Progress").

A job stays "held" until the broker has answered its report, so that after a
reconnect the worker re-attaches the leases of running and not-yet-reported jobs in
``subscribe``, then resends the reports the outage swallowed.

Shutdown (``stop()``, SIGTERM or SIGINT): ``unsubscribe`` so nothing new arrives, let
running handlers finish within ``shutdown_timeout_s``, then cancel the rest (their
jobs lapse back to the broker after its disconnect grace) and close the connection:
``run()`` returns once it is closed. A second signal cancels everything at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
import math
import os
import signal
import socket
import threading
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, TypeVar

import anyio

from ._errors import ConveyorError, InvalidArgument, Unavailable
from ._session import Session, split_to_fit
from ._tasks import TaskMaker
from ._types import Fail, Job, RateLimited, Retry
from ._urls import DEFAULT_URL, Urls, parse_urls
from ._wire import WireError, encode_payload, raw_json

__all__ = ["Handler", "Worker"]

log = logging.getLogger("conveyor.worker")
# One line per job's end (see the module docstring): a child, so that configuring
# "conveyor.worker" covers it, and it can be quietened on its own.
jobs_log = logging.getLogger("conveyor.worker.jobs")
_INFO, _WARNING, _ERROR = logging.INFO, logging.WARNING, logging.ERROR

# An ack the broker could not take (unavailable) is sent again after these waits, doubling.
_ACK_RETRY_FIRST_S = 0.05
_ACK_RETRY_MAX_S = 2.0
# Acks per ack_batch frame when the broker's hello does not say (its default max_batch).
_MAX_BATCH = 1000
# The most encoded bytes of one progress value (the broker's cap, docs/protocol.md).
_MAX_PROGRESS_BYTES = 64 * 1024

# A handler's return value is the job's result (``None``: none); see the module docstring.
Handler = Callable[[Job], Awaitable[Any]] | Callable[[Job], Any]
H = TypeVar("H", bound=Handler)


class HandlerTimeout(Exception):
    """What a job's retry says when its handler ran past its time limit."""

    def __init__(self, limit_s: float) -> None:
        super().__init__(f"handler ran past its {limit_s:g} s time limit")
        self.limit_s = limit_s


def check_timeout(value: Any, field: str = "timeout_s") -> float:
    """``value`` as a time limit: a finite number > 0 (never a bool), else
    ``InvalidArgument`` naming ``field``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidArgument(f"{field}: must be a finite number > 0, got {value!r}", field=field)
    return float(value)


def check_prefetch(value: Any) -> int:
    """``value`` as a prefetch: an int >= 1 (never a bool), else ``InvalidArgument``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"prefetch: must be an int >= 1, got {value!r}", field="prefetch")
    return value


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Worker:
    """Runs handlers for jobs pushed by the broker. See the module docstring.

    ``queues`` are served in strict order (an earlier queue's job first); each needs a
    handler, registered with ``@worker.handler(queue)``. ``prefetch`` is how many jobs
    the broker may push before this worker reports any: it is also how many handlers
    run at once. ``worker_id`` (default: host-pid-random) names this worker to the
    broker; keep it stable across reconnects so leases re-attach.

    ``url`` is one broker URL or several (a sequence, or one string of comma-separated
    URLs) of brokers sharing one job table, as ``Client`` takes them: the worker is
    connected to one at a time (``url``), tried in a random order picked once per worker
    so that workers spread over the brokers (``shuffle_urls=False``: the order given).
    When that broker dies the worker moves on to the next at once, subscribes there and
    re-attaches the leases of the jobs it still holds (they stay valid in the shared
    table until their deadline).

    ``timeouts`` maps a queue to its handler's time limit in seconds (the queue level:
    a handler's ``timeout_s`` and a job's own win over it; see the module docstring).
    ``progress_interval_s`` is the least time between two progress frames.
    """

    def __init__(
        self,
        url: Urls = DEFAULT_URL,
        queues: Sequence[str] = (),
        worker_id: str | None = None,
        prefetch: int = 16,
        token: str | None = None,
        *,
        shutdown_timeout_s: float = 30.0,
        name: str = "conveyor-python-worker",
        shuffle_urls: bool = True,
        timeouts: Mapping[str, float] | None = None,
        progress_interval_s: float = 0.1,
    ) -> None:
        check_prefetch(prefetch)
        # The least time between two progress frames of this worker (job.progress).
        self.progress_interval_s = check_timeout(progress_interval_s, "progress_interval_s")
        # The brokers to connect to: read by run(), so `conveyor worker --url` can set them.
        self.urls = parse_urls(url)
        self.shuffle_urls = shuffle_urls
        self.queues = list(queues)
        self.worker_id = worker_id or _default_worker_id()
        self.prefetch = prefetch
        self.token = token
        self.shutdown_timeout_s = shutdown_timeout_s
        self.name = name
        # Read by run(): set before it, as `conveyor worker --queues` sets the queues.
        self.timeouts: dict[str, float] = {
            queue: check_timeout(limit, f"timeouts[{queue!r}]")
            for queue, limit in (timeouts or {}).items()
        }
        self._handlers: dict[str, Handler] = {}
        self._handler_timeouts: dict[str, float] = {}  # queue -> its handler's timeout_s
        # queue -> the limit for its jobs that bring none: the handler's, else the queue's
        # (made by run(); one look-up per job).
        self._limits: dict[str, float] = {}
        # Tasks of handlers that ran past their limit: cancelled, not waited for.
        self._abandoned: set[asyncio.Future[Any]] = set()
        # Whether jobs_log takes INFO: asked once per pushed frame, not per job.
        self._timed = False
        self._connects = 0  # connections made (for the log)
        self._publisher: Any = None  # the tasks' shared client (see _tasks.py)
        # The async handlers again, by queue: which handler is a coroutine function is found
        # once at registration, not by inspect.iscoroutinefunction per job (a busy
        # worker's profile showed it).
        self._async_handlers: dict[str, Callable[[Job], Awaitable[Any]]] = {}
        self._held: dict[str, Job] = {}  # job id -> job, until its report is answered
        # job id -> a later attempt of a held job, pushed after our lease lapsed (an outage
        # past the grace): it runs once the held attempt ends.
        self._again: dict[str, Job] = {}
        # job id -> the task running it, while the job's handler may still run (cancel
        # targets). Jobs run in runner tasks that outlive them (see _start).
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._runners: set[asyncio.Task[None]] = set()  # every runner task alive
        self._parked: list[asyncio.Future[Job]] = []  # idle runners, each awaiting its next job
        self._running: set[str] = set()  # ids whose handler is running now
        self._cancelled: set[str] = set()
        self._killing = False  # a second signal: cancel handlers, start no more
        # The acks of handlers that ended in this loop iteration and are not sent yet,
        # and the replies awaited to ack_batch requests sent earlier.
        self._acks: list[Job] = []
        # job id -> the encoded result of a handler that returned one, until acked.
        self._results: dict[str, bytes] = {}
        self._senders: set[asyncio.Future[Any]] = set()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._session: Session | None = None
        self._link: _Link | None = None  # (set by run(): what its jobs ask of it)
        # job id -> (when its ack was first not taken, the wait before the next try)
        self._ack_retries: dict[str, tuple[float, float]] = {}
        self._limiter: anyio.CapacityLimiter | None = None  # made by run(): prefetch threads
        self._stopping = False
        self._fatal: ConveyorError | None = None  # a refusal that ended run()
        self._beats: dict[str, tuple[float, Job]] = {}  # running job -> (next beat, job)
        self._beat_wake = asyncio.Event()
        self._beat_until = 0.0  # when the heartbeat loop wakes next by itself
        self._idle = asyncio.Event()  # set whenever no job is held
        self._idle.set()
        self.handled = 0  # jobs whose handler ran to an outcome (for tests and metrics)
        # Progress (job.progress): the latest value of each job not sent yet, the jobs
        # with a progress frame unanswered (one at a time each), when the last frame went
        # and the timer of the next; frames sent (for tests and benchmarks).
        self._progress_latest: dict[str, tuple[Job, bytes]] = {}
        self._progress_flying: set[str] = set()
        self._progress_sent_at = -math.inf
        self._progress_timer: asyncio.TimerHandle | None = None
        self.progress_frames = 0
        # Progress reported on handlers' threads, waiting for the loop to take it.
        self._thread_lock = threading.Lock()
        self._from_threads: dict[str, tuple[Job, bytes]] = {}
        self._threads_told = False

    @property
    def url(self) -> str | None:
        """The URL of the broker this worker is connected to now (subscribed there), one
        of ``urls``; ``None`` while it is not connected or not running."""
        session = self._session
        return None if session is None else session.url

    # -- registration ---------------------------------------------------------------------

    def handler(self, queue: str, *, timeout_s: float | None = None) -> Callable[[H], H]:
        """Register the function that handles jobs of ``queue`` (async or plain), with
        its time limit ``timeout_s`` in seconds (``None``: the queue's in ``timeouts``,
        if any). A job's own ``timeout_s`` wins over both. Raises ``InvalidArgument``
        for a limit that is not a finite number > 0."""
        limit = None if timeout_s is None else check_timeout(timeout_s)

        def register(fn: H) -> H:
            self._handlers[queue] = fn
            if inspect.iscoroutinefunction(fn):
                self._async_handlers[queue] = fn
            else:
                self._async_handlers.pop(queue, None)
            if limit is None:
                self._handler_timeouts.pop(queue, None)
            else:
                self._handler_timeouts[queue] = limit
            if queue not in self.queues:
                self.queues.append(queue)
            return fn

        return register

    def task(self, queue: str, *, timeout_s: float | None = None) -> TaskMaker:
        """Register a typed function as the handler of ``queue``'s jobs, each job's
        payload its keyword arguments (and the ``Job`` as its first argument, if that
        is named ``job``); the ``Task`` it returns enqueues calls of it
        (``await send_email.enqueue(to="a@b.c")``): see ``_tasks``. ``timeout_s`` as for
        ``handler``."""
        if timeout_s is not None:
            check_timeout(timeout_s)
        return TaskMaker(self, queue, timeout_s)

    def close_tasks_client(self) -> None:
        """Close the client the tasks' ``enqueue`` made (if any; also done at exit). The
        next ``enqueue`` makes another."""
        client, self._publisher = self._publisher, None
        if client is not None:
            client.close()

    @property
    def handlers(self) -> Mapping[str, Handler]:
        """The registered handlers by queue (read-only)."""
        return MappingProxyType(self._handlers)

    # -- running --------------------------------------------------------------------------

    async def run(self) -> None:
        """Work until ``stop()`` or a signal; return once the connection to the broker is
        closed. Raises ``InvalidArgument`` for a queue with no handler (or a name the
        broker refuses), ``Unauthorized`` when the broker refuses the token, ``Forbidden``
        when the token lacks the work role."""
        missing = [q for q in self.queues if q not in self._handlers]
        if not self.queues or missing:
            raise InvalidArgument(
                f"queues: no handler for {missing or 'any queue'}; use @worker.handler(queue)",
                field="queues",
            )
        check_prefetch(self.prefetch)  # (again: `conveyor worker --prefetch` sets it after)
        self._limits = {
            queue: limit
            for queue in self.queues
            if (limit := self._handler_timeouts.get(queue, self.timeouts.get(queue))) is not None
        }
        self._limiter = anyio.CapacityLimiter(self.prefetch)
        self._connects = 0
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._stopping = False
        self._killing = False
        self._fatal = None
        session = Session(
            self.urls,
            shuffle=self.shuffle_urls,
            token=self.token,
            client_name=self.name,
            on_connect=self._subscribe,
            on_push=self._on_push,
            log_connects=False,  # _subscribe says more
        )
        self._session = session
        self._link = _Link(self, session)
        signals = self._install_signals()
        try:
            async with anyio.create_task_group() as tg:
                self._task_group = tg
                tg.start_soon(self._run_session, session)
                tg.start_soon(self._heartbeat_loop, session)
                await self._stop.wait()
                if self._fatal is None:
                    await self._drain(session)
                # Closed before the task group is cancelled, so the close is not cut short:
                # run() returns with the socket closed, and the process may exit at once.
                await session.close()
                tg.cancel_scope.cancel()
        finally:
            for sig in signals:
                self._loop.remove_signal_handler(sig)
            self._task_group = None
            if self._progress_timer is not None:
                self._progress_timer.cancel()
                self._progress_timer = None
            self._progress_latest.clear()
            self._progress_flying.clear()
            await self._cancel_jobs()
            await session.close()
        if self._fatal is not None:
            raise self._fatal

    async def _run_session(self, session: Session) -> None:
        # A refusal that reconnecting cannot cure (a wrong token, a token without the work
        # role, a bad queue name) ends run() with that error itself, not a task group's.
        try:
            await session.run()
        except ConveyorError as exc:
            self._fatal = exc
            assert self._stop is not None
            self._stop.set()

    def stop(self) -> None:
        """Ask the worker to shut down gracefully (thread-safe; a second call is a no-op)."""
        loop, stop = self._loop, self._stop
        if loop is None or stop is None:
            return
        if threading.current_thread() is threading.main_thread() and _running_loop() is loop:
            stop.set()
        else:
            loop.call_soon_threadsafe(stop.set)

    def _install_signals(self) -> list[signal.Signals]:
        if threading.current_thread() is not threading.main_thread():
            return []
        assert self._loop is not None
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self._on_signal)
            installed.append(sig)
        return installed

    def _on_signal(self) -> None:
        if self._stopping and self._task_group is not None:
            log.warning("second signal: stopping at once")
            self._killing = True
            self._cancel_running()
            self._task_group.cancel_scope.cancel()
            return
        log.info("stopping: finishing %d running job(s)", len(self._running))
        assert self._stop is not None
        self._stop.set()

    async def _drain(self, session: Session) -> None:
        self._stopping = True
        if session.connected.is_set():
            try:
                await session.request("unsubscribe", {}, resend=False)
            except Exception:  # the connection may be gone; the jobs lapse either way
                pass
        with anyio.move_on_after(self.shutdown_timeout_s):
            while self._held:
                await self._idle.wait()
        self._cancel_running()

    def _cancel_running(self) -> None:
        """Cancel every handler still running (their jobs are not reported)."""
        for job_id in list(self._running):
            self._tasks[job_id].cancel()

    async def _cancel_jobs(self) -> None:
        """``run()`` is ending: cancel every job task and ack reply still awaited, and wait for
        them to end."""
        self._killing = True
        for abandoned in self._abandoned:
            abandoned.cancel()  # (again: not waited for)
        self._parked.clear()
        tasks = [*self._runners, *self._senders]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        self._runners.clear()
        self._running.clear()

    # -- the session's hooks --------------------------------------------------------------

    async def _subscribe(self, session: Session) -> None:
        held = [*self._held.values(), *self._again.values()]
        leases = [{"id": job.id, "lease": job.lease} for job in held]
        reply = await session.request(
            "subscribe",
            {
                "worker_id": self.worker_id,
                "queues": self.queues,
                "prefetch": self.prefetch,
                "leases": leases,
            },
            resend=False,
        )
        self._connects += 1
        hello = session.hello
        server = " ".join(str(hello[k]) for k in ("server", "version") if hello.get(k))
        log.info(
            "worker %s %s %s%s; queues %s; prefetch %d",
            self.worker_id,
            "reconnected to" if self._connects > 1 else "connected to",
            session.connecting_url,
            f" ({server})" if server else "",
            ", ".join(self.queues),
            self.prefetch,
        )
        lost = {job["id"] for job in leases} - set(reply.get("reattached", []))
        if lost:
            log.warning("%d job lease(s) lapsed during the outage; they run again", len(lost))
        if self._stopping:
            await session.request("unsubscribe", {}, resend=False)

    def _on_push(self, frame: dict[str, Any]) -> None:
        kind = frame.get("push")
        if kind == "jobs" and self._task_group is not None:
            self._timed = jobs_log.isEnabledFor(_INFO)
            for data in frame.get("jobs", []):
                job = self._job(data)
                held = self._held.get(job.id)
                if held is not None:
                    # Our lease lapsed and the broker handed the job back to us: its report
                    # will not land, so run this attempt once the held one has ended.
                    if held.lease != job.lease:
                        self._again[job.id] = job
                    continue
                self._start(job)
        elif kind == "cancelled":
            for job_id in frame.get("ids", []):
                self._cancelled.add(job_id)
                if job_id in self._running:
                    self._tasks[job_id].cancel()

    def _start(self, job: Job) -> None:
        """Hold ``job`` and run its handler in a task: an idle runner's, else a new one.

        A runner is a plain asyncio task (not a task group's) that runs one job at a
        time and, when it ends, waits for the next: a busy worker hands each job to a
        waiting task instead of making a task per job (making and registering one was
        most of what starting a job cost). Each handler still runs in a task of its own
        while it runs: cancel scopes and timeouts inside it, and a cancel of its job,
        act on that task alone. A runner whose handler left a context variable set
        ends after that job, so no job sees another's context. ``run()`` cancels and
        awaits the runners when it ends.
        """
        assert self._loop is not None
        self._held[job.id] = job
        self._idle.clear()
        parked = self._parked
        while parked:
            slot = parked.pop()
            if not slot.done():
                slot.set_result(job)
                return
        runner = self._loop.create_task(self._runner(job), name="conveyor-job")
        self._runners.add(runner)
        runner.add_done_callback(self._runners.discard)

    async def _runner(self, job: Job) -> None:
        """Run ``job``, then every job handed to this task while it waits (see _start)."""
        me = asyncio.current_task()
        assert me is not None and self._loop is not None
        loop, tasks, parked = self._loop, self._tasks, self._parked
        context = contextvars.copy_context()  # this task's, as each job should find it
        while True:
            job_id = job.id
            tasks[job_id] = me
            try:
                await self._run_job(job)
            finally:
                if tasks.get(job_id) is me:
                    del tasks[job_id]
            if self._killing:
                return
            if me.cancelling():  # its job was cancelled: the request was for that job only
                while me.uncancel():
                    pass
            if contextvars.copy_context() != context:
                return  # the handler set a context variable: the next job gets a fresh task
            slot: asyncio.Future[Job] = loop.create_future()
            parked.append(slot)
            job = await slot

    def _job(self, data: dict[str, Any]) -> Job:
        get = data.get
        return Job(
            data["id"],
            data["queue"],
            get("payload"),
            data["attempt"],
            data["max_attempts"],
            data["deadline"],
            data["lease"],
            get("priority", 0),
            get("visibility_timeout_s", 300.0),
            get("timeout_s"),
            get("partition"),
            get("dependencies") or 0,
            self._link,
        )

    # -- progress -------------------------------------------------------------------------

    def _on_progress(self, job: Job, value: Any) -> None:
        """``job.progress(value)``, on the event loop or on a handler's thread: encoded
        here (a bad value raises in the handler), then kept as the job's latest."""
        session = self._session
        limit = _MAX_PROGRESS_BYTES
        if session is not None:
            limit = min(limit, session.hello.get("max_payload_bytes", limit))
        try:
            data = encode_payload(value, max_bytes=limit, field="progress")
        except WireError as exc:
            raise InvalidArgument(exc.message, field="progress") from None
        loop = self._loop
        if loop is None:
            return
        if _running_loop() is loop:
            self._keep_progress(job, data)
            return
        # From a handler's thread: the latest of each job waits here, and the loop is
        # woken once for however many come before it takes them.
        with self._thread_lock:
            self._from_threads[job.id] = (job, data)
            if self._threads_told:
                return
            self._threads_told = True
        loop.call_soon_threadsafe(self._take_from_threads)

    def _take_from_threads(self) -> None:
        with self._thread_lock:
            taken, self._from_threads = self._from_threads, {}
            self._threads_told = False
        for job, data in taken.values():
            self._keep_progress(job, data)

    def _keep_progress(self, job: Job, data: bytes) -> None:
        """Keep ``data`` as ``job``'s latest progress (the latest wins) and see that a
        frame goes out: at most one per ``progress_interval_s`` for the whole worker."""
        if self._held.get(job.id) is not job or job.id in self._cancelled:
            return  # (reported, or gone: its lease is over)
        self._progress_latest[job.id] = (job, data)
        self._arm_progress()

    def _arm_progress(self) -> None:
        loop = self._loop
        if self._progress_timer is not None or loop is None or not self._progress_latest:
            return
        at = max(loop.time(), self._progress_sent_at + self.progress_interval_s)
        self._progress_timer = loop.call_at(at, self._flush_progress)

    def _flush_progress(self) -> None:
        """Send the latest progress of every job that has no progress frame in flight."""
        self._progress_timer = None
        latest = self._progress_latest
        flying = self._progress_flying
        due = [entry for job_id, entry in latest.items() if job_id not in flying]
        for job, _ in due:
            del latest[job.id]
        self._send_progress(due)

    def _send_progress(self, entries: list[tuple[Job, bytes]]) -> None:
        session = self._session
        loop = self._loop
        if not entries or session is None or loop is None:
            return
        self._progress_sent_at = loop.time()
        limit = session.hello.get("max_batch", _MAX_BATCH)
        for first in range(0, len(entries), limit):
            batch = entries[first : first + limit]
            items = [
                {"id": job.id, "lease": job.lease, "progress": raw_json(data)}
                for job, data in batch
            ]
            ids = [job.id for job, _ in batch]
            self._progress_flying.update(ids)
            self.progress_frames += 1
            reply = session.request_now("progress", {"items": items})
            reply.add_done_callback(functools.partial(self._progress_answered, ids))

    def _progress_answered(self, ids: list[str], reply: asyncio.Future[Any]) -> None:
        """A progress frame was answered (or given up on): its jobs may send again. A
        report that did not land (a lapsed lease) or was not delivered is dropped: the
        next value replaces it."""
        self._progress_flying.difference_update(ids)
        if not reply.cancelled() and (exc := reply.exception()) is not None:
            log.debug("progress not delivered: %s", exc)
        self._arm_progress()

    def _last_progress(self, job: Job) -> None:
        """Before ``job``'s report: send its latest progress now, so that it lands
        before the ack (frames are handled in the order they are sent)."""
        entry = self._progress_latest.pop(job.id, None)
        if entry is not None:
            self._send_progress([entry])

    # -- one job --------------------------------------------------------------------------

    async def _run_job(self, job: Job) -> None:
        # Only a running handler is ever cancelled by a cancelled push, the shutdown
        # timeout or a second signal, so this body always runs and ends in _finished.
        # (run() ending cancels whatever is left, a retry or fail awaiting its reply too.)
        report: tuple[str, dict[str, Any]] | None = None
        job_id = job.id
        try:
            if job_id not in self._cancelled and not self._killing:
                self._running.add(job_id)
                try:
                    report = await self._call_handler(job)
                finally:
                    self._running.discard(job_id)
        except asyncio.CancelledError:
            report = None  # cancelled by the broker or by shutdown: nothing is reported
        if report is not None and job_id not in self._cancelled:
            self._last_progress(job)  # (its last value goes before its report: PRG-6)
        if report is None or job_id in self._cancelled:
            self._finished(job)
        elif report[0] == "ack":
            self._queue_ack(job)  # _finished once the batch is answered
        else:
            try:
                await self._report(job, *report)
            finally:
                self._finished(job)

    def _finished(self, job: Job) -> None:
        """``job``'s report is answered (or there is none): it is held no more."""
        cancelled = job.id in self._cancelled
        self._cancelled.discard(job.id)
        self._held.pop(job.id, None)
        self._results.pop(job.id, None)
        self._progress_latest.pop(job.id, None)
        again = self._again.pop(job.id, None)
        if again is not None and not cancelled and not self._killing:
            self._start(again)
        if not self._held:
            self._idle.set()

    async def _call_handler(self, job: Job) -> tuple[str, dict[str, Any]]:
        queue = job.queue
        self._schedule_beat(job)
        timed = self._timed
        loop = self._loop
        assert loop is not None
        started = loop.time() if timed else 0.0
        try:
            limit = job.timeout_s or self._limits.get(queue)
            if limit is not None:
                value = await self._call_limited(job, limit)
            elif (run := self._async_handlers.get(queue)) is not None:
                value = await run(job)
            else:  # a plain function: on a thread, as many at once as the prefetch
                value = await anyio.to_thread.run_sync(
                    self._handlers[queue], job, limiter=self._limiter, abandon_on_cancel=True
                )
            outcome: tuple[str, dict[str, Any]] = ("ack", {})
            if value is not None:
                refused = self._keep_result(job, value)
                if refused is not None:
                    outcome = ("fail", {"error": refused})
                    jobs_log.warning("job %s %s failed (dead-lettered): %s", job.id, queue, refused)
            if timed and outcome[0] == "ack":
                jobs_log.info("job %s %s ok in %s", job.id, queue, _took(loop.time() - started))
        except Retry as retry:
            outcome = ("retry", {"delay_s": retry.delay_s, "error": retry.error})
            if timed:
                self._log_retry(_INFO, job, loop.time() - started, retry.error or "retry",
                                retry.delay_s)  # fmt: skip
        except RateLimited as limited:
            outcome = (
                "back_off",
                {
                    "delay_s": limited.delay_s,
                    "partition": limited.key,
                    "scope": "queue" if limited.queue else None,
                },
            )
            if timed:
                jobs_log.info(
                    "job %s %s rate limited: %s held for %s", job.id, queue,
                    _held_scope(limited, job),
                    _took(limited.delay_s),
                )  # fmt: skip
        except Fail as fail:
            outcome = ("fail", {"error": fail.error})
            if jobs_log.isEnabledFor(_WARNING):
                took = f" in {_took(loop.time() - started)}" if timed else ""
                jobs_log.warning(
                    "job %s %s failed%s (dead-lettered): %s", job.id, queue, took,
                    fail.error or "failed",
                )  # fmt: skip
        except HandlerTimeout as exc:
            error = f"TimeoutError: {exc}"
            outcome = ("retry", {"error": error})
            if jobs_log.isEnabledFor(_WARNING):
                self._log_retry(_WARNING, job, exc.limit_s, error)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            outcome = ("retry", {"error": error})
            if jobs_log.isEnabledFor(_ERROR):
                spent = loop.time() - started if timed else None
                self._log_retry(_ERROR, job, spent, error, exc_info=exc)
        finally:
            self._beats.pop(job.id, None)
        self.handled += 1
        return outcome

    def _keep_result(self, job: Job, value: Any) -> str | None:
        """Encode a handler's return value as ``job``'s result, kept until its ack is
        sent; or return the error that fails the job instead (not strict JSON, or over
        the broker's ``max_payload_bytes``, or too large for its ack to fit in a frame
        of the broker's ``max_frame_bytes``)."""
        session = self._session
        limit: int | None = None
        if session is not None:
            limit = session.hello.get("max_payload_bytes")
            alone = {"items": [{"id": job.id, "lease": job.lease, "result": None}]}
            room = session.max_frame_bytes - session.frame_size("ack_batch", alone) + len("null")
            limit = room if limit is None else min(limit, room)
        try:
            data = encode_payload(value, max_bytes=limit, field="result")
        except WireError as exc:
            return f"result: {exc.message.removeprefix('result: ')}"
        self._results[job.id] = data
        return None

    async def _call_limited(self, job: Job, limit: float) -> Any:
        """Run ``job``'s handler for at most ``limit`` seconds; raise ``HandlerTimeout``
        past it, without waiting for the handler to notice: it runs in a task of its own
        (only jobs with a limit pay for that task), cancelled and left behind."""
        loop = self._loop
        assert loop is not None
        queue = job.queue
        if (run := self._async_handlers.get(queue)) is not None:
            inner: asyncio.Future[Any] = asyncio.ensure_future(run(job), loop=loop)
        else:  # a thread cannot be stopped: cancelling abandons it, and it runs on
            call = anyio.to_thread.run_sync(
                self._handlers[queue], job, limiter=self._limiter, abandon_on_cancel=True
            )
            inner = loop.create_task(call, name="conveyor-handler")
        try:
            done, _ = await asyncio.wait((inner,), timeout=limit)
        except asyncio.CancelledError:  # the broker's cancel, or shutdown: the handler too
            inner.cancel()
            raise
        if not done:
            inner.cancel()
            self._abandoned.add(inner)
            inner.add_done_callback(self._forget)
            raise HandlerTimeout(limit)
        return inner.result()  # (the handler's exception, if it raised)

    def _forget(self, task: asyncio.Future[Any]) -> None:
        """An abandoned handler ended at last: its outcome no longer counts."""
        self._abandoned.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved, so asyncio does not warn of it

    def _log_retry(
        self,
        level: int,
        job: Job,
        took: float | None,
        error: str,
        delay_s: float | None = None,
        exc_info: BaseException | None = None,
    ) -> None:
        """The end line of a job to be retried: ``retry (attempt 2/5)``, or ``dead
        after 5 attempts`` when that was its last."""
        took_s = "" if took is None else f" in {_took(took)}"
        if job.attempt >= job.max_attempts:
            outcome = f"dead after {job.attempt} attempts{', the last' if took_s else ''}"
        else:
            outcome = f"retry (attempt {job.attempt}/{job.max_attempts})"
            if delay_s is not None:
                took_s += f", again in {_took(delay_s)}"
        jobs_log.log(
            level, "job %s %s %s%s: %s", job.id, job.queue, outcome, took_s, error,
            exc_info=exc_info,
        )  # fmt: skip

    # -- lease heartbeats: one loop for every running job ---------------------------------

    def _schedule_beat(self, job: Job) -> None:
        """Beat ``job``'s lease about every third of its visibility timeout while it runs."""
        assert self._loop is not None
        at = self._loop.time() + _beat_interval(job)
        self._beats[job.id] = (at, job)
        if at < self._beat_until:  # sooner than the loop would look: wake it
            self._beat_until = at
            self._beat_wake.set()

    async def _heartbeat_loop(self, session: Session) -> None:
        """Send one ``heartbeat_batch`` for all the running jobs that are due.

        One task for the whole worker instead of one per job: a job costs a dict entry
        here, not a task or a timer of its own.
        """
        loop = asyncio.get_running_loop()
        beats = self._beats
        while True:
            now = loop.time()
            due = [job for at, job in beats.values() if at <= now]
            if due:
                for job in due:
                    beats[job.id] = (now + _beat_interval(job), job)
                items = [{"id": job.id, "lease": job.lease} for job in due]
                try:
                    reply = await session.request("heartbeat_batch", {"items": items})
                except ConveyorError as exc:
                    log.warning("%d heartbeat(s) failed: %s", len(due), exc)
                    continue
                for job, landed in zip(due, reply["landed"], strict=False):
                    if not landed and beats.pop(job.id, None) is not None:
                        log.warning("job %s: lease lapsed; its result will not count", job.id)
                continue
            self._beat_wake.clear()
            wait = min(at for at, _ in beats.values()) - now if beats else None
            self._beat_until = now + wait if wait is not None else float("inf")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._beat_wake.wait()

    def _queue_ack(self, job: Job) -> None:
        """Ack ``job`` in this iteration's ``ack_batch`` (the first ack schedules the send),
        or at once when half the prefetch is waiting: the jobs of two pushed frames often
        end in one iteration, and acking them all at its end left this worker idle while
        the broker refilled the whole window."""
        assert self._loop is not None
        if not self._acks:
            self._loop.call_soon(self._flush_acks)
        self._acks.append(job)
        if len(self._acks) >= max(1, self.prefetch // 2):
            self._flush_acks()

    def _flush_acks(self) -> None:
        """Send the waiting acks now, in ``ack_batch`` requests of at most ``max_batch``."""
        assert self._loop is not None
        session = self._session
        assert session is not None
        jobs, self._acks = self._acks, []
        limit = session.hello.get("max_batch", _MAX_BATCH)
        for first in range(0, len(jobs), limit):
            batch = jobs[first : first + limit]
            results = self._results
            items: list[dict[str, Any]] = [
                {"id": job.id, "lease": job.lease}
                if (data := results.get(job.id)) is None
                else {"id": job.id, "lease": job.lease, "result": raw_json(data)}
                for job in batch
            ]
            runs = [(0, items)]
            if results:  # results may outgrow a frame: cut the batch until each run fits
                runs = split_to_fit(items, functools.partial(_fits_a_frame, session))
            for start, run in runs:
                reply = session.request_now("ack_batch", {"items": run})
                self._senders.add(reply)
                done = batch[start : start + len(run)]
                reply.add_done_callback(functools.partial(self._acks_answered, done))

    def _acks_answered(self, jobs: list[Job], reply: asyncio.Future[Any]) -> None:
        """One ``ack_batch`` was answered (or given up on): its jobs are held no more.
        Until then each is held, and the request resent on a reconnect."""
        self._senders.discard(reply)
        if reply.cancelled():
            pass  # run() is ending
        elif isinstance(exc := reply.exception(), Unavailable):
            self._ack_later(jobs)  # still held, their leases valid: tried again soon
            return
        elif exc is not None:
            log.warning("%d ack(s) not delivered: %s", len(jobs), exc)
        else:
            for job, landed in zip(jobs, reply.result()["landed"], strict=False):
                if not landed:
                    log.warning("job %s: ack did not land (the lease had lapsed)", job.id)
        for job in jobs:
            self._ack_retries.pop(job.id, None)
            self._finished(job)

    def _ack_later(self, jobs: list[Job]) -> None:
        """The broker could not take these acks now (``unavailable``: its database is
        unreachable; whether they landed is unknown). Send them again after a backoff,
        the jobs still held, until their leases would have lapsed: an ack that lands
        twice answers ``landed: false`` the second time, and nothing runs twice."""
        assert self._loop is not None
        now = self._loop.time()
        again: list[Job] = []
        for job in jobs:
            first, delay = self._ack_retries.get(job.id, (now, _ACK_RETRY_FIRST_S / 2))
            if now - first >= job.visibility_timeout_s:
                log.warning("job %s: ack not delivered: the broker stayed unavailable", job.id)
                self._ack_retries.pop(job.id, None)
                self._finished(job)
                continue
            delay = min(delay * 2, _ACK_RETRY_MAX_S)
            self._ack_retries[job.id] = (first, delay)
            again.append(job)
        if again:
            log.warning("%d ack(s) not taken (the broker is unavailable): again soon", len(again))
            wait = max(self._ack_retries[job.id][1] for job in again)
            self._loop.call_later(wait, self._requeue_acks, again)

    def _requeue_acks(self, jobs: list[Job]) -> None:
        for job in jobs:
            self._queue_ack(job)

    async def _report(self, job: Job, op: str, fields: dict[str, Any]) -> None:
        session = self._session
        assert session is not None
        fields = {k: v for k, v in fields.items() if v is not None}
        try:
            reply = await session.request(op, {"id": job.id, "lease": job.lease, **fields})
        except ConveyorError as exc:
            log.warning("job %s: %s not delivered: %s", job.id, op, exc)
            return
        if not reply.get("landed"):
            log.warning("job %s: %s did not land (the lease had lapsed)", job.id, op)


def _fits_a_frame(session: Session, items: list[dict[str, Any]]) -> bool:
    """Whether an ``ack_batch`` of ``items`` fits in a frame the broker takes."""
    return session.frame_size("ack_batch", {"items": items}) <= session.max_frame_bytes


def _held_scope(limited: RateLimited, job: Job) -> str:
    """What a back-off holds, for the log: a partition key, or the queue."""
    key = limited.key or job.partition
    return "the queue" if limited.queue or key is None else repr(key)


def _took(seconds: float) -> str:
    """A duration for the log: ``12.3 ms`` under a second, else ``1.2 s``."""
    if seconds < 1.0:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds:.1f} s"


def _beat_interval(job: Job) -> float:
    """Seconds between a running job's heartbeats: a third of its visibility timeout."""
    return max(0.05, job.visibility_timeout_s / 3)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _Link:
    """What a worker's jobs ask of it (``JobLink``): one per ``run()``, shared by its
    jobs, so that a pushed job becomes one object."""

    __slots__ = ("_session", "_worker")

    def __init__(self, worker: Worker, session: Session) -> None:
        self._worker = worker
        self._session = session

    async def heartbeat(self, job: Job) -> bool:
        reply = await self._session.request("heartbeat", {"id": job.id, "lease": job.lease})
        return bool(reply["landed"])

    def progress(self, job: Job, value: Any) -> None:
        self._worker._on_progress(job, value)

    def dependency_results(self, job: Job) -> Awaitable[dict[str, Any]]:
        return dependency_results(self._session, job.id)


async def dependency_results(session: Session, job_id: str) -> dict[str, Any]:
    """The results of ``job_id``'s dependencies, by id, read page by page (docs/protocol.md,
    ``dependency_results``)."""
    found: dict[str, Any] = {}
    offset: int | None = 0
    while offset is not None:
        reply = await session.request("dependency_results", {"id": job_id, "offset": offset})
        for entry in reply.get("results") or ():
            found[entry["id"]] = entry.get("result")
        offset = reply.get("next")
    return found
