"""The operations of docs/protocol.md §7: decode-free handlers from op name to effect.

Each handler takes the connection and the request's checked fields (``sdk._wire``
has already checked shapes and types and filled defaults), calls the engine or the
dispatcher, and returns the reply's result members. Handlers hold no business logic:
the engine decides every state transition. They raise ``WireError`` for a request the
broker refuses; the engine's ``InvalidArgument`` is turned into one by the server.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from sdk._wire import (
    OPS,
    PROTOCOL_VERSION,
    SERVER_NAME,
    SUPPORTED_PROTOCOLS,
    ErrorCode,
    Op,
    Role,
    WireError,
    check_entry,
    encode_payload,
    job_info,
)

from . import __version__
from .config import Config
from .dispatch import Dispatcher, Subscription
from .egress import Out
from .engine import InvalidArgument, JobTable, NewJob, Queue, RawJSON
from .feed import Feed, Viewer

__all__ = ["HANDLERS", "Broker", "Peer"]


class Broker(Protocol):
    """What the handlers use of the broker (``broker.server.Broker`` provides it)."""

    config: Config
    table: JobTable
    dispatcher: Dispatcher
    feed: Feed
    clock: Callable[[], float]

    @property
    def queue_names(self) -> list[str]: ...

    def queue(self, name: str, field: str = "queue") -> Queue:
        """The queue ``name`` (made on first use); ``invalid_argument`` for a bad name."""
        ...

    def check_queue_name(self, name: str, field: str) -> None:
        """Raise ``invalid_argument`` naming ``field`` unless ``name`` is a valid name."""
        ...

    def queue_stats(self, name: str) -> dict[str, Any]: ...


class Peer(Viewer, Protocol):
    """What the handlers use of the connection a request came on
    (``broker.connection.Connection`` provides it)."""

    hello_done: bool
    client: str | None
    roles: frozenset[Role]
    subscription: Subscription | None

    @property
    def broker(self) -> Broker: ...

    def authenticate(self, token: str | None) -> None:
        """Grant ``hello``'s token its roles, or raise ``unauthorized``/``limit_exceeded``."""
        ...

    def send(self, frame: dict[str, Any]) -> None:
        """Queue a frame, after the commit of what changed before it."""
        ...

    def emit(self, out: Out, frame: dict[str, Any]) -> None:
        """Queue a frame of kind ``out``; ``broker/egress.py`` says when it leaves."""
        ...

    def flush_now(self) -> None:
        """Write what is queued now."""
        ...


log = logging.getLogger("conveyor")

Result = dict[str, Any] | None
Handler = Callable[[Peer, dict[str, Any]], Result]

_OPTION_NAMES = (
    "priority",
    "delay_s",
    "run_at",
    "expires_s",
    "visibility_timeout_s",
    "max_attempts",
    "backoff_base_s",
    "key",
)


def _known_queue(conn: Peer, name: str) -> Queue:
    """An existing queue, or ``not_found`` (for operations that must not create one)."""
    if name not in conn.broker.queue_names:
        raise WireError(ErrorCode.NOT_FOUND, f"queue: no queue named {name[:128]!r}", "queue")
    return conn.broker.table.queue(name)


# The longest ``client`` name a hello may give.
MAX_CLIENT_LEN = 256


def hello(conn: Peer, f: dict[str, Any]) -> Result:
    if conn.hello_done:
        raise WireError(ErrorCode.CONFLICT, "hello: this connection already said hello")
    if f["protocol"] not in SUPPORTED_PROTOCOLS:
        raise WireError(
            ErrorCode.UNSUPPORTED_VERSION,
            f"protocol: this broker speaks {sorted(SUPPORTED_PROTOCOLS)}, not {f['protocol']}",
            "protocol",
        )
    client = f["client"]
    if client is not None and len(client) > MAX_CLIENT_LEN:
        # Shown on the dashboard, so copied into every feed: kept short.
        raise WireError(
            ErrorCode.INVALID_ARGUMENT,
            f"client: at most {MAX_CLIENT_LEN} characters, got {len(client)}",
            "client",
        )
    conn.authenticate(f["token"])  # raises unauthorized / limit_exceeded
    conn.hello_done = True
    conn.client = client
    config = conn.broker.config
    return {
        "server": SERVER_NAME,
        "version": __version__,
        "protocol": PROTOCOL_VERSION,
        "roles": sorted(conn.roles),
        "ping_interval_s": config.ping_interval_s,
        "ping_timeout_s": config.ping_timeout_s,
        "max_frame_bytes": config.max_frame_bytes,
        "max_payload_bytes": config.max_payload_bytes,
        "max_prefetch": config.max_prefetch,
        "max_batch": config.max_batch,
        "disconnect_grace_s": config.disconnect_grace_s,
    }


def ping(conn: Peer, f: dict[str, Any]) -> Result:
    return {"now": conn.broker.clock()}


def _payload(conn: Peer, value: Any, field: str) -> RawJSON:
    # orjson checks and encodes in one pass, far faster than the engine's stdlib path.
    return RawJSON(
        encode_payload(value, max_bytes=conn.broker.config.max_payload_bytes, field=field)
    )


def enqueue(conn: Peer, f: dict[str, Any]) -> Result:
    queue = conn.broker.queue(f["queue"])
    payload = _payload(conn, f["payload"], "payload")
    job_id = queue.enqueue(payload, **{name: f[name] for name in _OPTION_NAMES})
    conn.broker.dispatcher.queue_changed(queue.name)
    return {"id": job_id}


def enqueue_batch(conn: Peer, f: dict[str, Any]) -> Result:
    queue = conn.broker.queue(f["queue"])
    jobs = []
    for i, spec in enumerate(f["jobs"]):
        payload = _payload(conn, spec["payload"], f"jobs[{i}].payload")
        jobs.append(NewJob(payload, **{name: spec[name] for name in _OPTION_NAMES}))
    ids = queue.enqueue_batch(jobs)
    conn.broker.dispatcher.queue_changed(queue.name)
    return {"ids": ids}


_EACH_JOBS = OPS[Op.ENQUEUE_EACH].by_name["jobs"]


def _within(exc: WireError, prefix: str) -> WireError:
    """``exc`` with its field placed under ``prefix`` (``jobs[3]`` + ``.payload``)."""
    if exc.field is None:
        return exc
    return WireError(exc.code, f"{prefix}.{exc.message}", f"{prefix}.{exc.field}")


def enqueue_each(conn: Peer, f: dict[str, Any]) -> Result:
    """Each job on its own, in order: an id, or the error ``enqueue`` would have given,
    its field under the entry's path (``jobs[3].priority``). One bad job fails alone:
    a client coalescing independent enqueues into one frame (the SDK) relies on it."""
    results: list[dict[str, Any]] = []
    changed: set[str] = set()
    table = conn.broker.table
    limit = conn.broker.config.max_payload_bytes
    for i, item in enumerate(f["jobs"]):
        try:
            job = check_entry(_EACH_JOBS, item, i)
            try:
                queue = table.queue(job["queue"])
                payload = RawJSON(encode_payload(job["payload"], max_bytes=limit))
                job_id = queue.enqueue(
                    payload,
                    priority=job["priority"],
                    delay_s=job["delay_s"],
                    run_at=job["run_at"],
                    expires_s=job["expires_s"],
                    visibility_timeout_s=job["visibility_timeout_s"],
                    max_attempts=job["max_attempts"],
                    backoff_base_s=job["backoff_base_s"],
                    key=job["key"],
                )
            except InvalidArgument as exc:  # a bad queue name, an option out of range
                error = WireError(ErrorCode(exc.code), str(exc), exc.field)
                raise _within(error, f"jobs[{i}]") from None
            except WireError as exc:  # the payload: its path is made only when it failed
                raise _within(exc, f"jobs[{i}]") from None
        except WireError as exc:
            results.append({"error": exc.error_object()})
            continue
        except Exception:
            # Our bug, not the peer's (as in Connection.handle_frame): this job only.
            log.exception("internal error in enqueue_each")
            internal = WireError(ErrorCode.INTERNAL, "internal error")
            results.append({"error": internal.error_object()})
            continue
        results.append({"id": job_id})
        changed.add(queue.name)
    for name in changed:
        conn.broker.dispatcher.queue_changed(name)
    return {"results": results}


def get_job(conn: Peer, f: dict[str, Any]) -> Result:
    job = conn.broker.table.get_job(f["id"])
    return {"job": None if job is None else job_info(job)}


def cancel(conn: Peer, f: dict[str, Any]) -> Result:
    cancelled = conn.broker.table.cancel(f["id"])
    if cancelled:
        conn.broker.dispatcher.cancelled(f["id"])
    return {"cancelled": cancelled}


def stats(conn: Peer, f: dict[str, Any]) -> Result:
    broker = conn.broker
    if f["queue"] is not None:
        names = [_known_queue(conn, f["queue"]).name]
    else:
        names = broker.table.queues()
    return {"queues": {name: broker.queue_stats(name) for name in names}}


def subscribe(conn: Peer, f: dict[str, Any]) -> Result:
    broker = conn.broker
    if conn.subscription is not None:
        raise WireError(ErrorCode.CONFLICT, "subscribe: this connection is already subscribed")
    prefetch = f["prefetch"]
    if prefetch < 1:
        raise WireError(
            ErrorCode.INVALID_ARGUMENT, f"prefetch: must be >= 1, got {prefetch}", "prefetch"
        )
    if prefetch > broker.config.max_prefetch:
        raise WireError(
            ErrorCode.LIMIT_EXCEEDED,
            f"prefetch: must be at most {broker.config.max_prefetch}, got {prefetch}",
            "prefetch",
        )
    for i, name in enumerate(f["queues"]):  # all checked before any queue is made
        broker.check_queue_name(name, f"queues[{i}]")
    queues = [broker.queue(name) for name in f["queues"]]
    sub = Subscription(
        f["worker_id"],
        queues,
        prefetch,
        conn.emit,
        owner=conn,
        flush=conn.flush_now,
    )
    leases = [(item["id"], item["lease"]) for item in f["leases"]]
    conn.subscription = sub
    reattached = broker.dispatcher.subscribe(sub, leases)
    return {"reattached": reattached}


def unsubscribe(conn: Peer, f: dict[str, Any]) -> Result:
    sub = conn.subscription
    if sub is None:
        raise WireError(ErrorCode.CONFLICT, "unsubscribe: this connection never subscribed")
    return {"held": conn.broker.dispatcher.drain(sub)}


def _finish(conn: Peer, job_id: str, lease: str) -> None:
    conn.broker.dispatcher.finished(conn.subscription, job_id, lease)


def ack(conn: Peer, f: dict[str, Any]) -> Result:
    landed = conn.broker.table.ack(f["id"], f["lease"])
    _finish(conn, f["id"], f["lease"])
    return {"landed": landed}


def retry(conn: Peer, f: dict[str, Any]) -> Result:
    table = conn.broker.table
    landed = table.retry(f["id"], f["lease"], f["error"], f["delay_s"])
    _finish(conn, f["id"], f["lease"])
    name = table.queue_of(f["id"]) if landed else None
    if name is not None:
        conn.broker.dispatcher.queue_changed(name)
    return {"landed": landed}


def fail(conn: Peer, f: dict[str, Any]) -> Result:
    landed = conn.broker.table.fail(f["id"], f["lease"], f["error"])
    _finish(conn, f["id"], f["lease"])
    return {"landed": landed}


def heartbeat(conn: Peer, f: dict[str, Any]) -> Result:
    return {"landed": conn.broker.table.heartbeat(f["id"], f["lease"])}


def ack_batch(conn: Peer, f: dict[str, Any]) -> Result:
    pairs = [(item["id"], item["lease"]) for item in f["items"]]
    landed = conn.broker.table.ack_many(pairs)
    conn.broker.dispatcher.finished_many(conn.subscription, pairs)
    return {"landed": landed}


def heartbeat_batch(conn: Peer, f: dict[str, Any]) -> Result:
    table = conn.broker.table
    return {"landed": [table.heartbeat(item["id"], item["lease"]) for item in f["items"]]}


def pause(conn: Peer, f: dict[str, Any]) -> Result:
    conn.broker.queue(f["queue"]).pause()
    return {"paused": True}


def resume(conn: Peer, f: dict[str, Any]) -> Result:
    queue = _known_queue(conn, f["queue"])
    queue.resume()
    conn.broker.dispatcher.queue_changed(queue.name)
    return {"paused": False}


def redrive(conn: Peer, f: dict[str, Any]) -> Result:
    table = conn.broker.table
    redriven = table.redrive(f["id"])
    name = table.queue_of(f["id"]) if redriven else None
    if name is not None:
        conn.broker.dispatcher.queue_changed(name)
    return {"redriven": redriven}


def purge_dead(conn: Peer, f: dict[str, Any]) -> Result:
    return {"purged": _known_queue(conn, f["queue"]).purge_dead()}


def sweep(conn: Peer, f: dict[str, Any]) -> Result:
    return conn.broker.dispatcher.sweep()


def watch(conn: Peer, f: dict[str, Any]) -> Result:
    conn.broker.feed.watch(conn, f)
    return {}


HANDLERS: dict[Op, Handler] = {
    Op.HELLO: hello,
    Op.PING: ping,
    Op.ENQUEUE: enqueue,
    Op.ENQUEUE_BATCH: enqueue_batch,
    Op.ENQUEUE_EACH: enqueue_each,
    Op.GET_JOB: get_job,
    Op.CANCEL: cancel,
    Op.STATS: stats,
    Op.SUBSCRIBE: subscribe,
    Op.UNSUBSCRIBE: unsubscribe,
    Op.ACK: ack,
    Op.RETRY: retry,
    Op.FAIL: fail,
    Op.HEARTBEAT: heartbeat,
    Op.ACK_BATCH: ack_batch,
    Op.HEARTBEAT_BATCH: heartbeat_batch,
    Op.PAUSE: pause,
    Op.RESUME: resume,
    Op.REDRIVE: redrive,
    Op.PURGE_DEAD: purge_dead,
    Op.SWEEP: sweep,
    Op.WATCH: watch,
}
