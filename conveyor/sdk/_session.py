"""One logical connection to a broker that outlives its sockets.

A ``Session`` connects, says ``hello``, runs the owner's ``on_connect`` step (the worker
subscribes there), and only then sends the requests that were waiting. When the socket
drops it reconnects, and resends every request that had no reply yet: enqueues carry an
idempotency key, so a resent enqueue is stored once.

A session may be given several broker URLs (brokers sharing one job table). It tries
them in its ``connection_order`` (the order given, or shuffled), round after round: a
failed connect or a lost connection moves on to the next URL at once, and only a whole
round of failures in a row waits out the exponential backoff with jitter (one URL: every
failure does). Its backoff steps grow with each such round and start over once a
connection is ready (``hello`` and ``on_connect`` done). An outage is logged once when
it starts and once when it ends, not once per try; every connection logs one line
naming its URL (INFO, or WARNING when it ends an outage).

No request frame goes out over the broker's ``max_frame_bytes`` (docs/protocol.md §2):
such a request fails at once with ``TooLarge``, and the enqueues that share frames are
split until each frame fits. Should the broker close with 1009 all the same, the largest
request still unanswered on that socket fails with ``TooLarge`` instead of being resent.

Requests may be many at once (pipelined); replies are matched by ``rid``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn, TypeVar

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from ._errors import (
    ConnectionFailed,
    ConveyorError,
    Forbidden,
    TooLarge,
    Unauthorized,
    error_from_reply,
)
from ._transport import Socket, connect
from ._urls import brokers, connection_order
from ._wire import (
    CLOSE_MESSAGE_TOO_BIG,
    DEFAULT_MAX_FRAME_BYTES,
    INT_MAX,
    OPS,
    WS_PATH,
    WireError,
    decode,
    encode,
)

__all__ = ["Session", "as_called", "handshake_refusal"]

log = logging.getLogger("conveyor.sdk")

# Frames queued in one loop iteration that make one socket write without waiting for the
# iteration's end.
_FLUSH_AT = 8
# Incoming frames may be up to twice the broker's frame limit (docs/protocol.md §12).
_MAX_INCOMING = 16 * 1024 * 1024
# Enqueues made in one loop iteration travel together in enqueue_each frames of at most
# this many jobs and, past the first, this many payload bytes. Several smaller frames in
# flight beat one large one: the broker works on one while we make the next.
_EACH_JOBS = 16
EACH_BYTES = 64 * 1024
# Frames are measured for splitting with the widest rid a request may carry, so that a run
# measured to fit still fits with whatever rid it is sent under.
_WIDEST_RID = INT_MAX

T = TypeVar("T")


def _permanent(exc: ConveyorError) -> bool:
    """Whether the broker's refusal of ``hello`` or ``subscribe`` outlasts a reconnect.

    A wrong token, a token without the role, a bad queue name or a ``prefetch`` over the
    limit are refused the same way every time; a broker shutting down (``unavailable``),
    its bug (``internal``), a reply that never came, or too many connections for the
    token (close 1013, "try again later") may pass.
    """
    if exc.code in ("unavailable", "internal", ConnectionFailed.code):
        return False
    return not (exc.code == "limit_exceeded" and exc.field == "token")


def handshake_refusal(
    url: str, status: int, body: bytes | bytearray | None
) -> ConveyorError | None:
    """The error for an HTTP ``status`` answering the WebSocket handshake to ``url``
    when it is one that a retry would get again, else ``None`` (retry).

    404: nothing at that path is a Conveyor broker (a wrong path or port, another
    server); 401 and 403: the broker (or a proxy in front of it) refused the token, the
    ``Host`` or the ``Origin``; the body's first line says which.
    """
    said = bytes(body or b"").decode("utf-8", "replace").strip().split("\n", 1)[0][:200]
    detail = f"HTTP {status}: {said}" if said else f"HTTP {status}"
    if status == 404:
        return ConnectionFailed(
            f"{url}: no Conveyor broker at this URL ({detail}); check the host, port and "
            f"path (a broker answers at {WS_PATH})"
        )
    if status == 401:
        return Unauthorized(f"{url}: the broker refused the token ({detail})")
    if status == 403:
        return Unauthorized(f"{url}: the broker refused the connection ({detail})")
    return None


def as_called(error: ConveyorError, called: str, op: str) -> ConveyorError:
    """``error``, the refusal of wire ``op``, as the refusal of the SDK call ``called``
    that sent it (``enqueue`` sends ``enqueue_each``): a ``Forbidden`` names the call and
    the role it needs, not the op it travelled as. Any other error is returned as is."""
    if not isinstance(error, Forbidden):
        return error
    spec = OPS.get(op)
    needs = f"; it needs {spec.needs()}" if spec is not None else ""
    return Forbidden(f"{called}: this token may not call {called}{needs}", field=error.field)


class _Lost(Exception):
    """The socket closed under a request that is not resent (hello, subscribe)."""


class _Pending:
    __slots__ = ("deadline", "frame", "future", "op", "resend")

    def __init__(
        self,
        frame: bytes,
        future: asyncio.Future[dict[str, Any]],
        resend: bool,
        op: str,
        deadline: float,
    ) -> None:
        self.frame = frame
        self.future = future
        self.resend = resend
        self.op = op
        self.deadline = deadline


class Session:
    """A reconnecting, pipelining protocol connection. Run ``run()`` in a task group."""

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        shuffle: bool = False,
        token: str | None = None,
        client_name: str = "conveyor-python",
        on_connect: Callable[[Session], Awaitable[None]] | None = None,
        on_push: Callable[[dict[str, Any]], None] | None = None,
        connect_timeout: float = 10.0,
        request_timeout: float = 30.0,
        backoff_base_s: float = 0.1,
        backoff_max_s: float = 10.0,
        log_connects: bool = True,
        fail_fast: bool = False,
    ) -> None:
        self.urls: tuple[str, ...] = (urls,) if isinstance(urls, str) else tuple(urls)
        if not self.urls:
            raise ValueError("Session: no broker URL")
        self._rng = random.Random()
        # The order URLs are tried in, round after round (see connection_order).
        self._order = connection_order(self.urls, shuffle=shuffle, rng=self._rng)
        self._current: str | None = None  # the URL of the connection, while it is ready
        self._connections = 0  # how many became ready (for the log)
        # The URL being connected to, from before hello until the next attempt: what
        # on_connect may name (``url`` is set only once it is done).
        self.connecting_url: str | None = None
        # False: an owner that logs each connection its own way (the worker); an outage's
        # end is still logged here, at WARNING.
        self.log_connects = log_connects
        self.token = token
        self.client_name = client_name
        self.on_connect = on_connect
        self.on_push = on_push
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        # Until a connection is first ready, one failed try of each URL ends run() with
        # ConnectionFailed instead of retrying (a one-shot command: nothing listening
        # there is said at once, not after the connect timeout).
        self.fail_fast = fail_fast
        self.hello: dict[str, Any] = {}
        self._max_frame_bytes = DEFAULT_MAX_FRAME_BYTES  # see max_frame_bytes
        self.connected = asyncio.Event()
        self._ws: Socket | None = None
        self._ready = False  # hello and on_connect done on the current socket
        self._pending: dict[int, _Pending] = {}  # in the order sent, so by deadline
        self._expiry: asyncio.TimerHandle | None = None  # at the oldest one's deadline
        self._rids = itertools.count(1)
        self._fatal: ConveyorError | None = None
        self._closing = False
        self._wake = asyncio.Event()  # set by close(): ends a backoff wait at once
        self._connecting: asyncio.Task[Socket] | None = None
        # The latest socket, kept after it is done with, so that close() can wait for its
        # closing to finish even when run() was cancelled halfway through it.
        self._socket: Socket | None = None
        self._running = False
        self._ended = asyncio.Event()  # set when run() returns or raises
        self._out: list[bytes] = []  # frames waiting for the writer (see _send)
        self._writing = False
        # Enqueues waiting for the next enqueue_each frame (see enqueue).
        self._jobs: list[dict[str, Any]] = []
        self._job_futures: list[asyncio.Future[tuple[int, dict[str, Any]]]] = []
        self._job_bytes = 0
        self._ship_scheduled = False
        # False once a broker answered enqueue_each with unknown_op (one older than the
        # op): enqueues then go one by one, as plain enqueue.
        self._each = True

    # -- requests -------------------------------------------------------------------------

    async def request(
        self, op: str, fields: dict[str, Any], *, resend: bool = True, called: str | None = None
    ) -> Any:
        """Send one request and return its reply; raise the ``ConveyorError`` it carries
        (a ``Forbidden`` names ``called``, the SDK call made, default ``op``, and the
        role it needs: see ``as_called``).

        Waits through reconnects (the request is sent again on the new socket when
        ``resend``) up to ``request_timeout`` seconds in all, then raises
        ``ConnectionFailed``.
        """
        if self._fatal is not None:
            raise self._fatal
        rid, frame, future = self._register(op, fields, resend)
        try:
            if self._ready or not resend:
                await self._send(frame)
            reply = await future
        finally:
            self._pending.pop(rid, None)
        try:
            return _answer_of(reply)
        except Forbidden as exc:
            raise as_called(exc, called or op, op) from None

    def request_now(self, op: str, fields: dict[str, Any]) -> asyncio.Future[Any]:
        """``request``, but written at once instead of with the other frames of this loop
        iteration: for a caller that already holds a write's worth (a worker's acks of
        half its prefetch, so the broker refills that half while the rest run).

        Returns a future of the reply. It fails with the ``ConveyorError`` the reply
        carries, or ``ConnectionFailed`` as ``request`` does; cancelling it stops the wait
        (the request may still be answered). Resent after a reconnect.
        """
        result: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self._fatal is not None:
            result.set_exception(self._fatal)
            return result
        try:
            rid, frame, future = self._register(op, fields, True)
        except TooLarge as exc:
            result.set_exception(exc)
            return result

        def answered(done: asyncio.Future[dict[str, Any]]) -> None:
            self._pending.pop(rid, None)
            if result.done():
                return  # cancelled by the caller
            if done.cancelled():
                result.cancel()
                return
            try:
                result.set_result(_answer_of(done.result()))
            except Exception as exc:  # the refusal, or whatever failed the request
                result.set_exception(exc)

        future.add_done_callback(answered)
        result.add_done_callback(lambda _: None if future.done() else future.cancel())
        if self._ready:
            self._write_now(frame)
        return result

    @property
    def url(self) -> str | None:
        """The URL of the broker this session is connected to (``hello`` and ``on_connect``
        done), ``None`` while it is not."""
        return self._current

    @property
    def max_frame_bytes(self) -> int:
        """The largest request frame the broker accepts: ``max_frame_bytes`` of the latest
        ``hello`` reply (the last one heard while reconnecting), the protocol's default
        before any."""
        return self._max_frame_bytes

    def frame_size(self, op: str, fields: dict[str, Any]) -> int:
        """The bytes of the request frame ``op`` with ``fields`` takes, whatever its rid."""
        return len(encode({"op": op, "rid": _WIDEST_RID, **fields}))

    def too_large(self, op: str, size: int) -> TooLarge:
        """The refusal of a request frame of ``size`` bytes, over ``max_frame_bytes``."""
        return TooLarge(
            f"{op} frame is {size:,} bytes; the broker accepts at most "
            f"{self.max_frame_bytes:,} (max_frame_bytes)"
        )

    def _register(
        self, op: str, fields: dict[str, Any], resend: bool
    ) -> tuple[int, bytes, asyncio.Future[dict[str, Any]]]:
        """A new request, waiting in ``_pending`` for its reply (or its timeout).

        Raises ``TooLarge``, registering nothing, when its frame is over
        ``max_frame_bytes``: the broker would close the connection over it unread.
        """
        rid = next(self._rids)
        frame = encode({"op": op, "rid": rid, **fields})
        if len(frame) > self.max_frame_bytes:
            raise self.too_large(op, len(frame))
        return rid, frame, self._track(rid, frame, op, resend)

    def _track(
        self, rid: int, frame: bytes, op: str, resend: bool
    ) -> asyncio.Future[dict[str, Any]]:
        """Wait in ``_pending`` for the reply to ``frame`` (or its timeout)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        deadline = loop.time() + self.request_timeout
        self._pending[rid] = _Pending(frame, future, resend, op, deadline)
        if self._expiry is None:
            self._expiry = loop.call_at(deadline, self._expire)
        return future

    async def enqueue(self, job: dict[str, Any], size: int) -> str:
        """Store one job and return its id; raise the ``ConveyorError`` refusing it.

        ``job`` holds the members of an ``enqueue_each`` entry (``queue``, ``payload``
        as raw JSON of ``size`` bytes, the options, a ``key``). The enqueues made in one
        loop iteration (a publisher's concurrent tasks, a ``SyncClient``'s threads) go
        out together, in the order made, as ``enqueue_each`` frames; each gets its own
        answer, so one refused job fails alone. An enqueue made while no request is in
        flight goes out at once, alone, in the caller's own step. Resent after a
        reconnect and timed out like ``request`` (the key makes a resend store the job
        once). A broker older than ``enqueue_each`` answers it ``unknown_op``: then this
        and every later enqueue go as plain ``enqueue``. A job whose shared frame would
        be over ``max_frame_bytes`` even alone goes as plain ``enqueue`` too, refused with
        ``TooLarge`` if that frame is over it as well.
        """
        if self._fatal is not None:
            raise self._fatal
        if self._each:
            loop = asyncio.get_running_loop()
            future: asyncio.Future[tuple[int, dict[str, Any]]] = loop.create_future()
            if self._jobs and self._job_bytes + size > EACH_BYTES:
                self._ship()
            self._jobs.append(job)
            self._job_futures.append(future)
            self._job_bytes += size
            if len(self._jobs) >= _EACH_JOBS or self._job_bytes >= EACH_BYTES:
                self._ship()
            elif not self._pending and len(self._jobs) == 1:
                # Nothing in flight: no reply is coming this iteration to wake more
                # enqueues to share the frame with, so waiting for the iteration's end
                # would only delay this one (a loop turn before the broker hears of it).
                self._ship()
            elif not self._ship_scheduled:
                self._ship_scheduled = True
                loop.call_soon(self._ship)
            index, answer = await future
            if index >= 0:  # (-1: the broker has no enqueue_each, or the job fits no share)
                error = answer.get("error")
                if error is not None:
                    raise error_from_reply(_unnest(error, f"jobs[{index}]."))
                each_id: str = answer["id"]
                return each_id
        job_id: str = (await self.request("enqueue", job))["id"]
        return job_id

    def _ship(self) -> None:
        """Send the waiting enqueues as one ``enqueue_each`` request."""
        self._ship_scheduled = False
        jobs, futures = self._jobs, self._job_futures
        if not jobs:
            return
        self._jobs, self._job_futures, self._job_bytes = [], [], 0
        if self._fatal is not None:  # refused for good since these were made
            for future in futures:
                if not future.done():
                    future.set_exception(self._fatal)
            return
        rid = next(self._rids)
        frame = encode({"op": "enqueue_each", "rid": rid, "jobs": jobs})
        if len(frame) <= self.max_frame_bytes:
            self._ship_frame(rid, frame, futures)
            return
        # Over the limit together: in runs that each fit. A job too large for a frame of
        # its own goes on as plain `enqueue` (see enqueue), whose frame is a little smaller.
        limit = self.max_frame_bytes
        for start, run in split_to_fit(
            jobs, lambda part: self.frame_size("enqueue_each", {"jobs": part}) <= limit
        ):
            shares = futures[start : start + len(run)]
            if len(run) == 1 and self.frame_size("enqueue_each", {"jobs": run}) > limit:
                if not shares[0].done():
                    shares[0].set_result((-1, {}))
                continue
            rid = next(self._rids)
            self._ship_frame(rid, encode({"op": "enqueue_each", "rid": rid, "jobs": run}), shares)

    def _ship_frame(
        self, rid: int, frame: bytes, futures: list[asyncio.Future[tuple[int, dict[str, Any]]]]
    ) -> None:
        """Send one ``enqueue_each`` frame, and hand its answers to the enqueues in it."""
        request = self._track(rid, frame, "enqueue_each", True)
        request.add_done_callback(lambda done: self._answer(rid, done, futures))
        if self._ready:
            self._write_now(frame)

    def _write_now(self, frame: bytes) -> None:
        """Write ``frame`` at once when nothing is queued ahead of it, else after that."""
        ws = self._ws
        if ws is not None and not self._writing and not self._out and ws.writable:
            ws.write_texts([frame])  # nothing queued before it: no need to wait
        else:
            asyncio.get_running_loop().create_task(self._send(frame))

    def _answer(
        self,
        rid: int,
        request: asyncio.Future[dict[str, Any]],
        futures: list[asyncio.Future[tuple[int, dict[str, Any]]]],
    ) -> None:
        """Hand each enqueue of an ``enqueue_each`` request its own answer."""
        self._pending.pop(rid, None)
        failure = (
            ConnectionFailed("enqueue_each: the request was cancelled")
            if request.cancelled()
            else request.exception()
        )
        if failure is None:
            reply = request.result()
            results = reply.get("results") if reply.get("ok") else None
            if isinstance(results, list) and len(results) == len(futures):
                for index, (future, answer) in enumerate(zip(futures, results, strict=True)):
                    if not future.done():
                        future.set_result((index, answer))
                return
            failure = error_from_reply(reply.get("error") or {"message": "enqueue_each: bad reply"})
            # (the caller called enqueue: a refusal names that, not the frame it shared)
            failure = as_called(failure, "enqueue", "enqueue_each")
            if failure.code == "unknown_op":  # a broker older than the op: nothing stored
                self._each = False
                for future in futures:
                    if not future.done():
                        future.set_result((-1, {}))
                return
        for future in futures:
            if not future.done():
                future.set_exception(failure)

    def send_nowait(self, op: str, fields: dict[str, Any]) -> None:
        """Fire and forget: no ``rid``, no reply on success, nothing resent on a reconnect.
        Raises ``TooLarge`` when the frame is over ``max_frame_bytes``."""
        if self._ready and self._ws is not None:
            frame = encode({"op": op, **fields})
            if len(frame) > self.max_frame_bytes:
                raise self.too_large(op, len(frame))
            asyncio.get_running_loop().create_task(self._send(frame))

    async def _send(self, frame: bytes) -> None:
        """Queue ``frame``; the first sender of a loop iteration writes them all at once.

        Pipelined requests (64 enqueues in flight, a worker's acks) then cost one socket
        write per batch instead of one per frame.
        """
        ws = self._ws
        if ws is None:
            return  # sent when the next socket is ready
        out = self._out
        out.append(frame)
        if len(out) >= _FLUSH_AT and ws.writable:
            # Enough for one write: send it now rather than at the end of the iteration,
            # so the broker works on these while we make the rest. (Sending everything at
            # the end had a publisher and the broker take turns, each idle half the time.)
            self._out = []
            ws.write_texts(out)
        if self._writing:
            return  # the writer under way takes the rest along
        self._writing = True
        try:
            await asyncio.sleep(0)  # let the other senders of this iteration queue theirs
            while self._out and ws is self._ws:
                batch, self._out = self._out, []
                await ws.send_texts(batch)
        except ConnectionClosed:
            pass  # resent (or failed) when the session notices the socket is gone
        finally:
            self._writing = False
            if ws is not self._ws:
                self._out.clear()  # a new socket resends what is pending itself

    # -- the connection loop --------------------------------------------------------------

    async def run(self) -> None:
        """Connect and keep connected until ``close()``; raises only for a fatal refusal."""
        self._running = True
        self._ended.clear()
        try:
            await self._keep_connected()
        finally:
            self._running = False
            self._ended.set()

    async def _keep_connected(self) -> None:
        loop = asyncio.get_running_loop()
        order = self._order
        at = 0  # the place in `order` of the next URL to try
        # Tries failed in a row (a connect, a connection lost before or after it was ready)
        # since a connection was last ready; each round of them (one try of every URL)
        # waits out a backoff, longer for each round.
        failed = 0
        outage_since: float | None = None
        # Why each try failed, and whether it was refused, for fail_fast's error.
        reasons: list[tuple[str, bool]] = []
        while not self._closing:
            url = order[at]
            at = (at + 1) % len(order)  # the next try goes to the next URL, whatever happens
            try:
                ws = await self._connect(url)
                if ws is None:
                    return  # close() stopped the attempt
            except InvalidStatus as exc:
                refused = handshake_refusal(url, exc.response.status_code, exc.response.body)
                if refused is not None:
                    # Fatal with several URLs too: brokers sharing a table share their
                    # tokens and path, so the next would refuse us the same way.
                    self._fail_all(refused)
                    raise refused from None
                ws = None
                why = f"HTTP {exc.response.status_code} to the WebSocket handshake"
                nobody = False
            except (OSError, InvalidHandshake, TimeoutError) as exc:
                ws = None
                why = self._why(exc)
                nobody = isinstance(exc, ConnectionRefusedError)  # nothing listens
            if ws is None:
                if self.fail_fast and not self._connections:
                    reasons.append((f"{url}: {why}", nobody))
                    if len(reasons) == len(order):  # each URL tried once: give up
                        self._give_up(reasons)
                if outage_since is None:
                    outage_since = loop.time()
                    log.warning("cannot reach the broker at %s; %s", url, self._then())
                else:
                    log.debug("cannot reach the broker at %s", url)
                failed += 1
                if failed % len(order) == 0:  # every URL failed in a row: back off
                    await self._nap(self._backoff(failed // len(order)))
                continue
            try:
                await self._serve(ws, url, outage_since)
            except ConveyorError as exc:
                if _permanent(exc):  # a wrong token does not get better by retrying
                    self._fail_all(exc)
                    await ws.close()
                    raise
            finally:
                if self._ready:  # it was connected: the outage (if any) ended then
                    outage_since = None
                    failed = 0
                self._ready = False
                self._ws = None
                self._current = None
                self.connected.clear()
                self._fail_unresent()
            if not self._closing:
                if self.fail_fast and not self._connections:
                    reasons.append((f"{url}: the connection closed before it was ready", False))
                    if len(reasons) == len(order):
                        self._give_up(reasons)
                if outage_since is None:
                    outage_since = loop.time()
                    log.warning(
                        "lost the connection to the broker at %s; %s", url, self._then(True)
                    )
                failed += 1
                if failed % len(order) == 0:
                    await self._nap(self._backoff(failed // len(order)))

    def _why(self, exc: BaseException) -> str:
        """Why a connect failed, in a few words for a message."""
        if isinstance(exc, ConnectionRefusedError):
            return "connection refused"
        if isinstance(exc, socket.gaierror):
            return f"cannot resolve the host name ({exc.strerror})"
        if isinstance(exc, TimeoutError):
            return f"no answer within {self.connect_timeout / len(self._order):g} s"
        if isinstance(exc, OSError):
            return exc.strerror or str(exc) or type(exc).__name__
        return f"the WebSocket handshake failed ({exc})"

    def _give_up(self, reasons: list[tuple[str, bool]]) -> NoReturn:
        """End ``run()`` for ``fail_fast``: every URL was tried once, and none could be
        reached. Every request waiting fails with the same ``ConnectionFailed``."""
        texts = [text for text, _ in reasons]
        if len(texts) == 1:
            message = f"cannot reach the broker at {texts[0]}"
        else:
            message = "cannot reach any of the brokers: " + "; ".join(texts)
        failure = ConnectionFailed(message)
        failure.refused = any(refused for _, refused in reasons)
        self._fail_all(failure)
        raise failure

    def _then(self, lost: bool = False) -> str:
        """What a warning about a failed try says comes next."""
        if len(self._order) > 1:
            return "trying the next broker"
        return "reconnecting" if lost else "retrying"

    async def _connect(self, url: str) -> Socket | None:
        """A new socket to the broker at ``url``, or ``None`` when ``close()`` came first
        (it cancels the attempt); raises what ``connect`` raises.

        With several URLs each try gets its share of ``connect_timeout``, so that a broker
        that does not answer at all (a host that is down, not a refused port) costs a
        ``Client`` entering at most its share before the next URL is tried.
        """
        if self._closing:
            return None

        async def opening() -> Socket:
            return await connect(
                url,
                headers=self._headers(),
                open_timeout=self.connect_timeout / len(self._order),
                max_size=_MAX_INCOMING,
            )

        connecting = asyncio.get_running_loop().create_task(opening())
        self._connecting = connecting
        try:
            await asyncio.wait({connecting})
        finally:
            self._connecting = None
            connecting.cancel()  # (when run() itself is cancelled while it waits)
        if connecting.cancelled():
            return None
        ws = connecting.result()
        self._socket = ws
        if self._closing:  # close() came as the attempt ended
            await ws.close()
            return None
        return ws

    async def _nap(self, seconds: float) -> None:
        """Wait ``seconds`` before the next try, or until ``close()``."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._wake.wait()

    async def _serve(self, ws: Socket, url: str, outage_since: float | None) -> None:
        self._ws = ws
        self.connecting_url = url
        reader = asyncio.get_running_loop().create_task(self._read(ws))
        try:
            hello: dict[str, Any] = {"client": self.client_name}
            if self.token is not None:
                hello["token"] = self.token
            self.hello = await self.request("hello", hello, resend=False)
            limit = self.hello.get("max_frame_bytes")
            if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
                self._max_frame_bytes = limit
            if self.on_connect is not None:
                await self.on_connect(self)
            self._ready = True
            self._current = url
            for frame in self._resend():
                await self._send(frame)
            self.connected.set()
            # One line per connection, naming it: at WARNING when it ends an outage that
            # was warned of, so that the end shows wherever the start did.
            verb = "reconnected" if self._connections else "connected"
            self._connections += 1
            if outage_since is None:
                if self.log_connects:
                    log.info("%s to the broker at %s", verb, url)
            else:
                outage = asyncio.get_running_loop().time() - outage_since
                log.warning("%s to the broker at %s after %.1f s", verb, url, outage)
            await reader
        except (_Lost, ConnectionClosed):
            pass
        finally:
            reader.cancel()
            if ws.close_code == CLOSE_MESSAGE_TOO_BIG and self._ready:
                self._refuse_largest()
            await ws.close()

    def _resend(self) -> list[bytes]:
        """The frames of the requests to send again on a new socket, in the order first
        sent. One over the new ``hello``'s ``max_frame_bytes`` fails with ``TooLarge``."""
        frames = []
        for _, pending in sorted(self._pending.items()):
            if not pending.resend or pending.future.done():
                continue
            if len(pending.frame) > self.max_frame_bytes:
                pending.future.set_exception(self.too_large(pending.op, len(pending.frame)))
            else:
                frames.append(pending.frame)
        return frames

    def _refuse_largest(self) -> None:
        """The broker closed with 1009 over a frame of ours, larger than it takes though
        within its ``hello``. That frame got no reply, so the largest request unanswered
        is at least as large and would be refused again: fail it instead of resending it
        (docs/protocol.md §11: "do not resend that frame"). Any other too large for the
        broker fails the same way on a later close."""
        unanswered = [p for p in self._pending.values() if p.resend and not p.future.done()]
        if not unanswered:
            return
        largest = max(unanswered, key=lambda p: len(p.frame))
        size = len(largest.frame)
        largest.future.set_exception(
            TooLarge(
                f"{largest.op} frame is {size:,} bytes; the broker closed the connection "
                f"over it (1009, message too big) though it announced max_frame_bytes "
                f"{self.max_frame_bytes:,}"
            )
        )

    async def _read(self, ws: Socket) -> None:
        """Handle the broker's frames as the socket reads them, until it closes."""
        try:
            ws.attach(self._on_message)
            await ws.wait_closed()
        finally:
            ws.attach(None)
            # No reply can come on this socket any more: a hello or subscribe still
            # waiting must fail now (so that we reconnect), not at its request timeout.
            self._fail_unresent()

    def _on_message(self, message: str | bytes) -> None:
        """One frame from the broker: a push to ``on_push``, a reply to its request."""
        try:
            frame = decode(message)
        except WireError:
            log.error("the broker sent a frame that is not a JSON object; ignored")
            return
        if "push" in frame:
            if self.on_push is not None:
                try:
                    self.on_push(frame)
                except Exception:  # called from the socket's reading: must not break it
                    log.exception("handling a %r push failed", frame.get("push"))
            return
        rid = frame.get("rid")
        pending = self._pending.get(rid) if isinstance(rid, int) else None
        if pending is not None and not pending.future.done():
            pending.future.set_result(frame)
        elif not frame.get("ok", True):
            error = frame.get("error") or {}
            log.warning("the broker refused a request: %s", error.get("message"))

    # -- helpers --------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def _backoff(self, tries: int) -> float:
        """Equal jitter: half the exponential step, plus up to half again at random."""
        step = min(self.backoff_max_s, self.backoff_base_s * 2.0 ** min(tries - 1, 30))
        return step / 2 + self._rng.random() * step / 2

    def _expire(self) -> None:
        """Fail the requests whose time is up, then wait for the next oldest one's.

        One timer for all the requests in flight, not one each (an ``asyncio.timeout``
        per request was 7% of a busy publisher): requests wait in ``_pending`` in the
        order they were made, all for the same ``request_timeout``, so the first one
        still there is the next to run out.
        """
        self._expiry = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        pending = self._pending
        while pending:
            rid, first = next(iter(pending.items()))
            if first.deadline > now:
                self._expiry = loop.call_at(first.deadline, self._expire)
                return
            del pending[rid]
            if not first.future.done():
                first.future.set_exception(
                    ConnectionFailed(
                        f"{first.op}: no reply from {self._where()} within {self.request_timeout} s"
                    )
                )

    def _where(self) -> str:
        """The broker a request went to, for a message: the one connected to, or the URL
        (or URLs) it waits for."""
        if self._current is not None:
            return self._current
        return self.urls[0] if len(self.urls) == 1 else brokers(self.urls)

    def _fail_unresent(self) -> None:
        for pending in self._pending.values():
            if not pending.resend and not pending.future.done():
                pending.future.set_exception(_Lost())

    def _fail_all(self, exc: ConveyorError) -> None:
        self._fatal = exc
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(exc)

    async def close(self) -> None:
        """Stop reconnecting and close the socket (replies still due are lost).

        Returns once the socket is closed (the closing handshake done, or the connection
        dropped after the socket's close timeout) and ``run()`` is over, so the process
        may exit at once: the broker is not left to find a half-open connection.
        """
        self._closing = True
        self._wake.set()
        if self._connecting is not None:
            self._connecting.cancel()
        if self._socket is not None:
            await self._socket.close()
        if self._running:
            await self._ended.wait()


def split_to_fit(items: list[T], fits: Callable[[list[T]], bool]) -> list[tuple[int, list[T]]]:
    """``items`` cut into consecutive runs, each with the index it starts at: the whole
    when it ``fits``, else each half cut the same way. A run of one is given even when it
    does not fit, for the caller to refuse."""
    if len(items) <= 1 or fits(items):
        return [(0, items)]
    half = len(items) // 2
    tail = [(half + start, run) for start, run in split_to_fit(items[half:], fits)]
    return [*split_to_fit(items[:half], fits), *tail]


def _unnest(error: dict[str, Any], where: str) -> dict[str, Any]:
    """An ``enqueue_each`` entry's error as ``enqueue`` would give it: its field and
    message without the entry's path (``jobs[3].priority`` is the caller's ``priority``)."""
    field = error.get("field")
    message = error.get("message")
    if isinstance(field, str) and field.startswith(where):
        field = field[len(where) :]
    if isinstance(message, str) and message.startswith(where):
        message = message[len(where) :]
    return {**error, "field": field, "message": message}


def _answer_of(reply: dict[str, Any]) -> Any:
    """A request's successful reply; raises the ``ConveyorError`` a refusal carries."""
    if not reply.get("ok"):
        raise error_from_reply(reply.get("error") or {})
    return reply
