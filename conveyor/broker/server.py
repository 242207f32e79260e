"""The broker: the job table, the dispatcher, the commit gate and the connections, wired
once, and the server that runs them.

Layers (docs/architecture.md): ``http`` answers the port's plain HTTP and admits
handshakes; ``connection`` owns each socket, its outbox and its frames; ``ops`` maps each
operation to the engine or the dispatcher; the engine decides. One event loop runs
everything; engine calls are synchronous and short, so a frame is handled to the end
without awaiting anything, and a connection never waits on another.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from websockets.http11 import Request, Response

from ..sdk._wire import CLOSE_GOING_AWAY, WS_PATH, ErrorCode, WireError
from . import __version__
from .auth import TokenSlots
from .backend import Backend, LocalBackend, database_scheduler, open_backend, ready
from .config import Config, ConfigError
from .connection import Connection
from .dispatch import Dispatcher
from .engine import InvalidArgument, QueueStats, check_queue_name
from .feed import Feed
from .http import address, route
from .metrics import Metrics
from .scheduler import LoopScheduler, Scheduler
from .static import StaticFiles
from .store import StoreError
from .transport import Server, Socket, serve

__all__ = ["Broker", "running_broker", "serve_until_signalled"]

log = logging.getLogger("conveyor")


class Broker:
    """The server's whole state: configuration, job table, dispatcher, connections."""

    def __init__(
        self, config: Config, backend: Backend, scheduler: Scheduler, stopped: asyncio.Event
    ) -> None:
        """Use ``open``: this takes the backend it opened."""
        self.config = config
        self.scheduler = scheduler
        self.clock = clock = scheduler.now
        # Set when the broker cannot go on (its store failed): the runner stops then.
        self.stopped = stopped
        self.backend = backend
        self._owned_scheduler: Scheduler | None = None  # (made by ``open``: closed by ``close``)
        self.dispatcher = Dispatcher(
            backend, grace_s=config.disconnect_grace_s, scheduler=scheduler
        )
        # A durable store pushes whole windows: see Dispatcher._push.
        self.dispatcher.split_windows = not backend.durable
        if isinstance(backend, LocalBackend):
            # A dispatch pass due this loop turn runs first, so its pushes ride the commit.
            backend.before_commit = self.dispatcher.run_pending
        self.started_at = clock()
        self.feed = Feed(backend, self.dispatcher, clock=clock, server_info=self.server_info)
        self.metrics = Metrics(
            self._stats_now,
            workers=lambda: len(self.dispatcher.subscriptions),
            connections=lambda: len(self.connections),
            now=clock,
        )
        self.dispatcher.push_latency = self.metrics.push_latency.observe_many
        self.dispatcher.job_duration = self.metrics.job_duration.observe
        self.static = StaticFiles()
        self.connections: set[Connection] = set()
        self.tokens = TokenSlots(config.max_connections_per_token)
        self.per_address: dict[str, int] = {}  # open connections by peer IP address
        self.closing: bool = False
        self.server: Server | None = None
        self.url: str = ""

    @classmethod
    async def open(cls, config: Config, *, scheduler: Scheduler | None = None) -> Broker:
        """Open the backend and load or reach the table (raises ``StoreError``).

        ``scheduler`` gives the broker its clock and timers (by default the running loop
        and the wall clock; tests pass a ``SteppedScheduler``)."""
        owned: Scheduler | None = None
        if scheduler is None:
            scheduler = LoopScheduler()
            if config.store == "postgres":
                # Brokers on one database keep its time, whatever their hosts' clocks say.
                scheduler = owned = await database_scheduler(config.db_path, scheduler)
        stopped = asyncio.Event()
        try:
            backend = await open_backend(
                config.store,
                config.db_path,
                scheduler,
                max_payload_bytes=config.max_payload_bytes,
                sync=config.sync,
                accept_loss=config.accept_loss,
                on_failure=lambda exc: stopped.set(),
            )
        except BaseException:
            await _close_scheduler(owned)
            raise
        try:
            for name, opts in config.queue_opts.items():
                await backend.set_queue(name, opts)
            for name, limits in config.queue_limits.items():
                await backend.set_limits(name, limits)
            for schedule_id, spec in config.schedules.items():
                if schedule_id not in config.schedules_pausing:
                    # The file says nothing of pausing: a pause or resume made at run
                    # time stands, as the rest of the schedule's progress does (SCH-5).
                    held = await backend.schedules(ids=[schedule_id])
                    if held:
                        spec = replace(spec, paused=held[0].spec.paused)
                try:
                    await backend.set_schedule(spec)
                except InvalidArgument as exc:  # (checked at load; the table's last word)
                    raise ConfigError(
                        f"{config.queues_file}: [schedules.{schedule_id}] {exc}"
                    ) from None
            broker = cls(config, backend, scheduler, stopped)
            broker._owned_scheduler = owned
            if not backend.shared:
                # A restart dropped every connection: jobs still under a valid lease get
                # the disconnect grace for their workers to re-attach them, then lapse
                # (protocol §9). (A shared table's leases are other brokers' too.)
                broker.dispatcher.adopt(await backend.held_leases())
        except BaseException:
            await backend.close()
            await _close_scheduler(owned)
            raise
        return broker

    async def close(self) -> None:
        """Close the backend (it commits what is left) and the clock this broker made."""
        await self.backend.close()
        await _close_scheduler(self._owned_scheduler)

    def _stats_now(self) -> Mapping[str, QueueStats]:
        """Every queue's stats for ``/metrics``: the table's now, or (a table shared with
        other brokers, in a database) the feed's last sample, at most a second old."""
        if self.backend.shared:
            return self.feed.latest
        return ready(self.backend.stats())

    def server_info(self) -> dict[str, Any]:
        """The dashboard's header: who this broker is and how busy."""
        return {
            "version": __version__,
            "store": self.backend.name,
            "url": self.url,
            "started_at": self.started_at,
            "connections": len(self.connections),
        }

    # -- helpers for the handlers ---------------------------------------------------------

    def check_queue_name(self, name: str, field: str) -> None:
        """Raise ``invalid_argument`` naming ``field`` unless ``name`` is a valid queue name."""
        try:
            check_queue_name(name)
        except InvalidArgument as exc:
            raise _bad_name(exc, field) from None

    # -- HTTP side of the port ------------------------------------------------------------

    def process_request(self, connection: Socket, request: Request) -> Response | None:
        """Answer plain HTTP paths, and refuse bad handshakes before they become sockets."""
        return route(self, connection, request)

    # -- connections ----------------------------------------------------------------------

    def handle(self, ws: Socket) -> Awaitable[None]:
        """The transport's handler: one connection, from open to close. It is counted
        here, in the callback that accepted its handshake, so the next handshake's
        connection limits see it; the awaitable runs it."""
        conn = Connection(self, ws)
        self.connections.add(conn)
        peer = address(ws)
        self.per_address[peer] = self.per_address.get(peer, 0) + 1
        return self._run(conn, peer)

    async def _run(self, conn: Connection, peer: str) -> None:
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)
            left = self.per_address[peer] - 1
            if left:
                self.per_address[peer] = left
            else:
                del self.per_address[peer]
            conn.release()


# Headers whose meaning is one value: a second copy (a request smuggled past a proxy, or
# a probe) is refused rather than guessed at.


def _bad_name(exc: InvalidArgument, field: str) -> WireError:
    """The engine's refusal of a queue name, as the peer's field ``field`` names it."""
    return WireError(ErrorCode.INVALID_ARGUMENT, f"{field}: {exc.problem}", field)


def _ssl_context(config: Config) -> ssl.SSLContext | None:
    if config.tls_cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(config.tls_cert, config.tls_key)
    return context


@contextlib.asynccontextmanager
async def running_broker(
    config: Config, *, scheduler: Scheduler | None = None
) -> AsyncIterator[Broker]:
    """Start a broker, yield it (``.url`` is the real address), stop it on exit.
    ``scheduler``: as ``Broker``'s (tests pass a ``SteppedScheduler``)."""
    broker = await Broker.open(config, scheduler=scheduler)
    try:
        server = await serve(
            broker.handle,
            config.host,
            config.port,
            router=broker.process_request,
            ping_interval=config.ping_interval_s,
            ping_timeout=config.ping_timeout_s,
            open_timeout=config.handshake_timeout_s,
            max_size=config.max_frame_bytes,
            ssl=_ssl_context(config),
            server_header=f"conveyor/{__version__}",
        )
    except BaseException:
        await broker.close()
        raise
    broker.server = server
    sock = next(iter(server.sockets))
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    broker.url = f"{'wss' if config.secure else 'ws'}://{shown}:{port}{WS_PATH}"
    # The local table's safety net; a shared table is swept by its elected broker.
    tasks = [asyncio.get_running_loop().create_task(broker.feed.run())]
    if not broker.backend.shared:
        tasks.append(asyncio.get_running_loop().create_task(_sweep_forever(broker)))
    try:
        yield broker
    finally:
        broker.closing = True
        for task in tasks:
            task.cancel()
        with contextlib.suppress(StoreError):  # (a failed store: logged, and stops us anyway)
            await broker.backend.settle()  # answered work is durable before anyone hears "bye"
        await server.close(CLOSE_GOING_AWAY, "broker shutting down")
        broker.dispatcher.close()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # Closing the connections changed the table too (with no disconnect grace, their
        # jobs lapsed): the backend commits that before its store closes.
        await broker.close()


async def _close_scheduler(scheduler: Scheduler | None) -> None:
    close = getattr(scheduler, "aclose", None)  # (a database clock's connection)
    if close is not None:
        await close()


async def _sweep_forever(broker: Broker) -> None:
    while True:
        await asyncio.sleep(broker.config.sweep_interval_s)
        try:
            await broker.dispatcher.sweep()
            broker.dispatcher.kick()
        except StoreError as exc:
            log.warning("sweep failed: %s", exc)
        except Exception:
            log.exception("sweep failed")


async def serve_until_signalled(
    config: Config, ready: Callable[[Broker], None]
) -> StoreError | None:
    """Run a broker until SIGTERM or SIGINT, or until its store fails, calling ``ready``
    once it listens; return the store's failure, if that is what stopped it."""
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
    return broker.backend.failed
