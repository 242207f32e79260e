"""The WebSocket server: connections in, frames decoded, handlers called, replies out.

Layers (docs/architecture.md): this module owns sockets and tasks; ``ops`` maps each
operation to the engine or the dispatcher; the engine decides. One event loop runs
everything; engine calls are synchronous and short, so a frame is handled to the end
without awaiting anything, and a connection never waits on another.

Each connection has a reader (this module's ``Connection.run``) and a writer task
draining a bounded outbox, so that pushing to a worker never awaits that worker: a
peer that stops reading fills its outbox and is dropped (close 1008), and its jobs
lapse after the disconnect grace like any dropped worker's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from typing import Any

import anyio
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.protocol import State

from sdk._socket import DirectReader, text_header, write_joined
from sdk._wire import (
    CLOSE_GOING_AWAY,
    CLOSE_POLICY_VIOLATION,
    CLOSE_TRY_AGAIN_LATER,
    HEALTHZ_PATH,
    METRICS_PATH,
    WS_PATH,
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

from . import __version__
from .admission import host_allowed
from .commit import CommitGate
from .config import Config
from .dispatch import Dispatcher, Subscription
from .engine import InvalidArgument, Queue, check_queue_name
from .feed import Feed, queue_info
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import Metrics
from .ops import HANDLERS
from .scheduler import LoopScheduler, Scheduler
from .static import StaticFiles
from .store import open_store

__all__ = ["Broker", "Connection", "running_broker"]

# An enum member as a module name: reading one off its class (``State.OPEN``) costs ~60 ns
# in Python 3.11, and this is read for every frame.
_OPEN = State.OPEN

log = logging.getLogger("conveyor")

# Frames handed to the socket in one write, at most (see Connection._write_some).
_WRITE_BATCH_BYTES = 256 * 1024

# Errors that count toward closing a peer that keeps sending garbage.
_GARBAGE = frozenset({ErrorCode.BAD_JSON, ErrorCode.BAD_FRAME, ErrorCode.UNKNOWN_OP})


class Broker:
    """The server's whole state: configuration, job table, dispatcher, connections."""

    def __init__(self, config: Config, *, scheduler: Scheduler | None = None) -> None:
        """Open the store and load the table (raises ``StoreError``); call in the loop.

        ``scheduler`` gives the broker its clock and timers (by default the running loop
        and the wall clock)."""
        self.config = config
        self.scheduler: Scheduler = LoopScheduler() if scheduler is None else scheduler
        self.clock = clock = self.scheduler.now
        self.store = open_store(config.store, config.db_path, sync=config.sync)
        self.table = self.store.load(
            clock=clock, rng=random.Random(), max_payload_bytes=config.max_payload_bytes
        )
        config.apply_queue_opts(self.table)
        self.dispatcher = Dispatcher(
            self.table, grace_s=config.disconnect_grace_s, scheduler=self.scheduler
        )
        # A durable store pushes whole windows: see Dispatcher._push.
        self.dispatcher.split_windows = not self.store.durable
        self.gate: CommitGate | None = None
        if self.store.durable:
            self.gate = CommitGate(
                self.table,
                self.store,
                before_flush=self.dispatcher.run_pending,
                on_failure=lambda exc: self.stopped.set(),
            )
            self.dispatcher.after_pass = self.gate.poke
        # A restart dropped every connection: jobs still under a valid lease get the
        # disconnect grace for their workers to re-attach them, then lapse (protocol §9).
        self.dispatcher.adopt(self.table.held_leases())
        # Set when the broker cannot go on (its store failed): the runner stops then.
        self.stopped = asyncio.Event()
        self.started_at = clock()
        self.feed = Feed(self.table, self.dispatcher, clock=clock, server_info=self.server_info)
        self.metrics = Metrics(
            self.table,
            workers=lambda: len(self.dispatcher.subscriptions),
            connections=lambda: len(self.connections),
        )
        self.dispatcher.push_latency = self.metrics.push_latency.observe_many
        self.static = StaticFiles()
        self.connections: set[Connection] = set()
        self.per_token: dict[str, int] = {}
        self.per_address: dict[str, int] = {}  # open connections by peer IP address
        self.closing: bool = False
        self.server: Server | None = None
        self.url: str = ""

    def server_info(self) -> dict[str, Any]:
        """The dashboard's header: who this broker is and how busy."""
        return {
            "version": __version__,
            "store": self.store.name,
            "started_at": self.started_at,
            "connections": len(self.connections),
        }

    # -- helpers for the handlers ---------------------------------------------------------

    @property
    def queue_names(self) -> list[str]:
        return self.table.queues()

    def queue(self, name: str, field: str = "queue") -> Queue:
        """The queue ``name`` (made on first use); ``invalid_argument`` for a bad name."""
        try:
            return self.table.queue(name)
        except InvalidArgument as exc:
            raise _bad_name(exc, field) from None

    def check_queue_name(self, name: str, field: str) -> None:
        """Raise ``invalid_argument`` naming ``field`` unless ``name`` is a valid queue name."""
        try:
            check_queue_name(name)
        except InvalidArgument as exc:
            raise _bad_name(exc, field) from None

    def queue_stats(self, name: str) -> dict[str, Any]:
        return queue_info(self.table.queue(name).stats())

    # -- HTTP side of the port ------------------------------------------------------------

    def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        """Answer plain HTTP paths, and refuse bad handshakes before they become sockets."""
        path = request.path.split("?", 1)[0]
        config = self.config
        for name in _SINGLE_HEADERS:
            if len(request.headers.get_all(name)) > 1:
                repeated = f"{name}: the header must not repeat\n".encode()
                return _response(HTTPStatus.BAD_REQUEST, repeated, "text/plain")
        if not host_allowed(
            request.headers.get("Host"), bind_host=config.host, allowed=config.allowed_hosts
        ):
            log.info("refused a request for host %r", request.headers.get("Host", "")[:200])
            return _response(HTTPStatus.FORBIDDEN, b"host not allowed\n", "text/plain")
        if path == HEALTHZ_PATH:
            status = HTTPStatus.SERVICE_UNAVAILABLE if self.closing else HTTPStatus.OK
            body = {"status": "draining" if self.closing else "ok", "version": __version__}
            return _response(status, encode(body), "application/json")
        if path == METRICS_PATH:
            refused = self._metrics_refusal(request.headers)
            if refused is not None:
                return refused
            return _response(HTTPStatus.OK, self.metrics.render(), METRICS_CONTENT_TYPE)
        if path != WS_PATH:
            found = self.static.get(path)
            if found is None:
                return _response(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8")
            content, content_type = found
            return _response(HTTPStatus.OK, content, content_type, static=True)
        if self.closing:
            return _response(HTTPStatus.SERVICE_UNAVAILABLE, b"shutting down\n", "text/plain")
        if "upgrade" not in ",".join(request.headers.get_all("Connection")).lower():
            return _response(
                HTTPStatus.UPGRADE_REQUIRED, b"this endpoint speaks WebSocket\n", "text/plain"
            )
        crowded = self._connection_refusal(connection)
        if crowded is not None:
            return crowded
        origin = request.headers.get("Origin")
        if origin is not None and not self._origin_allowed(origin, request.headers):
            log.info("refused a handshake from origin %r", origin[:200])
            return _response(HTTPStatus.FORBIDDEN, b"origin not allowed\n", "text/plain")
        token = _bearer(request.headers)
        if token is not None and self.config.tokens and self.config.roles_for(token) is None:
            return _response(HTTPStatus.UNAUTHORIZED, b"unknown token\n", "text/plain")
        return None

    def _metrics_refusal(self, headers: Headers) -> Response | None:
        """With tokens set, a scrape needs a bearer token with the read role (or admin)."""
        if not self.config.tokens:
            return None
        token = _bearer(headers)
        roles = self.config.roles_for(token) if token else None
        if not roles:
            response = _response(
                HTTPStatus.UNAUTHORIZED,
                b"a bearer token with the read role is required\n",
                "text/plain",
            )
            response.headers["WWW-Authenticate"] = 'Bearer realm="conveyor"'
            return response
        if Role.READ not in roles and Role.ADMIN not in roles:
            return _response(
                HTTPStatus.FORBIDDEN, b"this token lacks the read role\n", "text/plain"
            )
        return None

    def _connection_refusal(self, connection: ServerConnection) -> Response | None:
        """503 once the broker, or this peer's address, holds its most connections."""
        config = self.config
        if len(self.connections) >= config.max_connections:
            reason = f"at most {config.max_connections} connections\n"
        elif self.per_address.get(_address(connection), 0) >= config.max_connections_per_address:
            reason = f"at most {config.max_connections_per_address} connections per address\n"
        else:
            return None
        log.info("refused a connection: %s", reason.strip())
        response = _response(HTTPStatus.SERVICE_UNAVAILABLE, reason.encode(), "text/plain")
        response.headers["Retry-After"] = "5"
        return response

    def _origin_allowed(self, origin: str, headers: Headers) -> bool:
        if origin in self.config.origins:
            return True
        host = headers.get("Host")
        scheme = "https" if self.config.secure else "http"
        return host is not None and origin == f"{scheme}://{host}"

    # -- connections ----------------------------------------------------------------------

    async def handle(self, ws: ServerConnection) -> None:
        """The websockets handler: one connection, from open to close."""
        conn = Connection(self, ws)
        self.connections.add(conn)
        address = _address(ws)
        self.per_address[address] = self.per_address.get(address, 0) + 1
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)
            left = self.per_address[address] - 1
            if left:
                self.per_address[address] = left
            else:
                del self.per_address[address]
            conn.release()


# Headers whose meaning is one value: a second copy (a request smuggled past a proxy, or
# a probe) is refused rather than guessed at.
_SINGLE_HEADERS = ("Host", "Origin", "Authorization")


def _address(ws: ServerConnection) -> str:
    """The peer's IP address (the per-address limit's key)."""
    peer = ws.remote_address
    return str(peer[0]) if isinstance(peer, tuple) and peer else str(peer)


def _bad_name(exc: InvalidArgument, field: str) -> WireError:
    """The engine's refusal of a queue name, as the peer's field ``field`` names it."""
    return WireError(ErrorCode.INVALID_ARGUMENT, f"{field}: {exc.problem}", field)


def _response(
    status: HTTPStatus, body: bytes, content_type: str, *, static: bool = False
) -> Response:
    headers = Headers(
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            # Dashboard files revalidate on every load (an upgrade shows at once); the rest
            # is live data, never cached.
            ("Cache-Control", "no-cache" if static else "no-store"),
            ("X-Content-Type-Options", "nosniff"),
        ]
    )
    if static:
        headers["Content-Security-Policy"] = _CSP
        headers["X-Frame-Options"] = "DENY"
    return Response(status.value, status.phrase, headers, body)


# The dashboard loads only its own files and talks only to its own broker.
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


def _bearer(headers: Headers) -> str | None:
    value = headers.get("Authorization")
    if value is None:
        return None
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else ""


class _Socket(DirectReader, ServerConnection):
    """websockets' server connection, with two shortcuts on the hot path.

    Writing: each batch of frames goes out in one piece (``send_data``,
    ``write_text_frames``). Reading: each data message goes straight to the connection's
    handler (``DirectReader``, shared with the SDK's end: see ``sdk/_socket.py``).
    """

    FROM_CLIENTS = True

    def handshaken(self) -> bool:
        return self.request is not None

    def send_data(self) -> None:
        write_joined(self.protocol, self.transport)

    def write_text_frames(self, outbox: deque[bytes], limit: int) -> int:
        """Frame texts from the left of ``outbox`` (about ``limit`` bytes of them, at least
        one) and write them in one piece; return the bytes of text taken. Call only while
        the connection is open.

        The frames are a server's: unfragmented, unmasked (``text_header``). Anything
        websockets itself queued (a pong) is written first, so frames stay in the order
        they were made.
        """
        if self.protocol.writes:
            self.send_data()
        parts: list[bytes] = []
        size = 0
        while outbox and size < limit:
            data = outbox.popleft()
            parts.append(text_header(len(data)))
            parts.append(data)
            size += len(data)
        self.transport.write(b"".join(parts))
        return size


class Connection:
    """One WebSocket connection: its roles, its subscription, its outbox."""

    def __init__(self, broker: Broker, ws: ServerConnection) -> None:
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
        self.connected_at = broker.clock()
        self.last_seen_at = self.connected_at
        # Reading pauses while this many frames wait in the outbox (see _on_message).
        self._high_water = max(1, broker.config.max_outbox_frames // 2)
        # A close to start once the error reply of the frame being handled is queued.
        self._close_after_reply: tuple[int, str] | None = None
        config = broker.config
        header_token = _bearer(ws.request.headers) if ws.request is not None else None
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
        per_token = self.broker.per_token
        if self.token is not None and self.token != token:
            per_token[self.token] -= 1
            self.token = None
        if self.token is None:
            if per_token.get(token, 0) >= config.max_connections_per_token:
                self._close_after_reply = (
                    CLOSE_TRY_AGAIN_LATER,
                    "too many connections for this token",
                )
                raise WireError(
                    ErrorCode.LIMIT_EXCEEDED,
                    f"token: at most {config.max_connections_per_token} connections per token",
                    "token",
                )
            per_token[token] = per_token.get(token, 0) + 1
            self.token = token
        self.roles = roles

    # -- sending --------------------------------------------------------------------------

    def send(self, frame: dict[str, Any]) -> None:
        """Queue one frame for the writer; never blocks. Drops a peer that stopped reading.

        With a durable store the frame first waits in the commit gate until the changes
        made before it are on disk.
        """
        if self._closing:
            return
        gate = self.broker.gate
        if gate is None:
            self._deliver(encode(frame))
        else:
            gate.hold(self._deliver_held, self._count(encode(frame)))

    def send_early(self, frame: dict[str, Any]) -> None:
        """Like ``send``, for a ``jobs`` push whose claims may leave once they are written,
        before the fsync (see ``broker/commit.py``). Until this connection's ``subscribe``
        is answered its pushes wait like any frame, so that the reply comes first."""
        gate = self.broker.gate
        if gate is None or not self._early_pushes:
            self.send(frame)
        elif not self._closing:
            gate.hold_early(self._deliver_held, self._count(encode(frame)), self.flush_now)

    def _deliver_subscribed(self, data: bytes) -> None:
        # The reply to subscribe: from now on this connection's pushes may leave early.
        self._deliver_held(data)
        self._early_pushes = True

    def push_now(self, frame: dict[str, Any]) -> None:
        """Queue a frame that confirms nothing (a dashboard snapshot): no commit wait."""
        self._deliver(encode(frame))

    @property
    def caught_up(self) -> bool:
        """Whether every frame queued so far has gone to the socket."""
        return not self._outbox and not self._closing

    @property
    def unsent_bytes(self) -> int:
        """Bytes of frames for this peer not yet on the wire: queued here, or handed to
        the socket's transport and not yet taken by the kernel."""
        ws = self.ws
        return self._unsent + ws.transport.get_write_buffer_size()

    @property
    def reading_held(self) -> bool:
        """Whether reading waits until what is unsent has gone out (see ``_on_message``)."""
        ws = self.ws
        assert isinstance(ws, _Socket)
        return ws.holding

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
        ws = self.ws
        assert isinstance(ws, _Socket)
        ws.release()  # reading again, if it was held
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
        assert isinstance(ws, _Socket)
        outbox = self._outbox
        while outbox:
            if (
                self._closing
                or ws.paused
                or ws.protocol.state is not _OPEN
                or ws.transport.is_closing()
            ):
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
        gate = self.broker.gate
        if gate is None:
            self._begin_close(code, reason)
        else:
            gate.hold(lambda _: self._begin_close(code, reason), b"")

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
            ws.transport.abort()
        except ConnectionClosed:
            pass
        finally:
            scope.cancel()  # the reader and the authentication deadline end too

    @staticmethod
    async def _write_some(ws: ServerConnection, outbox: deque[bytes], bound: float) -> int:
        """Frame a batch of queued frames and hand them to the socket in one write.

        This is ``send_context`` (websockets' documented way to write through its protocol
        object) unrolled for the case that matters: the connection is open and the socket
        takes the bytes, so nothing is awaited and no timer is armed. Only when the
        transport pushes back (the peer reads slower than we write) does it wait, for at
        most ``bound`` seconds (then ``TimeoutError``). A connection that is no longer open
        takes the documented path, which waits for the close and raises
        ``ConnectionClosed``. The batch is bounded so that a slow peer's unsent bytes stay
        bounded too; one write per batch instead of per frame is most of what many small
        replies cost. Returns the bytes of text taken from ``outbox``.
        """
        protocol = ws.protocol
        if protocol.state is not _OPEN or ws.transport.is_closing():
            with anyio.fail_after(bound):
                async with ws.send_context():
                    pass
            return 0
        assert isinstance(ws, _Socket)
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
        assert isinstance(ws, _Socket)
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
        if len(self._outbox) >= self._high_water or self._unsent >= self._max_unsent:
            ws = self.ws
            assert isinstance(ws, _Socket)
            ws.hold()

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
                raise WireError(code, f"op: this connection {verb} call {spec.op.value!r}", "op")
            if self.broker.closing:
                raise WireError(ErrorCode.UNAVAILABLE, "the broker is shutting down")
            fields = validate_fields(spec, frame, rid=rid, max_batch=self.broker.config.max_batch)
            result = HANDLERS[spec.op](self, fields)
        except WireError as exc:
            if exc.rid is None:
                exc.rid = rid
            self._refuse(exc)
            return
        except InvalidArgument as exc:
            self._refuse(WireError(ErrorCode(exc.code), str(exc), exc.field, rid=rid))
            return
        except Exception:
            # Our bug, not the peer's: log it whole, tell the peer nothing but "internal".
            log.exception("internal error handling a frame")
            self._refuse(WireError(ErrorCode.INTERNAL, "internal error", rid=rid))
            return
        self._bad_in_a_row = 0
        if spec.op is Op.SUBSCRIBE:
            self._answer_subscribe(rid, result)
        elif rid is not None:
            self.send(ok_reply(rid, result))
        elif self.broker.gate is not None:
            self.broker.gate.poke()  # a fire-and-forget change still gets committed

    def _answer_subscribe(self, rid: Any, result: dict[str, Any] | None) -> None:
        gate = self.broker.gate
        if rid is None:
            self._early_pushes = True  # no reply to come first
            if gate is not None:
                gate.poke()
        elif gate is None or self._closing:
            self.send(ok_reply(rid, result))
        else:
            gate.hold(self._deliver_subscribed, self._count(encode(ok_reply(rid, result))))

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
        if self.subscription is not None:
            self.broker.dispatcher.unsubscribe(self.subscription)
            self.subscription = None
        if self.token is not None:
            self.broker.per_token[self.token] -= 1
            self.token = None


def _ssl_context(config: Config) -> ssl.SSLContext | None:
    if config.tls_cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(config.tls_cert, config.tls_key)
    return context


@contextlib.asynccontextmanager
async def running_broker(config: Config) -> AsyncIterator[Broker]:
    """Start a broker, yield it (``.url`` is the real address), stop it on exit."""
    broker = Broker(config)
    server = await serve(
        broker.handle,
        config.host,
        config.port,
        process_request=broker.process_request,
        compression=None,
        ping_interval=config.ping_interval_s,
        ping_timeout=config.ping_timeout_s,
        open_timeout=config.handshake_timeout_s,
        max_size=config.max_frame_bytes,
        ssl=_ssl_context(config),
        server_header=f"conveyor/{__version__}",
        create_connection=_Socket,
    )
    broker.server = server
    sock = next(iter(server.sockets))
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    broker.url = f"{'wss' if config.secure else 'ws'}://{shown}:{port}{WS_PATH}"
    sweeper = asyncio.get_running_loop().create_task(_sweep_forever(broker))
    feed = asyncio.get_running_loop().create_task(broker.feed.run())
    try:
        yield broker
    finally:
        broker.closing = True
        sweeper.cancel()
        feed.cancel()
        if broker.gate is not None:
            await broker.gate.drain()  # answered work is on disk before anyone is told "bye"
        server.close(close_connections=True, code=CLOSE_GOING_AWAY, reason="broker shutting down")
        await server.wait_closed()
        broker.dispatcher.close()
        for task in (sweeper, feed):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if broker.gate is not None:
            # Closing the connections changed the table too (with no disconnect grace,
            # their jobs lapsed): commit that before the store closes.
            await broker.gate.drain()
        broker.store.close()


async def _sweep_forever(broker: Broker) -> None:
    while True:
        await asyncio.sleep(broker.config.sweep_interval_s)
        try:
            broker.dispatcher.sweep()
            broker.dispatcher.kick()
        except Exception:
            log.exception("sweep failed")


async def serve_until_signalled(config: Config, ready: Callable[[Broker], None]) -> None:
    """Run a broker until SIGTERM or SIGINT, calling ``ready`` once it listens."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with running_broker(config) as broker:
        ready(broker)
        stopped = asyncio.ensure_future(broker.stopped.wait())
        signalled = asyncio.ensure_future(stop.wait())
        await asyncio.wait({stopped, signalled}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        signalled.cancel()
        log.info("conveyor stopping")
