"""One WebSocket connection: its roles, its outbox and writer, its frames handled.

Each connection has a reader (``Connection.run``: frames arrive through ``_on_message``,
called by the socket as they are parsed) and a writer task draining an outbox bounded in
frames and in unsent bytes, so that pushing to a worker never awaits that worker: a
peer that stops reading is no longer read, gets no more pushes, and is dropped once its
socket takes nothing for ``ping_timeout_s``; its jobs lapse after the disconnect grace
like any dropped worker's.

What a connection needs of the broker is the ``Hub`` below; the broker (``server``)
provides it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import anyio
from websockets.exceptions import ConnectionClosed

from ..sdk._wire import (
    CLOSE_POLICY_VIOLATION,
    CLOSE_TRY_AGAIN_LATER,
    ErrorCode,
    Op,
    Role,
    WireError,
    binary_frame_error,
    decode,
    encode,
    ok_reply,
    parse_envelope,
    validate_fields,
)
from .auth import TokenSlots, bearer
from .backend import Pending
from .config import Config
from .dispatch import Dispatcher, Subscription
from .egress import Gate, Out, Wait, wait_for
from .engine import InvalidArgument
from .feed import Feed
from .ops import HANDLERS, Result, WaitFor, WatchJob
from .ops import Broker as OpsBroker
from .scheduler import Scheduler
from .store import StoreError
from .transport import Socket
from .waits import Waits
from .watches import Watches

__all__ = ["Connection", "Hub", "Socket"]

log = logging.getLogger("conveyor")

# Frames handed to the socket in one write, at most (see Connection._write_some).
_WRITE_BATCH_BYTES = 256 * 1024

# A place in a connection's order of frames, for a reply still to come: what to do when
# its turn comes (queue its frame), or ``None`` until its result is there.
_Slot = list[Callable[[], None] | None]

# Errors that count toward closing a peer that keeps sending garbage.
_GARBAGE = frozenset({ErrorCode.BAD_JSON, ErrorCode.BAD_FRAME, ErrorCode.UNKNOWN_OP})


class Hub(OpsBroker, Protocol):
    """What a connection uses of the broker: the handlers' view of it, and more."""

    config: Config
    clock: Callable[[], float]
    dispatcher: Dispatcher
    feed: Feed
    closing: bool
    tokens: TokenSlots
    scheduler: Scheduler


class Connection:
    """One WebSocket connection: its roles, its subscription, its outbox."""

    def __init__(self, broker: Hub, ws: Socket) -> None:
        self.broker = broker
        self.ws = ws
        self.hello_done = False
        self.client: str | None = None
        self.token: str | None = None
        self.subscription: Subscription | None = None
        self._outbox: deque[bytes] = deque()
        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._flush_soon = False
        self._early_pushes = False  # see send_early
        self._bad_in_a_row = 0
        # Set by close_soon: nothing more is read; what was answered still goes out.
        self._ending = False
        # Set once every frame before the close is queued: the writer closes after them.
        self._closing = False
        # Bytes queued in the outbox and not yet handed to the socket.
        self._unsent = 0
        self._max_unsent = broker.config.max_unsent_bytes
        # Where frames wait (broker/egress.py): the backend's gate (a durable store's
        # commit gate, or IMMEDIATE).
        self._gate: Gate = broker.backend.gate
        self.connected_at = broker.clock()
        self.last_seen_at = self.connected_at
        # Reading pauses while this many frames wait in the outbox (see _on_message).
        self._high_water = max(1, broker.config.max_outbox_frames // 2)
        # A close to start once the error reply of the frame being handled is queued.
        self._close_after_reply: tuple[int, str] | None = None
        # Replies still to come (a backend that answers later), oldest first, and every
        # frame made after the oldest of them: frames leave in the order they were made.
        self._later: deque[_Slot] = deque()
        self._releasing = False
        # The waits of ``wait`` requests: answered on their own, out of order.
        self.waits = Waits(broker.backend, broker.scheduler, self.send)
        # The jobs watched by ``watch_job``: their events pushed as they come.
        self.watches = Watches(
            broker.backend,
            broker.scheduler,
            self.send,
            lambda frame: self.emit(Out.NOTICE, frame),
            lambda: self.unsent_bytes,
        )
        config = broker.config
        header_token = bearer(ws.request.headers) if ws.request is not None else None
        self.roles: frozenset[Role] = frozenset()
        if not config.tokens:
            self.roles = frozenset(Role)
        elif header_token:
            try:
                self._take_token(header_token)
            except WireError:  # over the per-token limit: no reply to give, just close
                assert self._close_after_reply is not None
                self.close_soon(*self._close_after_reply)

    # -- authentication -------------------------------------------------------------------

    def authenticate(self, token: str | None) -> None:
        """``hello``'s token: grant its roles, or raise ``unauthorized``/``limit_exceeded``."""
        config = self.broker.config
        if not config.tokens:
            return  # open broker: a token sent anyway is ignored
        if token is None:
            if self.token is not None:
                return  # the header already authenticated this connection
            raise WireError(ErrorCode.UNAUTHORIZED, "token: this broker needs a token", "token")
        if config.roles_for(token) is None:
            self._close_after_reply = (CLOSE_POLICY_VIOLATION, "unknown token")
            raise WireError(ErrorCode.UNAUTHORIZED, "token: unknown token", "token")
        self._take_token(token)

    def _take_token(self, token: str) -> None:
        config = self.broker.config
        roles = config.roles_for(token)
        assert roles is not None
        tokens = self.broker.tokens
        if self.token is not None and self.token != token:
            tokens.release(self.token)
            self.token = None
        if self.token is None:
            try:
                tokens.take(token)
            except WireError:
                self._close_after_reply = (
                    CLOSE_TRY_AGAIN_LATER,
                    "too many connections for this token",
                )
                raise
            self.token = token
        self.roles = roles

    # -- sending --------------------------------------------------------------------------

    def emit(self, out: Out, frame: dict[str, Any]) -> None:
        """Queue ``frame`` for the writer once what it waits for is met (``egress``: the
        one table of waits); never blocks. Drops a peer that stopped reading."""
        if self._closing:
            return
        if self._later and not self._releasing:
            self._later.append([lambda: self.emit(out, frame)])  # behind a reply to come
            return
        data = encode(frame)
        wait = wait_for(out, self._early_pushes)
        if wait is Wait.NOTHING:
            self._deliver(data)
            return
        deliver = self._deliver_subscribed if out is Out.SUBSCRIBED else self._deliver_held
        if wait is Wait.WRITTEN:
            self._gate.hold_early(deliver, self._count(data), self.flush_now)
        else:
            self._gate.hold(deliver, self._count(data))

    def send(self, frame: dict[str, Any]) -> None:
        """``emit`` a reply: it leaves once what changed before it is durable."""
        self.emit(Out.REPLY, frame)

    def push_now(self, frame: dict[str, Any]) -> None:
        """``emit`` a frame that confirms nothing (a dashboard snapshot)."""
        self.emit(Out.SNAPSHOT, frame)

    def _deliver_subscribed(self, data: bytes) -> None:
        # The reply to subscribe: from now on this connection's pushes may leave early.
        self._deliver_held(data)
        self._early_pushes = True

    @property
    def caught_up(self) -> bool:
        """Whether every frame queued so far has gone to the socket."""
        return not self._outbox and not self._closing

    @property
    def unsent_bytes(self) -> int:
        """Bytes of frames for this peer not yet on the wire: queued here, or handed to
        the socket's transport and not yet taken by the kernel."""
        return self._unsent + self.ws.write_buffer_size

    @property
    def reading_held(self) -> bool:
        """Whether reading waits until what is unsent has gone out (see ``_on_message``)."""
        return self.ws.holding

    def _count(self, data: bytes) -> bytes:
        """Count ``data`` as unsent from now on (held in the commit gate counts too)."""
        self._unsent += len(data)
        if self._unsent >= self._max_unsent:
            # Bounded in bytes: reading pauses (_on_message) and the dispatcher pushes
            # nothing more here until the socket has taken these bytes.
            sub = self.subscription
            if sub is not None and not sub.congested:
                self.broker.dispatcher.congested(sub, True)
        return data

    def _deliver(self, data: bytes) -> None:
        """Queue ``data`` for the writer now."""
        if not self._closing:
            self._deliver_held(self._count(data))

    def _deliver_held(self, data: bytes) -> None:
        """Queue ``data``, counted when it went into the commit gate, for the writer."""
        if self._closing:
            return
        self._outbox.append(data)
        if not self._flush_soon:
            self._flush_soon = True
            self._loop.call_soon(self.flush_now)
        if len(self._outbox) > self.broker.config.max_outbox_frames:
            self._drop("too slow: not reading its frames")

    def _drop(self, reason: str) -> None:
        """Forget what is queued and close 1008 now: the peer does not keep up."""
        self._outbox.clear()
        self._unsent = 0
        self._ending = True
        self._begin_close(CLOSE_POLICY_VIOLATION, reason)

    def _drained(self) -> None:
        """Everything queued has gone to the socket and the socket takes more."""
        if self._unsent >= self._max_unsent:
            return  # still held in the commit gate: its release calls this again
        if len(self._later) >= self._high_water:
            return  # replies still to come: their release calls this again
        self.ws.release()  # reading again, if it was held
        sub = self.subscription
        if sub is not None and sub.congested:
            self.broker.dispatcher.congested(sub, False)

    def flush_now(self) -> None:
        """Write what is queued now, if it was not written yet (see ``_flush``)."""
        if self._flush_soon:
            self._flush()

    def _flush(self) -> None:
        """Write the outbox, once per loop iteration however many frames were queued in it.

        This is the path while the socket takes every byte: no task switch, no await.
        When it pushes back (a peer reading slower than we write), or the connection is
        closing or no longer open, the writer task takes over: it waits for the socket,
        at most ``ping_timeout_s``, and closes.
        """
        self._flush_soon = False
        ws = self.ws
        outbox = self._outbox
        while outbox:
            if self._closing or not ws.writable:
                self._wake.set()
                return
            self._unsent -= ws.write_text_frames(outbox, _WRITE_BATCH_BYTES)
        if ws.paused:
            self._wake.set()  # the writer task watches the socket drain
        else:
            self._drained()

    def close_soon(self, code: int, reason: str) -> None:
        """Read nothing more, and close once every frame answered so far is out.

        With a durable store the replies before the close may still wait in the commit
        gate: the close waits behind them there, so a peer closed for bad frames still
        gets every reply (and every error) sent before the close frame.
        """
        if self._ending:
            return
        self._ending = True
        assert wait_for(Out.CLOSE, self._early_pushes) is Wait.DURABLE
        if self._later and not self._releasing:  # behind the replies still to come
            self._later.append([lambda: self._hold_close(code, reason)])
        else:
            self._hold_close(code, reason)

    def _hold_close(self, code: int, reason: str) -> None:
        self._gate.hold(lambda _: self._begin_close(code, reason), b"")

    def _begin_close(self, code: int, reason: str) -> None:
        """Queue nothing more; the writer sends what is queued, then the close frame."""
        if self._closing:
            return
        self._closing = True
        self._close_code = code
        self._close_reason = reason
        self._wake.set()

    async def _writer(self, scope: anyio.CancelScope) -> None:
        """Write the outbox in order, then close when asked; the connection ends with it."""
        ws = self.ws
        outbox = self._outbox
        # A peer that takes no bytes for this long is as dead as one that misses a pong,
        # and no close frame can reach it either: its connection is cut instead.
        bound = self.broker.config.ping_timeout_s
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                while outbox:
                    taken = await self._write_some(ws, outbox, bound)
                    self._unsent -= taken  # (not ``-= await``: it would read before)
                if ws.paused:
                    with anyio.fail_after(bound):
                        await ws.drain()
                self._drained()
                if self._closing:
                    with anyio.fail_after(bound):
                        await ws.close(self._close_code, self._close_reason)
                    return
        except TimeoutError:
            log.info("dropped a connection that stopped reading its frames")
            ws.abort()
        except ConnectionClosed:
            pass
        finally:
            scope.cancel()  # the reader and the authentication deadline end too

    @staticmethod
    async def _write_some(ws: Socket, outbox: deque[bytes], bound: float) -> int:
        """Frame a batch of queued frames and hand them to the socket in one write.

        While the connection is open and the socket takes the bytes, nothing is awaited
        and no timer is armed. Only when the transport pushes back (the peer reads slower
        than we write) does it wait, for at most ``bound`` seconds (then
        ``TimeoutError``). A connection that is no longer open is waited on until it is
        closed, as long (``TimeoutError`` past it), then ``ConnectionClosed`` is raised.
        The batch is bounded so that a slow peer's unsent bytes stay bounded too; one
        write per batch instead of per frame is most of what many small replies cost.
        Returns the bytes of text taken from ``outbox``.
        """
        if not ws.open:
            with anyio.fail_after(bound):
                await ws.wait_closed()
            raise ws.closed_error()
        taken = ws.write_text_frames(outbox, _WRITE_BATCH_BYTES)
        if ws.paused:
            with anyio.fail_after(bound):
                await ws.drain()
        return taken

    # -- receiving ------------------------------------------------------------------------

    async def run(self) -> None:
        """Handle the peer's frames until it goes; the writer runs beside it.

        Frames arrive through ``_on_message``, called by the socket as they are parsed;
        this only waits for the connection to end.
        """
        ws = self.ws
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._writer, tg.cancel_scope)
            if self.broker.config.tokens and not self.roles:
                tg.start_soon(self._auth_deadline)
            try:
                ws.attach(self._on_message)
                await ws.wait_closed()
            finally:
                ws.attach(None)
                if not self._closing:
                    tg.cancel_scope.cancel()

    def _on_message(self, message: str | bytes) -> None:
        if self._ending:
            return  # the writer sends what is answered and closes; nothing more is read
        self.handle_frame(message)
        # Replies waiting beyond this stop the reading until they are written, so a peer
        # that pipelines requests is slowed by TCP flow control, not dropped as slow. The
        # requests already read (one read can hold thousands) wait too: handled now, their
        # replies alone could overflow the outbox, or fill memory (a pipelined get_job
        # of a large job is a large reply from a small request).
        if (
            len(self._outbox) >= self._high_water
            or self._unsent >= self._max_unsent
            or len(self._later) >= self._high_water
        ):
            self.ws.hold()

    async def _auth_deadline(self) -> None:
        await anyio.sleep(self.broker.config.handshake_timeout_s)
        if not self.roles:
            self.close_soon(CLOSE_POLICY_VIOLATION, "no token given in time")

    def handle_frame(self, message: str | bytes) -> None:
        """Decode, check, call the handler, queue the reply. Never raises."""
        rid = None
        self.last_seen_at = self.broker.clock()
        try:
            if isinstance(message, bytes):
                raise binary_frame_error()
            frame = decode(message)
            spec, rid = parse_envelope(frame)
            if not spec.allows(self.roles):
                code = ErrorCode.FORBIDDEN if self.roles else ErrorCode.UNAUTHORIZED
                verb = "may not" if self.roles else "must authenticate to"
                raise WireError(
                    code,
                    f"op: this connection {verb} call {spec.op.value!r}: it needs {spec.needs()}",
                    "op",
                )
            if self.broker.closing:
                raise WireError(ErrorCode.UNAVAILABLE, "the broker is shutting down")
            fields = validate_fields(spec, frame, rid=rid, max_batch=self.broker.config.max_batch)
            reply = HANDLERS[spec.op](self, fields)
            if reply is None or isinstance(reply, dict):
                result = reply
            elif isinstance(reply, WaitFor):
                self._bad_in_a_row = 0
                if rid is not None:  # (no rid: no reply to give, nothing to wait for)
                    self.waits.start(rid, reply.id, reply.timeout_s)
                return
            elif isinstance(reply, WatchJob):
                self._bad_in_a_row = 0
                self.watches.start(rid, reply.id)
                return
            elif reply.done():
                result = reply.result()
            else:
                self._answer_later(spec.op, rid, reply)
                return
        except Exception as exc:
            self._refuse(_wire_error(exc, rid))
            return
        self._answered(spec.op, rid, result)

    def _answered(self, op: Op, rid: Any, result: Result) -> None:
        self._bad_in_a_row = 0
        if op is Op.SUBSCRIBE:
            self._answer_subscribe(rid, result)
        elif rid is not None:
            self.send(ok_reply(rid, result))
        else:
            self._gate.poke()  # a fire-and-forget change still gets committed

    def _answer_later(self, op: Op, rid: Any, reply: Pending[Result]) -> None:
        """Keep this reply's place: it, and every frame made after it, leave once its
        result has come (the backend answers calls in the order they were made)."""
        slot: _Slot = [None]
        self._later.append(slot)

        def done(came: Pending[Result]) -> None:
            try:
                result = came.result()
            except BaseException as exc:
                error = _wire_error(exc, rid)
                slot[0] = lambda: self._refuse(error)
            else:
                slot[0] = lambda: self._answered(op, rid, result)
            self._release_later()

        reply.add_done_callback(done)

    def _release_later(self) -> None:
        """Queue the frames whose turn has come: those up to the first reply to come."""
        later = self._later
        if self._releasing:
            return  # (a frame queued in the loop below came back here)
        self._releasing = True
        try:
            while later:
                then = later[0][0]
                if then is None:
                    break
                later.popleft()
                then()
        finally:
            self._releasing = False
        if self.ws.holding and not self._outbox and len(later) < self._high_water:
            self._drained()  # nothing more was queued: reading again, if it waited on these

    def _answer_subscribe(self, rid: Any, result: dict[str, Any] | None) -> None:
        if rid is None:
            self._early_pushes = True  # no reply to come first
            self._gate.poke()
        else:
            self.emit(Out.SUBSCRIBED, ok_reply(rid, result))

    def _refuse(self, exc: WireError) -> None:
        self.send(exc.reply())
        if self._close_after_reply is not None:
            self.close_soon(*self._close_after_reply)
        if exc.code in _GARBAGE:
            self._bad_in_a_row += 1
            if self._bad_in_a_row >= self.broker.config.max_bad_frames:
                self.close_soon(CLOSE_POLICY_VIOLATION, "too many bad frames")
        else:
            self._bad_in_a_row = 0

    def release(self) -> None:
        """The connection is over: its subscription ends, its token slot frees."""
        self._closing = True
        self._ending = True
        self.broker.feed.forget(self)
        self.waits.close()
        self.watches.close()
        if self.subscription is not None:
            self.broker.dispatcher.unsubscribe(self.subscription)
            self.subscription = None
        if self.token is not None:
            self.broker.tokens.release(self.token)
            self.token = None


def _wire_error(exc: BaseException, rid: Any) -> WireError:
    """The error reply for what handling a request raised."""
    if isinstance(exc, WireError):
        if exc.rid is None:
            exc.rid = rid
        return exc
    if isinstance(exc, InvalidArgument):
        return WireError(ErrorCode(exc.code), str(exc), exc.field, rid=rid)
    if isinstance(exc, StoreError):
        # The job table cannot answer now (its database is unreachable): nothing is
        # confirmed that did not happen, and the peer may try again.
        log.warning("a request failed: %s", exc)
        return WireError(ErrorCode.UNAVAILABLE, "the job table is unavailable; try again", rid=rid)
    # Our bug, not the peer's: log it whole, tell the peer nothing but "internal".
    log.error("internal error handling a frame", exc_info=exc)
    return WireError(ErrorCode.INTERNAL, "internal error", rid=rid)
