"""The operations of docs/protocol.md §7: decode-free handlers from op name to effect.

Each handler takes the connection and the request's checked fields (``sdk._wire``
has already checked shapes and types and filled defaults), calls the backend
(``broker/backend``) or the dispatcher, and returns the reply's result members.
Handlers hold no business logic: the backend decides every state transition, and tells
the dispatcher what may have become claimable. They raise ``WireError`` for a request
the broker refuses; the engine's ``InvalidArgument`` is turned into one by the server.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from ..sdk._wire import (
    BACK_OFF_SCOPES,
    JOB_STATES,
    MAX_LIST_LIMIT,
    MAX_SCHEDULE_LIMIT,
    MAX_WAIT_S,
    OPS,
    PROTOCOL_VERSION,
    SCHEDULE_FIELDS,
    SERVER_NAME,
    SUPPORTED_PROTOCOLS,
    ErrorCode,
    MoreThanPairs,
    Op,
    Role,
    WireError,
    check_entry,
    decode_value,
    encode,
    encode_payload,
    job_info,
    raw_json,
)
from . import __version__
from .backend import (
    Backend,
    BackOff,
    Enqueue,
    JobList,
    Later,
    Pending,
    Progress,
    Report,
    then,
)
from .config import Config
from .dispatch import Dispatcher, Subscription
from .egress import Out
from .engine import (
    LIMIT_FIELDS,
    MAX_PROGRESS_BYTES,
    InvalidArgument,
    Limits,
    NewJob,
    RawJSON,
    ScheduleInfo,
    ScheduleSpec,
    check_queue_name,
)
from .feed import Feed, Viewer, queue_info
from .watches import Watches

__all__ = ["HANDLERS", "Broker", "Peer", "WaitFor", "WatchJob"]


class Broker(Protocol):
    """What the handlers use of the broker (``broker.server.Broker`` provides it)."""

    config: Config
    dispatcher: Dispatcher
    feed: Feed
    clock: Callable[[], float]

    @property
    def backend(self) -> Backend:
        """The job table (``broker/backend``)."""
        ...

    def check_queue_name(self, name: str, field: str) -> None:
        """Raise ``invalid_argument`` naming ``field`` unless ``name`` is a valid name."""
        ...


class Peer(Viewer, Protocol):
    """What the handlers use of the connection a request came on
    (``broker.connection.Connection`` provides it)."""

    hello_done: bool
    client: str | None
    roles: frozenset[Role]
    subscription: Subscription | None
    watches: Watches

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


Result = dict[str, Any] | None
# A handler's reply: there at once, or to come with its backend call's result (a
# database's answer); the connection sends each in the order the requests came.
Reply = Result | Pending[Result]
Handler = Callable[[Peer, dict[str, Any]], "Reply | WaitFor | WatchJob"]

_OPTION_NAMES = (
    "priority",
    "delay_s",
    "run_at",
    "expires_s",
    "visibility_timeout_s",
    "max_attempts",
    "backoff_base_s",
    "key",
    "timeout_s",
    "partition",
    "after",
)


def _no_queue(name: str) -> WireError:
    """``not_found`` for operations that must not make a queue."""
    return WireError(ErrorCode.NOT_FOUND, f"queue: no queue named {name[:128]!r}", "queue")


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


def _new_job(payload: RawJSON, spec: dict[str, Any]) -> NewJob:
    return NewJob(payload, **{name: spec[name] for name in _OPTION_NAMES})


def _enqueue(queue: str, payload: RawJSON, spec: dict[str, Any]) -> Enqueue:
    # Positional, in Enqueue's order: this is made once per job of every enqueue.
    return Enqueue(
        queue,
        payload,
        spec["priority"],
        spec["delay_s"],
        spec["run_at"],
        spec["expires_s"],
        spec["visibility_timeout_s"],
        spec["max_attempts"],
        spec["backoff_base_s"],
        spec["key"],
        spec["timeout_s"],
        spec["partition"],
        spec["after"],
    )


def enqueue(conn: Peer, f: dict[str, Any]) -> Reply:
    try:
        payload = _payload(conn, f["payload"], "payload")
    except WireError:
        conn.broker.check_queue_name(f["queue"], "queue")  # a bad name is named first
        raise
    # (The backend checks the name: a known queue's costs a dict look-up, not a match.)
    job = _enqueue(f["queue"], payload, f)
    return then(conn.broker.backend.enqueue([job]), _one_id)


def _one_id(answers: list[str | Exception]) -> Result:
    (job_id,) = answers
    if isinstance(job_id, Exception):
        raise job_id  # (the connection answers invalid_argument, or internal for a bug)
    return {"id": job_id}


def enqueue_batch(conn: Peer, f: dict[str, Any]) -> Reply:
    conn.broker.check_queue_name(f["queue"], "queue")
    jobs = [
        _new_job(_payload(conn, spec["payload"], f"jobs[{i}].payload"), spec)
        for i, spec in enumerate(f["jobs"])
    ]
    return then(conn.broker.backend.enqueue_all(f["queue"], jobs), lambda ids: {"ids": ids})


_EACH_JOBS = OPS[Op.ENQUEUE_EACH].by_name["jobs"]


def _within(exc: WireError, prefix: str) -> WireError:
    """``exc`` with its field placed under ``prefix`` (``jobs[3]`` + ``.payload``)."""
    if exc.field is None:
        return exc
    return WireError(exc.code, f"{prefix}.{exc.message}", f"{prefix}.{exc.field}")


def _refused(exc: InvalidArgument, i: int) -> dict[str, Any]:
    error = WireError(ErrorCode(exc.code), str(exc), exc.field)
    return {"error": _within(error, f"jobs[{i}]").error_object()}


def enqueue_each(conn: Peer, f: dict[str, Any]) -> Reply:
    """Each job on its own, in order: an id, or the error ``enqueue`` would have given,
    its field under the entry's path (``jobs[3].priority``). One bad job fails alone:
    a client coalescing independent enqueues into one frame (the SDK) relies on it."""
    results: list[dict[str, Any] | None] = []
    batch: list[Enqueue] = []
    limit = conn.broker.config.max_payload_bytes
    for i, item in enumerate(f["jobs"]):
        try:
            job = check_entry(_EACH_JOBS, item, i)
            try:
                payload = RawJSON(encode_payload(job["payload"], max_bytes=limit))
            except WireError as exc:  # the payload: its path is made only when it failed
                try:
                    check_queue_name(job["queue"])  # a bad name is named first
                except InvalidArgument as bad_name:
                    results.append(_refused(bad_name, i))
                    continue
                raise _within(exc, f"jobs[{i}]") from None
        except WireError as exc:
            results.append({"error": exc.error_object()})
            continue
        results.append(None)  # filled in from the backend's answer below
        batch.append(_enqueue(job["queue"], payload, job))
    return then(conn.broker.backend.enqueue(batch), lambda answers: _each(answers, results))


def _each(answers: list[str | Exception], results: list[dict[str, Any] | None]) -> Result:
    """``enqueue_each``'s results: the backend's ``answers`` in the places (``None``) of
    ``results`` left for the jobs that reached it."""
    if len(answers) == len(results):  # every job reached the backend (the usual case)
        return {"results": [_answer(answer, i) for i, answer in enumerate(answers)]}
    each = iter(answers)
    out = [_answer(next(each), i) if result is None else result for i, result in enumerate(results)]
    return {"results": out}


def _answer(answer: str | Exception, i: int) -> dict[str, Any]:
    """The ``enqueue_each`` result of job ``i`` from the backend's answer for it."""
    if answer.__class__ is str:
        return {"id": answer}
    if isinstance(answer, InvalidArgument):
        # An option out of range fails that job alone, as it would have on its own.
        return _refused(answer, i)
    # Our bug, not the peer's (logged by the backend): this job only.
    return {"error": WireError(ErrorCode.INTERNAL, "internal error").error_object()}


def enqueue_group(conn: Peer, f: dict[str, Any]) -> Reply:
    """Every job or none (docs/contract.md, DEP-6): the ids in order, or the error of the
    first bad member, its field under ``jobs[i]``."""
    jobs = []
    for i, spec in enumerate(f["jobs"]):
        try:
            payload = _payload(conn, spec["payload"], "payload")
        except WireError as exc:
            raise _within(exc, f"jobs[{i}]") from None
        jobs.append(_enqueue(spec["queue"], payload, spec))
    return then(conn.broker.backend.enqueue_group(jobs), lambda ids: {"ids": ids})


def dependency_results(conn: Peer, f: dict[str, Any]) -> Reply:
    """A page of a job's dependencies' results from ``offset`` on (DEP-2): as many as fit
    in half a frame, one at least; ``next`` is the offset of the page after, or null.
    ``results`` is null for an id of no job."""
    job_id, offset = f["id"], f["offset"]
    if offset < 0:
        raise WireError(ErrorCode.INVALID_ARGUMENT, f"offset: must be >= 0, got {offset}", "offset")
    budget = conn.broker.config.max_frame_bytes // 2

    def reply(found: list[tuple[str, bytes | None]] | None) -> Result:
        if found is None:  # no such job (as get_job answers a null job)
            return {"results": None, "next": None}
        page: list[dict[str, Any]] = []
        used = 0
        at = offset
        while at < len(found):
            dep_id, result = found[at]
            size = len(dep_id) + (4 if result is None else len(result)) + 24
            if page and used + size > budget:
                break
            page.append({"id": dep_id, "result": None if result is None else raw_json(result)})
            used += size
            at += 1
        return {"results": page, "next": at if at < len(found) else None}

    return then(conn.broker.backend.dependency_results(job_id), reply)


def get_job(conn: Peer, f: dict[str, Any]) -> Reply:
    backend = conn.broker.backend

    def reply(jobs: list[Any]) -> Result:
        (job,) = jobs
        return {"job": None if job is None else job_info(job, backend.now())}

    return then(backend.get_jobs([f["id"]]), reply)


def cancel(conn: Peer, f: dict[str, Any]) -> Reply:
    # The backend tells the dispatcher, which tells the job's holder (a cancelled push).
    return then(conn.broker.backend.cancel([f["id"]]), lambda done: {"cancelled": done[0]})


def cancel_batch(conn: Peer, f: dict[str, Any]) -> Reply:
    """``cancel`` of each id on its own, in order (at most max_batch of them)."""
    return then(conn.broker.backend.cancel(f["ids"]), lambda done: {"cancelled": done})


def list_jobs(conn: Peer, f: dict[str, Any]) -> Reply:
    """A page of a queue's jobs in one state (docs/protocol.md, ``list_jobs``)."""
    state, limit, name = f["state"], f["limit"], f["queue"]
    if state not in JOB_STATES:
        raise WireError(
            ErrorCode.INVALID_ARGUMENT,
            f"state: must be one of {', '.join(JOB_STATES)}, got {state[:32]!r}",
            "state",
        )
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise WireError(
            ErrorCode.INVALID_ARGUMENT,
            f"limit: must be 1 to {MAX_LIST_LIMIT}, got {limit}",
            "limit",
        )
    conn.broker.check_queue_name(name, "queue")
    after = None if f["cursor"] is None else _cursor_key(f["cursor"], state)
    backend = conn.broker.backend

    def reply(page: JobList | None) -> Result:
        if page is None:
            raise _no_queue(name)
        now = backend.now()
        jobs = [job_info(job, now) for job in page.jobs]
        if state == "processing":
            # The claim time is no field of the job's row: the dispatcher knows it for the
            # jobs held by this broker's workers (what the dashboard shows as running since).
            claimed_at = conn.broker.dispatcher.claimed_at
            for job in jobs:
                job["claimed_at"] = claimed_at(job["id"])
        return {
            "jobs": jobs,
            "next": None if page.next is None else _cursor(state, page.next),
            "total": page.total,
        }

    return then(backend.list_jobs(name, state, after, limit, f["search"]), reply)


def _cursor(state: str, key: tuple[Any, ...]) -> str:
    """An opaque cursor: the listing's state and the key to go on after, as URL-safe
    base64 of JSON (a float's JSON text reads back as the same float)."""
    return base64.urlsafe_b64encode(encode([state, *key])).decode().rstrip("=")


def _cursor_key(cursor: str, state: str) -> tuple[Any, ...]:
    """The key a cursor of ``state`` holds; ``invalid_argument`` naming ``cursor`` for
    anything else (the backend checks the key's members)."""
    try:
        value = decode_value(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, WireError):
        value = None
    if not isinstance(value, list) or not value or value[0] != state:
        raise WireError(
            ErrorCode.INVALID_ARGUMENT,
            f"cursor: is not a cursor of a {state} listing of this broker",
            "cursor",
        )
    return tuple(value[1:])


def stats(conn: Peer, f: dict[str, Any]) -> Reply:
    name = f["queue"]

    def reply(found: dict[str, Any]) -> Result:
        if name is not None and name not in found:
            raise _no_queue(name)
        return {"queues": {queue: queue_info(counts) for queue, counts in found.items()}}

    return then(conn.broker.backend.stats(None if name is None else [name]), reply)


def subscribe(conn: Peer, f: dict[str, Any]) -> Reply:
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
    names: list[str] = f["queues"]
    for i, name in enumerate(names):  # all checked before any queue is made
        broker.check_queue_name(name, f"queues[{i}]")
    for name in names:  # made now, so that stats and the dashboard show them
        broker.backend.set_queue(name)  # (calls take effect in order: before the claims)
    sub = Subscription(
        f["worker_id"],
        names,
        prefetch,
        conn.emit,
        owner=conn,
        flush=conn.flush_now,
    )
    leases = [(item["id"], item["lease"]) for item in f["leases"]]
    conn.subscription = sub
    return then(broker.dispatcher.subscribe(sub, leases), lambda ids: {"reattached": ids})


def unsubscribe(conn: Peer, f: dict[str, Any]) -> Result:
    sub = conn.subscription
    if sub is None:
        raise WireError(ErrorCode.CONFLICT, "unsubscribe: this connection never subscribed")
    return {"held": conn.broker.dispatcher.drain(sub)}


def _finish(conn: Peer, job_id: str, lease: str, outcome: str | None) -> None:
    conn.broker.dispatcher.finished(conn.subscription, job_id, lease, outcome)


def _result(conn: Peer, value: Any, field: str) -> bytes | None:
    """An ack's ``result`` as the JSON bytes to store, ``None`` for none (absent or null);
    ``too_large`` naming ``field`` over the broker's ``max_payload_bytes``."""
    if value is None:
        return None
    return encode_payload(value, max_bytes=conn.broker.config.max_payload_bytes, field=field)


def ack(conn: Peer, f: dict[str, Any]) -> Reply:
    job_id, lease = f["id"], f["lease"]
    result = _result(conn, f["result"], "result")

    def reply(landed: list[bool]) -> Result:
        _finish(conn, job_id, lease, "ok" if landed[0] else None)
        return {"landed": landed[0]}

    backend = conn.broker.backend
    acked = (
        backend.ack([(job_id, lease)])
        if result is None
        else backend.ack([(job_id, lease)], [result])
    )
    return then(acked, reply)


def _report(conn: Peer, f: dict[str, Any], *, retry: bool) -> Reply:
    report = Report(f["id"], f["lease"], retry=retry, error=f["error"], delay_s=f.get("delay_s"))

    def reply(answers: list[bool | InvalidArgument]) -> Result:
        (landed,) = answers
        if isinstance(landed, InvalidArgument):
            raise landed
        # (A retry that used the last attempt counts as a retry: the job died of it.)
        outcome = ("retry" if retry else "dead") if landed else None
        _finish(conn, report.id, report.lease, outcome)
        return {"landed": landed}

    return then(conn.broker.backend.report([report]), reply)


def retry(conn: Peer, f: dict[str, Any]) -> Reply:
    return _report(conn, f, retry=True)


def fail(conn: Peer, f: dict[str, Any]) -> Reply:
    return _report(conn, f, retry=False)


def back_off(conn: Peer, f: dict[str, Any]) -> Reply:
    scope = f["scope"]
    if scope not in BACK_OFF_SCOPES:
        raise WireError(
            ErrorCode.INVALID_ARGUMENT,
            f"scope: must be one of {', '.join(BACK_OFF_SCOPES)}, got {scope[:64]!r}",
            "scope",
        )
    item = BackOff(f["id"], f["lease"], f["delay_s"], f["partition"], scope == "queue")

    def reply(answers: list[bool | InvalidArgument]) -> Result:
        (landed,) = answers
        if isinstance(landed, InvalidArgument):
            raise landed
        _finish(conn, item.id, item.lease, "backoff" if landed else None)
        return {"landed": landed}

    return then(conn.broker.backend.back_off([item]), reply)


def heartbeat(conn: Peer, f: dict[str, Any]) -> Reply:
    pending = conn.broker.backend.heartbeat([(f["id"], f["lease"])])
    return then(pending, lambda landed: {"landed": landed[0]})


def ack_batch(conn: Peer, f: dict[str, Any]) -> Reply:
    items = f["items"]
    pairs = [(item["id"], item["lease"]) for item in items]
    # Most acks carry no result: their items are a plain list of bare pairs (the wire
    # check's ``MoreThanPairs`` otherwise), and only a batch with a result pays for them.
    results: list[bytes | None] | None = None
    if type(items) is MoreThanPairs:
        results = [
            _result(conn, item.get("result"), f"items[{i}].result") for i, item in enumerate(items)
        ]

    def reply(landed: list[bool]) -> Result:
        conn.broker.dispatcher.finished_many(conn.subscription, pairs, "ok", landed)
        return {"landed": landed}

    backend = conn.broker.backend
    return then(backend.ack(pairs) if results is None else backend.ack(pairs, results), reply)


class WaitFor(NamedTuple):
    """``wait``'s answer to come: the connection waits for job ``id`` for at most
    ``timeout_s`` seconds and replies on its own, out of the order of replies
    (``broker/waits.py``)."""

    id: str
    timeout_s: float


def wait(conn: Peer, f: dict[str, Any]) -> WaitFor:
    timeout_s = f["timeout_s"]
    if not 0 <= timeout_s <= MAX_WAIT_S:
        raise WireError(
            ErrorCode.INVALID_ARGUMENT,
            f"timeout_s: must be a number in [0, {MAX_WAIT_S:g}], got {timeout_s!r}",
            "timeout_s",
        )
    return WaitFor(f["id"], float(timeout_s))


class WatchJob(NamedTuple):
    """``watch_job``'s answer to come: the connection watches job ``id`` and replies on
    its own once the backend has answered (``broker/watches.py``)."""

    id: str


def watch_job(conn: Peer, f: dict[str, Any]) -> WatchJob:
    return WatchJob(f["id"])


def unwatch_job(conn: Peer, f: dict[str, Any]) -> Result:
    return {"watching": conn.watches.stop(f["id"])}


def progress(conn: Peer, f: dict[str, Any]) -> Reply:
    """Each item's progress, stored under its lease (PRG-1): whether each landed. A
    value over the cap is ``too_large`` naming ``items[i].progress`` (PRG-3); nothing
    of the batch is stored then."""
    limit = min(MAX_PROGRESS_BYTES, conn.broker.config.max_payload_bytes)
    items = [
        Progress(
            item["id"],
            item["lease"],
            encode_payload(item["progress"], max_bytes=limit, field=f"items[{i}].progress"),
        )
        for i, item in enumerate(f["items"])
    ]

    def reply(answers: list[bool | InvalidArgument]) -> Result:
        for i, answer in enumerate(answers):
            if isinstance(answer, InvalidArgument):
                raise answer.within(f"items[{i}]")
        return {"landed": answers}

    return then(conn.broker.backend.progress(items), reply)


def heartbeat_batch(conn: Peer, f: dict[str, Any]) -> Reply:
    pairs = [(item["id"], item["lease"]) for item in f["items"]]
    return then(conn.broker.backend.heartbeat(pairs), lambda landed: {"landed": landed})


def pause(conn: Peer, f: dict[str, Any]) -> Reply:
    return then(conn.broker.backend.pause(f["queue"]), lambda _: {"paused": True})


def resume(conn: Peer, f: dict[str, Any]) -> Reply:
    name = f["queue"]

    def reply(found: bool) -> Result:
        if not found:
            raise _no_queue(name)
        return {"paused": False}

    return then(conn.broker.backend.resume(name), reply)


def redrive(conn: Peer, f: dict[str, Any]) -> Reply:
    return then(conn.broker.backend.redrive([f["id"]]), lambda done: {"redriven": done[0]})


def redrive_all(conn: Peer, f: dict[str, Any]) -> Reply:
    name = f["queue"]

    def reply(redriven: int | None) -> Result:
        if redriven is None:
            raise _no_queue(name)
        return {"redriven": redriven}

    return then(conn.broker.backend.redrive_all(name), reply)


def purge_dead(conn: Peer, f: dict[str, Any]) -> Reply:
    name = f["queue"]

    def reply(purged: int | None) -> Result:
        if purged is None:
            raise _no_queue(name)
        return {"purged": purged}

    return then(conn.broker.backend.purge_dead(name), reply)


def set_limits(conn: Peer, f: dict[str, Any]) -> Reply:
    limits = Limits(**{name: f[name] for name in LIMIT_FIELDS})
    # (The backend checks the name and every limit, naming the field of a bad one.)
    return then(
        conn.broker.backend.set_limits(f["queue"], limits), lambda _: {"limits": limits.as_dict()}
    )


# -- schedules (docs/schedules.md; contract SCH-1 on). The backend keeps and fires them;
# these only translate fields and answers.

_SPEC_NAMES = tuple(f.name for f in SCHEDULE_FIELDS)


def schedule_info(info: ScheduleInfo) -> dict[str, Any]:
    """A schedule as ``list_schedules`` and ``set_schedule`` answer it: its definition's
    fields (``set_schedule``'s names), then where it stands."""
    spec = info.spec
    out = {name: getattr(spec, name) for name in _SPEC_NAMES}
    if isinstance(spec.payload, RawJSON):  # stored as the JSON it came as: spliced back
        out["payload"] = raw_json(spec.payload.data)
    out.update(
        next_at=info.next_at,
        last_at=info.last_at,
        last_job=info.last_job,
        fired=info.fired,
        created_at=info.created_at,
        updated_at=info.updated_at,
    )
    return out


def schedule_spec(conn: Peer, fields: dict[str, Any]) -> ScheduleSpec:
    """The ``ScheduleSpec`` of ``set_schedule``'s checked ``schedule`` object; its payload
    checked and encoded once (``too_large`` naming ``schedule.payload``)."""
    values = dict(fields)
    values["payload"] = _payload(conn, values["payload"], "schedule.payload")
    return ScheduleSpec(**values)


def _in_schedule(exc: InvalidArgument) -> WireError:
    """The backend's refusal of a schedule, its field under ``schedule`` as the request
    holds it (``cron`` -> ``schedule.cron``)."""
    inner = WireError(ErrorCode(exc.code), str(exc), exc.field)
    return _within(inner, "schedule")


def set_schedule(conn: Peer, f: dict[str, Any]) -> Reply:
    spec = schedule_spec(conn, f["schedule"])

    def reply(done: Pending[ScheduleInfo]) -> Result:
        try:
            info = done.result()
        except InvalidArgument as exc:
            raise _in_schedule(exc) from None
        return {"schedule": schedule_info(info)}

    try:
        pending = conn.broker.backend.set_schedule(spec)
    except InvalidArgument as exc:  # (refused before any I/O)
        raise _in_schedule(exc) from None
    return _settled(pending, reply)


def _settled(pending: Pending[Any], fn: Callable[[Pending[Any]], Result]) -> Reply:
    """``fn`` of the settled call itself (not its value), so that ``fn`` sees what it
    raised: at once when it is there, else when it comes."""
    if pending.done():
        return fn(pending)
    later: Later[Result] = Later()
    pending.add_done_callback(lambda done: later.settle(lambda: fn(done)))
    return later


def delete_schedule(conn: Peer, f: dict[str, Any]) -> Reply:
    return then(conn.broker.backend.delete_schedule(f["id"]), lambda done: {"deleted": done})


def _paused(conn: Peer, f: dict[str, Any], paused: bool) -> Reply:
    def reply(info: ScheduleInfo | None) -> Result:
        return {"schedule": None if info is None else schedule_info(info)}

    return then(conn.broker.backend.pause_schedule(f["id"], paused), reply)


def pause_schedule(conn: Peer, f: dict[str, Any]) -> Reply:
    return _paused(conn, f, True)


def resume_schedule(conn: Peer, f: dict[str, Any]) -> Reply:
    return _paused(conn, f, False)


def run_schedule(conn: Peer, f: dict[str, Any]) -> Reply:
    return then(conn.broker.backend.run_schedule(f["id"]), lambda job_id: {"id": job_id})


def list_schedules(conn: Peer, f: dict[str, Any]) -> Reply:
    """The schedules named by ``ids``, or a page of them all in id order after ``after``,
    with the ``after`` of the next page (``None``: none follows)."""
    ids, limit = f["ids"], f["limit"]
    if not 1 <= limit <= MAX_SCHEDULE_LIMIT:
        raise WireError(
            ErrorCode.INVALID_ARGUMENT,
            f"limit: must be 1 to {MAX_SCHEDULE_LIMIT}, got {limit}",
            "limit",
        )
    if ids is not None:
        return then(
            conn.broker.backend.schedules(ids=ids),
            lambda found: {"schedules": [schedule_info(i) for i in found], "next": None},
        )

    # One more than asked says whether a page follows; a full page of the most the
    # backend gives cannot say, and names its last id (the page after may be empty).
    ask = min(limit + 1, MAX_SCHEDULE_LIMIT)

    def reply(found: list[ScheduleInfo]) -> Result:
        page = found[:limit]
        more = len(found) > limit or (ask == limit and len(page) == limit)
        return {
            "schedules": [schedule_info(info) for info in page],
            "next": page[-1].spec.id if more else None,
        }

    return then(conn.broker.backend.schedules(after=f["after"], limit=ask), reply)


def sweep(conn: Peer, f: dict[str, Any]) -> Reply:
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
    Op.CANCEL_BATCH: cancel_batch,
    Op.STATS: stats,
    Op.LIST_JOBS: list_jobs,
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
    Op.REDRIVE_ALL: redrive_all,
    Op.PURGE_DEAD: purge_dead,
    Op.SWEEP: sweep,
    Op.SET_LIMITS: set_limits,
    Op.BACK_OFF: back_off,
    Op.WATCH: watch,
    Op.SET_SCHEDULE: set_schedule,
    Op.DELETE_SCHEDULE: delete_schedule,
    Op.PAUSE_SCHEDULE: pause_schedule,
    Op.RESUME_SCHEDULE: resume_schedule,
    Op.RUN_SCHEDULE: run_schedule,
    Op.LIST_SCHEDULES: list_schedules,
    Op.WAIT: wait,
    Op.PROGRESS: progress,
    Op.WATCH_JOB: watch_job,
    Op.UNWATCH_JOB: unwatch_job,
    Op.ENQUEUE_GROUP: enqueue_group,
    Op.DEPENDENCY_RESULTS: dependency_results,
}
