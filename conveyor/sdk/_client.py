"""The publisher clients: ``Client`` (async) and ``SyncClient`` (blocking, thread-safe)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import math
import os
import secrets
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import anyio
import anyio.from_thread

from ._errors import (
    ConnectionFailed,
    InvalidArgument,
    JobCancelled,
    JobFailed,
    JobNotFound,
    TooLarge,
)
from ._session import EACH_BYTES, Session, split_to_fit
from ._types import Group, JobEvent, JobInfo, JobPage, ScheduleInfo, SchedulePage
from ._urls import DEFAULT_URL, Urls, brokers, normalize_url, parse_urls
from ._wire import MAX_WAIT_S, WireError, encode_payload, raw_json

__all__ = ["DEFAULT_URL", "Client", "SyncClient", "normalize_url"]

# enqueue_many sends at most this many jobs per frame (the broker's default max_batch).
_BATCH = 1000

T = TypeVar("T")


def _encoded(value: Any, field: str) -> bytes:
    """The payload checked as strict JSON and encoded once."""
    try:
        return encode_payload(value, field=field)
    except WireError as exc:
        raise InvalidArgument(exc.message, field=exc.field) from None


def _payload(value: Any, field: str) -> Any:
    """The payload checked as strict JSON and encoded once, ready to splice into a frame."""
    return raw_json(_encoded(value, field))


def _options(**options: Any) -> dict[str, Any]:
    return {name: _finite(name, value) for name, value in options.items() if value is not None}


def _finite(name: str, value: Any) -> Any:
    """``value``, unless it is a float JSON cannot hold: a NaN or an infinity would go out
    as ``null`` (orjson's way), which the broker reads as "not set"."""
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgument(f"{name}: must be a finite number, got {value}", field=name)
    return value


def _ids(name: str, value: Sequence[str]) -> list[str]:
    """Job ids as a list (a lone string is refused: it would read as its characters)."""
    if isinstance(value, str):
        raise InvalidArgument(f"{name}: must be a list of job ids, got a string", field=name)
    return list(value)


def _when(name: str, value: float | datetime | None) -> float | None:
    """A time as Unix seconds: a ``datetime`` must say its zone (a naive one could be
    read in either of two zones, and a schedule's bounds are instants)."""
    if value is None or not isinstance(value, datetime):
        seconds: float | None = _finite(name, value)
        return seconds
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgument(
            f"{name}: a datetime must carry its time zone (tzinfo), got a naive one",
            field=name,
        )
    return value.timestamp()


class _AutoKeys:
    """Keys for enqueues that bring none, so that a resend after a lost reply is stored
    once (``docs/contract.md``, ENQ-10); the key shows as the job's key.

    A random 96-bit prefix per process (made again after a fork) and a counter: far
    cheaper than a uuid4 per key, which a busy publisher noticed, and unique enough (two
    of a million publishing processes share a prefix with odds below 1e-17). The prefix
    is written in base64url, 16 characters: the broker keeps every pending job's key, so
    each character is held as many times as jobs wait.
    """

    def __init__(self) -> None:
        self._fresh()
        # (Not a getpid() per key: it is a system call, and a busy publisher's profile showed it.)
        if hasattr(os, "register_at_fork"):  # POSIX; elsewhere there is no fork
            os.register_at_fork(after_in_child=self._fresh)

    def _fresh(self) -> None:
        self._prefix = f"auto-{secrets.token_urlsafe(12)}-"
        self._count = itertools.count()

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._count):x}"


_auto_key = _AutoKeys()


class _Watch:
    """One ``Client.watch`` iteration's events still to yield. Bounded: a progress
    event replaces a progress event waiting at the end (the latest wins), so a slow
    consumer holds at most its retries, one progress and the end."""

    __slots__ = ("events", "wake")

    def __init__(self) -> None:
        self.events: deque[JobEvent] = deque()
        self.wake = asyncio.Event()

    def put(self, event: JobEvent) -> None:
        events = self.events
        if event.kind == "progress" and events and events[-1].kind == "progress":
            events[-1] = event
        else:
            events.append(event)
        self.wake.set()


class Client:
    """An async publisher. Use as ``async with Client(url, token) as client: ...``.

    ``url`` is one broker URL or several (a sequence, or one string of comma-separated
    URLs) of brokers sharing one job table; a bad one raises ``InvalidArgument`` naming
    it. The client is connected to one at a time (``url``), tried in a random order
    picked once per client (``shuffle_urls=False``: the order given); a failed connect or
    a lost connection moves on to the next at once, and only a whole round of failures
    waits out the backoff.

    Entering connects (raising ``ConnectionFailed`` when no broker can be reached within
    ``connect_timeout``; with several URLs each try gets its share of it). With
    ``fail_fast`` (for one-shot scripts and commands) entering tries each URL once and
    raises ``ConnectionFailed`` as soon as each has failed, saying why ("connection
    refused": nothing listens there), instead of retrying until ``connect_timeout``. A
    URL where no broker answers (HTTP 404 to the handshake) raises ``ConnectionFailed``
    at once, and a refused token, ``Host`` or ``Origin`` (HTTP 401, 403) ``Unauthorized``,
    whatever ``fail_fast``. Afterwards the
    client reconnects by itself; a call made during an outage waits for the connection,
    up to ``request_timeout`` seconds in all, then raises ``ConnectionFailed``; requests
    unanswered when a connection drops are resent on the next one, whichever broker it is
    (an enqueue with its idempotency key, so it is stored once). Calls may run
    concurrently: they are pipelined on the one connection. Every method raises a
    ``ConveyorError`` subclass when the broker refuses the request (``InvalidArgument``
    naming the field, ``Forbidden``, ...).
    """

    def __init__(
        self,
        url: Urls = DEFAULT_URL,
        token: str | None = None,
        *,
        name: str = "conveyor-python",
        connect_timeout: float = 10.0,
        request_timeout: float = 30.0,
        shuffle_urls: bool = True,
        fail_fast: bool = False,
    ) -> None:
        self.urls = parse_urls(url)
        self._session = Session(
            self.urls,
            shuffle=shuffle_urls,
            fail_fast=fail_fast,
            token=token,
            client_name=name,
            connect_timeout=connect_timeout,
            request_timeout=request_timeout,
            on_connect=self._rewatch,
            on_push=self._on_push,
        )
        self._connect_timeout = connect_timeout
        self._runner: asyncio.Task[None] | None = None
        # The iterations of ``watch`` by job id (the broker watches each job once per
        # connection), and the ids the broker was asked to watch on this connection.
        self._watches: dict[str, list[_Watch]] = {}

    async def __aenter__(self) -> Client:
        self._runner = asyncio.get_running_loop().create_task(self._session.run())
        connected = asyncio.get_running_loop().create_task(self._session.connected.wait())
        try:
            done, _ = await asyncio.wait(
                {self._runner, connected},
                timeout=self._connect_timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            connected.cancel()
        if self._runner in done:
            self._runner.result()  # raises the fatal refusal (a wrong token, say)
        if not self._session.connected.is_set():
            await self.aclose()
            raise ConnectionFailed(
                f"cannot reach {brokers(self.urls)} within {self._connect_timeout} s"
            )
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection and stop reconnecting."""
        await self._session.close()
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._runner
            self._runner = None

    @property
    def url(self) -> str | None:
        """The URL of the broker this client is connected to now (one of ``urls``),
        ``None`` while it is not connected."""
        return self._session.url

    @property
    def server_info(self) -> dict[str, Any]:
        """The broker's ``hello`` reply: version, roles granted, limits."""
        return dict(self._session.hello)

    async def _call(self, op: str, **fields: Any) -> dict[str, Any]:
        reply: dict[str, Any] = await self._session.request(op, fields)
        return reply

    # -- publishing -----------------------------------------------------------------------

    async def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        priority: int = 0,
        delay_s: float | None = None,
        run_at: float | None = None,
        expires_s: float | None = None,
        visibility_timeout_s: float | None = None,
        max_attempts: int | None = None,
        backoff_base_s: float | None = None,
        key: str | None = None,
        timeout_s: float | None = None,
        partition: str | None = None,
        after: Sequence[str] | None = None,
    ) -> str:
        """Store one job; return its id. Options as in ``docs/contract.md`` (ENQ-2 to
        ENQ-9); ``None``: not set. ``timeout_s``: the handler's time limit for this job,
        in seconds (it wins over the handler's and the queue's: ``docs/worker.md``).
        ``partition``: the job's partition key (a tenant, a customer), for the queue's
        per-key limits and fair turns (FLW-3, FLW-5). ``after``: ids of jobs (of any
        queue) it depends on: it is handed out only once each is acked, and its handler
        reads their results (``await job.dependency_results()``); one that dies or is
        cancelled makes it die (DEP-1 to DEP-3). Each must still be known to the broker.

        Without a ``key`` the SDK makes one, so that a request resent after a lost reply
        is stored once. Enqueues made concurrently (tasks, or a ``SyncClient``'s threads)
        share ``enqueue_each`` frames, each still answered on its own. Raises
        ``InvalidArgument`` (naming the field), ``TooLarge``, ``Forbidden``,
        ``ConnectionFailed``.
        """
        encoded = _encoded(payload, "payload")
        job: dict[str, Any] = {
            "queue": queue,
            "payload": raw_json(encoded),
            "priority": priority,
            "key": key if key is not None else _auto_key(),
        }
        # (Set one by one, not through _options: this is a busy publisher's every call.)
        if delay_s is not None:
            job["delay_s"] = _finite("delay_s", delay_s)
        if run_at is not None:
            job["run_at"] = _finite("run_at", run_at)
        if expires_s is not None:
            job["expires_s"] = _finite("expires_s", expires_s)
        if visibility_timeout_s is not None:
            job["visibility_timeout_s"] = _finite("visibility_timeout_s", visibility_timeout_s)
        if max_attempts is not None:
            job["max_attempts"] = max_attempts
        if backoff_base_s is not None:
            job["backoff_base_s"] = _finite("backoff_base_s", backoff_base_s)
        if timeout_s is not None:
            job["timeout_s"] = _finite("timeout_s", timeout_s)
        if partition is not None:
            job["partition"] = partition
        size = len(encoded)
        if after:
            job["after"] = ids = _ids("after", after)
            size += sum(len(str(i)) + 3 for i in ids)  # (their share of the frame)
        if size > EACH_BYTES:
            # A large payload goes alone, as plain `enqueue`: its frame stays as small as
            # it can be under the broker's frame limit.
            reply = await self._call("enqueue", **job)
            job_id: str = reply["id"]
            return job_id
        return await self._session.enqueue(job, size)

    async def enqueue_many(
        self,
        queue: str,
        payloads: Iterable[Any],
        *,
        priority: int = 0,
        delay_s: float | None = None,
        run_at: float | None = None,
        expires_s: float | None = None,
        visibility_timeout_s: float | None = None,
        max_attempts: int | None = None,
        backoff_base_s: float | None = None,
        timeout_s: float | None = None,
        partition: str | None = None,
        after: Sequence[str] | None = None,
    ) -> list[str]:
        """Store many jobs with the same options; return their ids in order. (``after``:
        each depends on those ids, as in ``enqueue``.)

        Sent as ``enqueue_batch`` frames of up to 1,000 jobs, fewer when their frame would
        be over the broker's ``max_frame_bytes``; each frame is all or nothing (a bad
        payload raises ``InvalidArgument`` naming ``jobs[i].payload`` and stores none of
        its frame). A job too large for a frame of its own raises ``TooLarge`` naming
        ``jobs[i].payload`` before any frame is sent. Every job gets its own idempotency
        key, so resends store once.
        """
        options = _options(
            priority=priority,
            delay_s=delay_s,
            run_at=run_at,
            expires_s=expires_s,
            visibility_timeout_s=visibility_timeout_s,
            max_attempts=max_attempts,
            backoff_base_s=backoff_base_s,
            timeout_s=timeout_s,
            partition=partition,
        )
        if after:
            options["after"] = _ids("after", after)
        jobs = [
            {"payload": _payload(p, f"jobs[{i}].payload"), "key": _auto_key(), **options}
            for i, p in enumerate(payloads)
        ]
        ids: list[str] = []
        for batch in self._batches(queue, jobs):
            reply = await self._session.request(
                "enqueue_batch", {"queue": queue, "jobs": batch}, called="enqueue_many"
            )
            ids.extend(reply["ids"])
        return ids

    async def enqueue_group(self, group: Group) -> list[str]:
        """Store every job of ``group`` or none (docs/contract.md, DEP-6): their ids, in
        the order they were added (``ids[i]`` for the member ``group.add`` numbered
        ``i``). Members name each other by index in ``after``, and stored jobs by id.

        One ``enqueue_group`` frame: at most the broker's ``max_batch`` jobs, within its
        ``max_frame_bytes``. Each member without a ``key`` gets one made here, so that a
        request resent after a lost reply stores the group once. Raises
        ``InvalidArgument`` naming the member and field (``jobs[2].after[0]``: an id the
        broker does not know), ``DependencyCycle``, ``TooLarge``."""
        if not group.jobs:
            return []
        jobs = []
        for i, member in enumerate(group.jobs):
            job = dict(member)
            job["payload"] = _payload(member["payload"], f"jobs[{i}].payload")
            for name, value in member.items():
                if isinstance(value, float):
                    _finite(f"jobs[{i}].{name}", value)
            job.setdefault("key", _auto_key())
            jobs.append(job)
        reply = await self._call("enqueue_group", jobs=jobs)
        ids: list[str] = reply["ids"]
        return ids

    def _batches(self, queue: str, jobs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        """``jobs`` in ``enqueue_batch`` runs of at most ``_BATCH`` whose frames fit the
        broker's ``max_frame_bytes``; raises ``TooLarge`` for a job that fits no frame."""
        session = self._session
        limit = session.max_frame_bytes

        def fits(run: list[dict[str, Any]]) -> bool:
            return session.frame_size("enqueue_batch", {"queue": queue, "jobs": run}) <= limit

        batches: list[list[dict[str, Any]]] = []
        for first in range(0, len(jobs), _BATCH):
            for start, run in split_to_fit(jobs[first : first + _BATCH], fits):
                if len(run) == 1 and not fits(run):
                    size = session.frame_size("enqueue_batch", {"queue": queue, "jobs": run})
                    refusal = session.too_large("enqueue_batch", size)
                    field = f"jobs[{first + start}].payload"
                    raise TooLarge(f"{field}: {refusal.message}", field=field)
                batches.append(run)
        return batches

    async def get_job(self, job_id: str) -> JobInfo | None:
        """The job's fields, or ``None`` when it is gone (acked on a queue that keeps no
        finished jobs, cancelled, purged, past its retention). A job kept once acked is
        ``completed``, with its ``result`` and ``completed_at``."""
        reply = await self._call("get_job", id=job_id)
        job = reply.get("job")
        return None if job is None else JobInfo.from_wire(job)

    async def result(self, job_id: str, *, timeout_s: float | None = None) -> Any:
        """Wait for the job to finish and return its result: what its handler returned
        (``None`` when it returned nothing). A job already finished answers at once, if
        its queue keeps finished jobs (``completed_retention_s``).

        Raises ``JobFailed`` (its ``error``) when the job died, ``JobCancelled`` when it
        was cancelled, ``JobNotFound`` when the broker does not know it (no such job, or
        finished and not kept), and ``TimeoutError`` when ``timeout_s`` seconds pass
        first (``None``: wait as long as it takes). ``InvalidArgument`` for a
        ``timeout_s`` that is not a finite number >= 0.

        The broker's ``wait`` holds each request at most ``MAX_WAIT_S`` and at most half
        this client's ``request_timeout``; a longer wait is several requests in a row,
        each resent after a reconnect like any request.
        """
        if timeout_s is not None:
            _finite("timeout_s", timeout_s)
            if timeout_s < 0:
                raise InvalidArgument(
                    f"timeout_s: must be >= 0, got {timeout_s!r}", field="timeout_s"
                )
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        step = min(MAX_WAIT_S, self._session.request_timeout / 2)
        while True:
            left = step if deadline is None else max(0.0, min(step, deadline - loop.time()))
            reply = await self._call("wait", id=job_id, timeout_s=left)
            state = reply["state"]
            if state == "completed":
                return reply.get("result")
            if state == "dead":
                raise JobFailed(job_id, reply.get("error"))
            if state == "cancelled":
                raise JobCancelled(job_id)
            if state == "unknown":
                raise JobNotFound(job_id)
            if deadline is not None and loop.time() >= deadline:
                raise TimeoutError(f"job {job_id}: still {state} after {timeout_s} s")

    async def watch(self, job_id: str) -> AsyncGenerator[JobEvent, None]:
        """The job's events as they happen, ending with its end: ``async for event in
        client.watch(job_id)``. Each is a ``JobEvent``: ``progress`` (the first one,
        when the job has reported any, is its latest so far), ``retry`` (an attempt
        ended and the job will run again), then one ``end`` (``state`` completed with
        ``result``, dead with ``error``, cancelled, or unknown: no such job, or one
        finished and not kept), after which the iteration stops.

        Progress values reported in a row may come as their last only: neither the
        broker nor this client queues more than the latest for a reader that is behind.
        After a reconnect the watch goes on from the job as it stands then (an event
        made during the outage may be missed; its end is not). Leaving the loop early
        stops the watch. Raises ``Forbidden`` without the publish or read role."""
        watch = _Watch()
        watchers = self._watches.setdefault(job_id, [])
        first = not watchers
        watchers.append(watch)
        ended = False
        try:
            if first:
                reply = await self._call("watch_job", id=job_id)
                self._watched(job_id, reply)
            else:  # the broker watches it already for this client: start from now
                info = await self.get_job(job_id)
                if info is not None and info.progress is not None and not watch.events:
                    watch.put(JobEvent(job_id, "progress", info.attempts, info.progress))
            while True:
                while not watch.events:
                    watch.wake.clear()
                    await watch.wake.wait()
                event = watch.events.popleft()
                ended = event.kind == "end"
                yield event
                if ended:
                    return
        finally:
            left = self._watches.get(job_id)
            if left is not None and watch in left:
                left.remove(watch)
                if not left:
                    del self._watches[job_id]
                    if not ended and self._session.connected.is_set():
                        with contextlib.suppress(Exception):
                            await self._call("unwatch_job", id=job_id)

    def _watched(self, job_id: str, reply: dict[str, Any]) -> None:
        """A ``watch_job`` reply: the job's end when it has ended, else its latest
        progress (unless an event came already: it is newer)."""
        for watch in self._watches.get(job_id, ()):
            if not reply.get("watching"):
                watch.put(JobEvent.from_wire({**reply, "event": "end"}))
            elif reply.get("progress") is not None and not watch.events:
                watch.put(JobEvent(job_id, "progress", reply.get("attempts"), reply["progress"]))

    def _on_push(self, frame: dict[str, Any]) -> None:
        if frame.get("push") != "job_event":
            return
        job_id = frame.get("id")
        watchers = self._watches.get(job_id) if isinstance(job_id, str) else None
        if not watchers:
            return
        event = JobEvent.from_wire(frame)
        for watch in watchers:
            watch.put(event)

    async def _rewatch(self, session: Session) -> None:
        """A new connection: watch again the jobs watched on the one before."""
        if not self._watches:
            return
        ids = list(self._watches)
        replies = await asyncio.gather(
            *(session.request("watch_job", {"id": job_id}, resend=False) for job_id in ids),
            return_exceptions=True,
        )
        for job_id, reply in zip(ids, replies, strict=True):
            if isinstance(reply, dict):
                self._watched(job_id, reply)

    async def cancel(self, job_id: str) -> bool:
        """Delete the job in any state; ``True`` if it existed. Its worker is told."""
        cancelled: bool = (await self._call("cancel", id=job_id))["cancelled"]
        return cancelled

    async def cancel_many(self, ids: Sequence[str]) -> list[bool]:
        """``cancel`` for each id, in order: whether each existed. Sent as ``cancel_batch``
        frames of at most the broker's ``max_batch`` ids each."""
        ids = list(ids)
        size = int(self.server_info.get("max_batch") or _BATCH)
        done: list[bool] = []
        for start in range(0, len(ids), size):
            reply = await self._call("cancel_batch", ids=ids[start : start + size])
            done.extend(reply["cancelled"])
        return done

    async def list_jobs(
        self,
        queue: str,
        state: str,
        *,
        search: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> JobPage:
        """A page of ``queue``'s jobs in ``state``: ``"ready"`` (in claim order),
        ``"scheduled"`` (the soonest due first), ``"processing"`` (the oldest claim first)
        or ``"dead"`` (the latest death first). Pass the page's ``next`` as ``cursor`` for
        the following one; a job that stays in its state is on exactly one page.

        ``search`` keeps only jobs whose id or key equals it, or whose payload's JSON text
        contains it; the broker looks at a bounded number of jobs per call (2,000), so a
        searched page may come back short or empty with a ``next`` to go on from.
        ``limit`` is 1 to 500. Raises ``NotFound`` for an unknown queue and
        ``InvalidArgument`` for a bad state, limit or cursor."""
        reply = await self._call(
            "list_jobs",
            queue=queue,
            state=state,
            **_options(search=search, cursor=cursor),
            limit=limit,
        )
        return JobPage.from_wire(reply)

    async def dead_letters(
        self, queue: str, *, limit: int = 50, cursor: str | None = None
    ) -> JobPage:
        """``list_jobs(queue, "dead", ...)``: the dead letters, the latest death first."""
        return await self.list_jobs(queue, "dead", cursor=cursor, limit=limit)

    async def stats(self, queue: str | None = None) -> dict[str, dict[str, Any]]:
        """Counts per queue: ``{name: {ready, scheduled, processing, dead, paused,
        oldest_ready_at, totals, limited, partitions, backoff_until, limits}}``;
        ``oldest_ready_at`` is the earliest ready time of a ready job (epoch seconds,
        broker clock), ``None`` when none is ready; ``limited`` how many ready jobs wait
        on a flow-control limit (docs/protocol.md, ``stats``)."""
        queues: dict[str, dict[str, Any]] = (await self._call("stats", **_options(queue=queue)))[
            "queues"
        ]
        return queues

    # -- operator actions (the admin role) ------------------------------------------------

    async def pause(self, queue: str) -> None:
        """Stop handing out jobs of ``queue``."""
        await self._call("pause", queue=queue)

    async def resume(self, queue: str) -> None:
        """Hand out jobs of ``queue`` again."""
        await self._call("resume", queue=queue)

    async def set_limits(
        self,
        queue: str,
        *,
        concurrency: int | None = None,
        rate: int | None = None,
        per_s: float = 1.0,
        burst: int | None = None,
        partition_concurrency: int | None = None,
        partition_rate: int | None = None,
        partition_per_s: float = 1.0,
        partition_burst: int | None = None,
    ) -> dict[str, Any]:
        """Replace all of ``queue``'s flow-control limits (``docs/contract.md``, FLW-1);
        ``None``: no such limit, so ``set_limits(queue)`` clears them. ``rate`` claims per
        ``per_s`` seconds, ``burst`` of them at once (1 when not set); the ``partition_``
        ones hold each partition key on its own. Returns the limits now in force. Raises
        ``InvalidArgument`` naming the field of a bad one (nothing changes)."""
        options = _options(
            concurrency=concurrency,
            rate=rate,
            per_s=per_s,
            burst=burst,
            partition_concurrency=partition_concurrency,
            partition_rate=partition_rate,
            partition_per_s=partition_per_s,
            partition_burst=partition_burst,
        )
        limits: dict[str, Any] = (await self._call("set_limits", queue=queue, **options))["limits"]
        return limits

    # -- schedules (docs/schedules.md) ---------------------------------------------------

    async def set_schedule(
        self,
        id: str,
        queue: str,
        payload: Any = None,
        *,
        cron: str | None = None,
        every_s: float | None = None,
        tz: str = "UTC",
        start_at: float | datetime | None = None,
        end_at: float | datetime | None = None,
        missed: str = "once",
        max_catch_up: int = 100,
        paused: bool = False,
        priority: int = 0,
        max_attempts: int | None = None,
        visibility_timeout_s: float | None = None,
        expires_s: float | None = None,
        backoff_base_s: float | None = None,
        timeout_s: float | None = None,
        partition: str | None = None,
    ) -> ScheduleInfo:
        r"""Make schedule ``id``, or replace its definition: at each tick of ``cron`` (five
        fields or ``@daily``-style, read in the IANA zone ``tz``) or every ``every_s``
        seconds (give one), from ``start_at`` to ``end_at`` (Unix seconds or aware
        ``datetime``\ s), the broker enqueues one job of ``payload`` on ``queue`` with
        these options (``enqueue``'s). ``missed`` says what ticks missed while the broker
        was down make: ``"skip"`` none, ``"once"`` one, ``"each"`` one each (at most
        ``max_catch_up``). A change that keeps the timing keeps the schedule's progress.
        The admin role. Raises ``InvalidArgument`` naming the field
        (``schedule.cron``, ``schedule.tz``...); nothing changes then."""
        schedule = {
            "id": id,
            "queue": queue,
            "payload": _payload(payload, "schedule.payload"),
            "tz": tz,
            "missed": missed,
            "max_catch_up": max_catch_up,
            "paused": paused,
            "priority": priority,
            **_options(
                cron=cron,
                every_s=every_s,
                start_at=_when("schedule.start_at", start_at),
                end_at=_when("schedule.end_at", end_at),
                max_attempts=max_attempts,
                visibility_timeout_s=visibility_timeout_s,
                expires_s=expires_s,
                backoff_base_s=backoff_base_s,
                timeout_s=timeout_s,
                partition=partition,
            ),
        }
        reply = await self._call("set_schedule", schedule=schedule)
        return ScheduleInfo.from_wire(reply["schedule"])

    async def delete_schedule(self, id: str) -> bool:
        """Delete the schedule (the jobs it made stay); ``False``: there was none. Admin."""
        deleted: bool = (await self._call("delete_schedule", id=id))["deleted"]
        return deleted

    async def pause_schedule(self, id: str) -> ScheduleInfo | None:
        """Stop the schedule making jobs until resumed (its ticks meanwhile make none);
        the schedule now, ``None``: there is none. Admin."""
        found = (await self._call("pause_schedule", id=id))["schedule"]
        return None if found is None else ScheduleInfo.from_wire(found)

    async def resume_schedule(self, id: str) -> ScheduleInfo | None:
        """Let a paused schedule make jobs again, from its first tick after now; the
        schedule now, ``None``: there is none. Admin."""
        found = (await self._call("resume_schedule", id=id))["schedule"]
        return None if found is None else ScheduleInfo.from_wire(found)

    async def run_schedule(self, id: str) -> str | None:
        """Make one job of the schedule now, whatever its ticks (even paused): the job's
        id; ``None``: no such schedule. Its next tick is unchanged. Admin."""
        job_id: str | None = (await self._call("run_schedule", id=id))["id"]
        return job_id

    async def get_schedule(self, id: str) -> ScheduleInfo | None:
        """The schedule, or ``None`` when there is none."""
        found = (await self._call("list_schedules", ids=[id]))["schedules"]
        return ScheduleInfo.from_wire(found[0]) if found else None

    async def list_schedules(self, *, after: str | None = None, limit: int = 100) -> SchedulePage:
        """A page of the schedules in id order, starting after the id ``after`` (pass the
        page's ``next`` for the following one); ``limit`` is 1 to 1000."""
        reply = await self._call("list_schedules", **_options(after=after), limit=limit)
        return SchedulePage(
            [ScheduleInfo.from_wire(item) for item in reply["schedules"]], reply.get("next")
        )

    async def schedules(self, ids: Sequence[str] | None = None) -> list[ScheduleInfo]:
        """The schedules named by ``ids`` (in that order, unknown ones left out), or every
        schedule in id order, read a page of 1000 at a time."""
        if ids is not None:
            ids = list(ids)
            size = int(self.server_info.get("max_batch") or _BATCH)
            found: list[ScheduleInfo] = []
            for start in range(0, len(ids), size):
                reply = await self._call("list_schedules", ids=ids[start : start + size])
                found.extend(ScheduleInfo.from_wire(item) for item in reply["schedules"])
            return found
        out: list[ScheduleInfo] = []
        after: str | None = None
        while True:
            page = await self.list_schedules(after=after, limit=1000)
            out.extend(page.schedules)
            if page.next is None:
                return out
            after = page.next

    async def redrive(self, job_id: str) -> bool:
        """Put a dead job back to pending with its attempts reset."""
        redriven: bool = (await self._call("redrive", id=job_id))["redriven"]
        return redriven

    async def purge_dead(self, queue: str) -> int:
        """Delete the dead jobs of ``queue``; return how many."""
        purged: int = (await self._call("purge_dead", queue=queue))["purged"]
        return purged

    async def redrive_all(self, queue: str) -> int:
        """Redrive every dead job of ``queue`` (as ``redrive`` does each); return how many.
        The broker moves a large dead-letter queue in steps, not as one change: a job that
        dies while it runs may stay dead. Raises ``NotFound`` for an unknown queue."""
        redriven: int = (await self._call("redrive_all", queue=queue))["redriven"]
        return redriven


class SyncClient:
    """A blocking publisher for threads and scripts (Django, Flask, cron jobs).

    ``with SyncClient(url) as client: client.enqueue("emails", {...})``. The same
    arguments (one broker URL or several, as ``Client``'s) and methods as ``Client``,
    blocking; safe to share between threads (calls run on one background
    event loop and are pipelined on one connection).
    """

    def __init__(
        self,
        url: Urls = DEFAULT_URL,
        token: str | None = None,
        *,
        name: str = "conveyor-python-sync",
        connect_timeout: float = 10.0,
        request_timeout: float = 30.0,
        shuffle_urls: bool = True,
        fail_fast: bool = False,
    ) -> None:
        self.urls = parse_urls(url)  # refused here, not at `with`
        self._args = (self.urls, token)
        self._kwargs: dict[str, Any] = {
            "name": name,
            "connect_timeout": connect_timeout,
            "request_timeout": request_timeout,
            "shuffle_urls": shuffle_urls,
            "fail_fast": fail_fast,
        }
        self._stack: contextlib.ExitStack | None = None
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._client: Client | None = None

    def __enter__(self) -> SyncClient:
        stack = contextlib.ExitStack()
        try:
            portal = stack.enter_context(anyio.from_thread.start_blocking_portal())
            client = Client(*self._args, **self._kwargs)
            stack.enter_context(portal.wrap_async_context_manager(client))
        except BaseException:
            stack.close()
            raise
        self._stack, self._portal, self._client = stack, portal, client
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def url(self) -> str | None:
        """``Client.url``: the broker connected to now, ``None`` while none is (or outside
        ``with``)."""
        client = self._client
        return None if client is None else client.url

    def close(self) -> None:
        """Close the connection and stop the background loop."""
        stack, self._stack = self._stack, None
        self._portal = self._client = None  # later calls say to use `with`
        if stack is not None:
            stack.close()

    def _run(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._portal is None:
            raise RuntimeError("use SyncClient inside `with SyncClient(...) as client:`")
        return self._portal.call(functools.partial(method, *args, **kwargs))

    def _enqueue_soon(self, queue: str, payload: Any, **options: Any) -> Future[str]:
        """``Client.enqueue`` started on this client's loop, not waited for: its future,
        for a caller on another event loop (``asyncio.wrap_future`` awaits it there).
        Raises ``RuntimeError`` once the client is closed."""
        if self._portal is None:
            raise RuntimeError("use SyncClient inside `with SyncClient(...) as client:`")
        return self._portal.start_task_soon(
            functools.partial(self._c.enqueue, queue, payload, **options)
        )

    @property
    def _c(self) -> Client:
        # Not an assert: this is the caller's mistake to report, and -O drops asserts.
        if self._client is None:
            raise RuntimeError("use SyncClient inside `with SyncClient(...) as client:`")
        return self._client

    def enqueue(self, queue: str, payload: Any, **options: Any) -> str:
        """``Client.enqueue``, blocking."""
        job_id: str = self._run(self._c.enqueue, queue, payload, **options)
        return job_id

    def enqueue_many(self, queue: str, payloads: Sequence[Any], **options: Any) -> list[str]:
        """``Client.enqueue_many``, blocking."""
        ids: list[str] = self._run(self._c.enqueue_many, queue, payloads, **options)
        return ids

    def enqueue_group(self, group: Group) -> list[str]:
        """``Client.enqueue_group``, blocking."""
        ids: list[str] = self._run(self._c.enqueue_group, group)
        return ids

    def get_job(self, job_id: str) -> JobInfo | None:
        """``Client.get_job``, blocking."""
        info: JobInfo | None = self._run(self._c.get_job, job_id)
        return info

    def result(self, job_id: str, *, timeout_s: float | None = None) -> Any:
        """``Client.result``, blocking."""
        return self._run(self._c.result, job_id, timeout_s=timeout_s)

    def watch(self, job_id: str) -> Iterator[JobEvent]:
        """``Client.watch``, blocking: ``for event in client.watch(job_id): ...``."""
        events = self._c.watch(job_id)

        async def next_event() -> JobEvent | None:
            try:
                return await events.__anext__()
            except StopAsyncIteration:
                return None

        try:
            while (event := self._run(next_event)) is not None:
                yield event
        finally:
            if self._portal is not None:
                self._run(events.aclose)

    def cancel(self, job_id: str) -> bool:
        """``Client.cancel``, blocking."""
        return bool(self._run(self._c.cancel, job_id))

    def stats(self, queue: str | None = None) -> dict[str, dict[str, Any]]:
        """``Client.stats``, blocking."""
        stats: dict[str, dict[str, Any]] = self._run(self._c.stats, queue)
        return stats

    def pause(self, queue: str) -> None:
        self._run(self._c.pause, queue)

    def resume(self, queue: str) -> None:
        self._run(self._c.resume, queue)

    def redrive(self, job_id: str) -> bool:
        return bool(self._run(self._c.redrive, job_id))

    def set_limits(self, queue: str, **limits: Any) -> dict[str, Any]:
        """``Client.set_limits``, blocking."""
        found: dict[str, Any] = self._run(self._c.set_limits, queue, **limits)
        return found

    def purge_dead(self, queue: str) -> int:
        purged: int = self._run(self._c.purge_dead, queue)
        return purged

    def cancel_many(self, ids: Sequence[str]) -> list[bool]:
        """``Client.cancel_many``, blocking."""
        done: list[bool] = self._run(self._c.cancel_many, ids)
        return done

    def list_jobs(
        self,
        queue: str,
        state: str,
        *,
        search: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> JobPage:
        """``Client.list_jobs``, blocking."""
        page: JobPage = self._run(
            self._c.list_jobs, queue, state, search=search, cursor=cursor, limit=limit
        )
        return page

    def dead_letters(self, queue: str, *, limit: int = 50, cursor: str | None = None) -> JobPage:
        """``Client.dead_letters``, blocking."""
        page: JobPage = self._run(self._c.dead_letters, queue, limit=limit, cursor=cursor)
        return page

    def redrive_all(self, queue: str) -> int:
        """``Client.redrive_all``, blocking."""
        redriven: int = self._run(self._c.redrive_all, queue)
        return redriven

    def set_schedule(
        self, id: str, queue: str, payload: Any = None, **options: Any
    ) -> ScheduleInfo:
        """``Client.set_schedule``, blocking."""
        info: ScheduleInfo = self._run(self._c.set_schedule, id, queue, payload, **options)
        return info

    def delete_schedule(self, id: str) -> bool:
        """``Client.delete_schedule``, blocking."""
        return bool(self._run(self._c.delete_schedule, id))

    def pause_schedule(self, id: str) -> ScheduleInfo | None:
        """``Client.pause_schedule``, blocking."""
        info: ScheduleInfo | None = self._run(self._c.pause_schedule, id)
        return info

    def resume_schedule(self, id: str) -> ScheduleInfo | None:
        """``Client.resume_schedule``, blocking."""
        info: ScheduleInfo | None = self._run(self._c.resume_schedule, id)
        return info

    def run_schedule(self, id: str) -> str | None:
        """``Client.run_schedule``, blocking."""
        job_id: str | None = self._run(self._c.run_schedule, id)
        return job_id

    def get_schedule(self, id: str) -> ScheduleInfo | None:
        """``Client.get_schedule``, blocking."""
        info: ScheduleInfo | None = self._run(self._c.get_schedule, id)
        return info

    def list_schedules(self, *, after: str | None = None, limit: int = 100) -> SchedulePage:
        """``Client.list_schedules``, blocking."""
        page: SchedulePage = self._run(self._c.list_schedules, after=after, limit=limit)
        return page

    def schedules(self, ids: Sequence[str] | None = None) -> list[ScheduleInfo]:
        """``Client.schedules``, blocking."""
        found: list[ScheduleInfo] = self._run(self._c.schedules, ids)
        return found
