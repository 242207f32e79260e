"""The one-shot client commands of ``conveyor``: look at queues and jobs, and act on them.

``enqueue``, ``job``, ``jobs``, ``dead``, ``stats``, ``cancel``, ``pause``, ``resume``,
``redrive``, ``limits``, ``purge`` and ``schedule ...`` (``docs/cli.md`` shows each).
Each connects to a running broker at ``--url``, makes its calls, and prints for people:
tables, fields one per line, times as local dates with how far they are ("in 3 min").
``--json`` prints JSON instead, the same shapes as before this output existed, for
scripts.

Exit status: 0 when it did what was asked; 1 when the broker refused or could not be
reached, or when nothing happened (``job`` of an unknown id, ``cancel`` of a job that is
gone, ``redrive`` of one that is not dead, a ``schedule`` action on an unknown
schedule); 2 for bad arguments. Errors go to stderr, one line each, starting
``conveyor:``.

A broker that is not running is said at once: the client tries each URL once
(``Client(fail_fast=True)``) instead of retrying until ``--timeout``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._client import Client
from ._errors import ConnectionFailed, ConveyorError
from ._table import Column, duration, fields, table, when
from ._types import JobEvent, JobInfo, ScheduleInfo
from ._urls import DEFAULT_URL, URL_HELP, url_argument
from ._wire import WireError, decode_value, encode

__all__ = [
    "EXIT_FAILED",
    "EXIT_USAGE",
    "add_admin_commands",
    "add_schedule_commands",
    "connection_args",
]

EXIT_FAILED = 1  # refused, unreachable, or nothing happened
EXIT_USAGE = 2  # bad arguments (argparse's own status for them too)

STATES = ("ready", "scheduled", "processing", "completed", "dead", "waiting")
DEFAULT_LIMIT = 50
# How much of a payload or an error a table cell shows.
_CELL = 40

# The options of one request (a job's priority, a listing's filter or cursor) have no
# variable, and their help says so: a value left in the environment would apply to every
# later call. Every other option names its CONVEYOR_* variable.
_PER_CALL = "(no variable: it belongs to one call)"

_GONE = "no such job (it was acked, cancelled, purged or expired, or never enqueued)"


@dataclass
class Outcome:
    """What a command found or did: ``data`` for ``--json``, ``text`` for people (``None``:
    nothing on stdout), ``problems`` for stderr; ``failed``: exit 1."""

    data: Any
    text: str | None
    problems: list[str] = field(default_factory=list)
    failed: bool = False
    # The command printed as it went (``watch``): nothing more on stdout.
    streamed: bool = False


Action = Callable[[Client, argparse.Namespace, float], Awaitable[Outcome]]


def _env_default(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name) or default


def _yes(name: str) -> bool:
    return (os.environ.get(name) or "").strip().lower() in ("1", "true", "yes")


def connection_args(parser: argparse.ArgumentParser) -> None:
    """``--url``, ``--token``, ``--timeout`` and ``--json``, each with its variable."""
    parser.add_argument(
        "--url",
        type=url_argument,  # (applied to the default too: a bad CONVEYOR_URL is refused alike)
        default=_env_default("CONVEYOR_URL", DEFAULT_URL),
        help=f"{URL_HELP} (CONVEYOR_URL; default {DEFAULT_URL})",
    )
    parser.add_argument(
        "--token",
        default=_env_default("CONVEYOR_TOKEN"),
        help="the token to authenticate with (CONVEYOR_TOKEN; default none)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        # (a string: argparse converts it as it does the flag's, so a bad CONVEYOR_TIMEOUT
        # is refused like a bad --timeout, and only by the commands that take it)
        default=_env_default("CONVEYOR_TIMEOUT", "5"),
        help="seconds to wait for a broker that does not answer, and for each reply; one "
        "that refuses the connection (not running) is reported at once "
        "(CONVEYOR_TIMEOUT; default 5)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=_yes("CONVEYOR_JSON"),
        help="print JSON for scripts instead of text for people (CONVEYOR_JSON=1)",
    )


def say(text: str) -> None:
    """Say what went wrong on stderr, in one line, as every command does."""
    print(f"conveyor: {text}", file=sys.stderr)


def run_client(args: argparse.Namespace, action: Action) -> int:
    """Connect, run ``action``, print its outcome; the exit status."""
    # One-shot commands report an unreachable broker themselves, once.
    logging.getLogger("conveyor.sdk").setLevel(logging.ERROR)

    async def main() -> Outcome:
        async with Client(
            args.url,
            args.token,
            connect_timeout=args.timeout,
            request_timeout=args.timeout,
            fail_fast=True,
        ) as client:
            return await action(client, args, time.time())

    try:
        outcome = asyncio.run(main())
    except ConnectionFailed as exc:
        hint = ""
        if exc.refused:
            hint = "; is it running?" if len(args.url) == 1 else "; is one running?"
        say(f"{exc.message}{hint}")
        return EXIT_FAILED
    except ConveyorError as exc:
        say(f"{exc.code}: {exc.message}")
        return EXIT_FAILED
    if outcome.streamed:
        pass
    elif args.json:
        print(_json(outcome.data))
    elif outcome.text is not None:
        print(outcome.text)
    for problem in outcome.problems:
        say(problem)
    return EXIT_FAILED if outcome.failed else 0


# -- showing jobs ---------------------------------------------------------------------


def _json(value: Any) -> str:
    return encode(value).decode()


def _pretty(value: Any) -> str:
    """A payload for people: indented JSON (a scalar stays on one line)."""
    return json.dumps(value, indent=2, ensure_ascii=False)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:g} s"


# The fields of `job ID`, in the order shown, each with how it is shown.
_JOB_FIELDS: tuple[tuple[str, str, Callable[[Any, float], str]], ...] = (
    ("id", "id", lambda v, now: str(v)),
    ("queue", "queue", lambda v, now: str(v)),
    ("state", "state", lambda v, now: str(v)),
    ("priority", "priority", lambda v, now: str(v)),
    ("key", "key", lambda v, now: "-" if v is None else str(v)),
    ("enqueued_at", "enqueued", lambda v, now: when(v, now)),
    ("ready_at", "ready at", lambda v, now: when(v, now)),
    ("expires_at", "expires", lambda v, now: when(v, now)),
    ("worker_id", "worker", lambda v, now: "-" if v is None else str(v)),
    ("deadline", "lease ends", lambda v, now: when(v, now)),
    ("died_at", "died", lambda v, now: when(v, now)),
    ("completed_at", "completed", lambda v, now: when(v, now)),
    ("last_error", "last error", lambda v, now: "-" if v is None else str(v)),
    ("visibility_timeout_s", "lease", lambda v, now: _seconds(v)),
    ("timeout_s", "time limit", lambda v, now: _seconds(v)),
    ("backoff_base_s", "backoff base", lambda v, now: _seconds(v)),
    ("backoff_max_s", "backoff max", lambda v, now: _seconds(v)),
)


def show_job(info: JobInfo, now: float) -> str:
    """``info`` as fields one per line: times as local dates, the payload (and a
    completed job's result) as indented JSON. A field this list does not know (a newer
    SDK's) is shown too, as JSON."""
    data = dataclasses.asdict(info)
    pairs: list[tuple[str, str]] = []
    for name, label, show in _JOB_FIELDS:
        if name in data:
            pairs.append((label, show(data[name], now)))
        if name == "priority":
            attempts = f"{data.get('attempts')} of {data.get('max_attempts')}"
            pairs.append(("attempts", attempts))
    known = {name for name, _, _ in _JOB_FIELDS} | {
        "payload",
        "attempts",
        "max_attempts",
        "result",
        "progress",
    }
    pairs.extend((name, _json(value)) for name, value in data.items() if name not in known)
    if data.get("progress") is not None:
        pairs.append(("progress", progress_text(data["progress"])))
    pairs.append(("payload", _pretty(data.get("payload"))))
    if data.get("state") == "completed":
        pairs.append(("result", _pretty(data.get("result"))))
    return fields(pairs)


def progress_text(progress: Any) -> str:
    """A job's progress for a person: a number from 0 to 1 as a percentage, an object's
    ``value`` so and its ``message`` after it; anything else as JSON."""
    value, message = progress, None
    if isinstance(progress, dict) and "value" in progress:
        value, message = progress["value"], progress.get("message")
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1:
        text = f"{value:.0%}"
    elif message is not None and value is None:
        text = ""
    else:
        text = _json(value) if message is not None else _json(progress)
    if message is not None:
        text = f"{text} {message}".strip() if isinstance(message, str) else text
    return text


def _attempts(job: JobInfo) -> str:
    return f"{job.attempts}/{job.max_attempts}"


def show_jobs(jobs: Sequence[JobInfo], state: str, now: float) -> str:
    """A table of ``jobs`` of one ``state``, with the columns that state has."""
    head = [Column("ID"), Column("PRIORITY", right=True), Column("ATTEMPTS", right=True)]
    if state in ("ready", "scheduled"):
        extra = [Column("READY SINCE" if state == "ready" else "RUNS AT"), Column("ENQUEUED")]
        cells = [
            [when(j.ready_at, now, short=True), when(j.enqueued_at, now, short=True)] for j in jobs
        ]
    elif state == "processing":
        extra = [Column("WORKER", limit=_CELL), Column("LEASE ENDS")]
        cells = [[j.worker_id or "-", when(j.deadline, now, short=True)] for j in jobs]
    elif state == "completed":
        extra = [Column("COMPLETED"), Column("RESULT", limit=_CELL)]
        cells = [[when(j.completed_at, now, short=True), _json(j.result)] for j in jobs]
    elif state == "waiting":
        extra = [Column("ENQUEUED"), Column("WAITING FOR", right=True)]
        cells = [
            [when(j.enqueued_at, now, short=True), f"{j.waiting_for} of {len(j.after)}"]
            for j in jobs
        ]
    else:  # dead
        extra = [Column("DIED"), Column("ERROR", limit=_CELL)]
        cells = [[when(j.died_at, now, short=True), j.last_error or "-"] for j in jobs]
    rows = [
        [j.id, str(j.priority), _attempts(j), *more, _json(j.payload)]
        for j, more in zip(jobs, cells, strict=True)
    ]
    return table([*head, *extra, Column("PAYLOAD", limit=_CELL)], rows)


def _page_data(page: Any) -> dict[str, Any]:
    return {
        "jobs": [dataclasses.asdict(job) for job in page.jobs],
        "next": page.next,
        "total": page.total,
    }


def _page_text(page: Any, state: str, queue: str, more: str, now: float) -> str:
    """The table of a page of jobs, and a line under it: how many of how many, and the
    command for the next page."""
    if not page.jobs:
        return f"no {state} jobs in {queue}" if not page.total else f"no more {state} jobs"
    lines = [show_jobs(page.jobs, state, now), ""]
    noun = "job" if page.total == 1 else "jobs"
    shown = f"{len(page.jobs):,} of {page.total:,} {state} {noun} in {queue}"
    if page.next is not None:
        shown += f"; the next page: {more} --cursor {page.next}"
    lines.append(shown)
    return "\n".join(lines)


# -- the commands ---------------------------------------------------------------------


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        name: getattr(args, name)
        for name in (
            "priority",
            "delay_s",
            "run_at",
            "expires_s",
            "max_attempts",
            "key",
            "timeout_s",
            "partition",
        )
        if getattr(args, name) is not None
    }


async def _enqueue(client: Client, args: argparse.Namespace, now: float) -> Outcome:
    options = _options(args)
    if args.after:
        options["after"] = args.after
    job_id = await client.enqueue(args.queue, args.payload_value, **options)
    text = f"enqueued {job_id} on {args.queue}"
    runs_at = args.run_at
    if args.delay_s is not None:
        runs_at = now + args.delay_s
    if runs_at is not None and runs_at > now:
        text += f", to run at {when(runs_at, now)}"
    if args.after:
        text += f", after {len(args.after)} job{'s' if len(args.after) > 1 else ''}"
    return Outcome({"id": job_id}, text)


async def _job(client: Client, args: argparse.Namespace, now: float) -> Outcome:
    info = await client.get_job(args.id)
    if info is None:
        return Outcome(None, None, [f"{args.id}: {_GONE}"], failed=True)
    return Outcome(dataclasses.asdict(info), show_job(info, now))


def show_event(event: JobEvent) -> str:
    """One line for a watched job's event (``conveyor watch``)."""
    if event.kind == "progress":
        return f"progress  {progress_text(event.progress)}  (attempt {event.attempt})"
    if event.kind == "retry":
        error = f": {event.error}" if event.error else ""
        return f"retry     attempt {event.attempt} {event.reason}{error}"
    if event.state == "completed":
        return f"completed {json.dumps(event.result, ensure_ascii=False)}"
    if event.state == "dead":
        return f"dead      {event.error}"
    if event.state == "unknown":
        return f"unknown   {_GONE}"
    return str(event.state)


async def _watch(client: Client, args: argparse.Namespace, now: float) -> Outcome:
    last: JobEvent | None = None
    async for event in client.watch(args.id):
        last = event
        if args.json:
            print(json.dumps(dataclasses.asdict(event), ensure_ascii=False), flush=True)
        else:
            print(show_event(event), flush=True)
    failed = last is None or last.state != "completed"
    return Outcome(None, None, failed=failed, streamed=True)


async def _jobs(client: Client, args: argparse.Namespace, now: float) -> Outcome:
    page = await client.list_jobs(
        args.queue, args.state, search=args.search, cursor=args.cursor, limit=args.limit
    )
    more = f"conveyor jobs {args.queue} --state {args.state}"
    if args.search is not None:
        more += f" --search {args.search!r}"
    return Outcome(_page_data(page), _page_text(page, args.state, args.queue, more, now))


async def _dead(client: Client, args: argparse.Namespace, now: float) -> Outcome:
    page = await client.dead_letters(args.queue, limit=args.limit, cursor=args.cursor)
    more = f"conveyor dead {args.queue}"
    return Outcome(_page_data(page), _page_text(page, "dead", args.queue, more, now))


_STATS_COLUMNS = (
    Column("QUEUE"),
    Column("READY", right=True),
    Column("SCHEDULED", right=True),
    Column("PROCESSING", right=True),
    Column("WAITING", right=True),
    Column("LIMITED", right=True),
    Column("DEAD", right=True),
    Column("PAUSED"),
    Column("OLDEST READY", right=True),
    Column("ENQUEUED", right=True),
    Column("COMPLETED", right=True),
)


def show_stats(queues: dict[str, dict[str, Any]], now: float) -> str:
    """``stats``' counts as a table, a queue a row, by name; how many ready jobs wait on a
    flow-control limit, the oldest ready job's age (how long it has waited), and the
    totals since the broker's table began."""
    if not queues:
        return "no queues yet"
    rows = []
    for name in sorted(queues):
        q = queues[name]
        oldest = q.get("oldest_ready_at")
        totals = q.get("totals") or {}
        rows.append(
            [
                name,
                f"{q.get('ready', 0):,}",
                f"{q.get('scheduled', 0):,}",
                f"{q.get('processing', 0):,}",
                f"{q.get('waiting', 0):,}",
                f"{q.get('limited', 0):,}",
                f"{q.get('dead', 0):,}",
                "yes" if q.get("paused") else "no",
                "-" if oldest is None else duration(max(now - oldest, 0.0)),
                f"{totals.get('enqueued', 0):,}",
                f"{totals.get('completed', 0):,}",
            ]
        )
    return table(_STATS_COLUMNS, rows)


async def _stats(client: Client, args: argparse.Namespace, now: float) -> Outcome:
    queues = await client.stats(args.queue)
    return Outcome(queues, show_stats(queues, now))


async def _cancel(client: Client, args: argparse.Namespace, now: float) -> Outcome:
    ids: list[str] = args.ids
    if len(ids) == 1:
        done = [await client.cancel(ids[0])]
        data: Any = {"cancelled": done[0]}
    else:
        done = list(await client.cancel_many(ids))
        data = {"results": [{"id": i, "cancelled": c} for i, c in zip(ids, done, strict=True)]}
    lines = [f"cancelled {i}" for i, c in zip(ids, done, strict=True) if c]
    problems = [f"{i}: nothing to cancel: {_GONE}" for i, c in zip(ids, done, strict=True) if not c]
    return Outcome(data, "\n".join(lines) if lines else None, problems, failed=bool(problems))


async def _redrive(client: Client, args: argparse.Namespace, now: float) -> Outcome:
    if args.all is not None:
        count = await client.redrive_all(args.all)
        text = f"redrove {count:,} dead {'job' if count == 1 else 'jobs'} of {args.all}"
        return Outcome({"queue": args.all, "redriven": count}, text)
    ids: list[str] = args.ids
    done = list(await asyncio.gather(*(client.redrive(i) for i in ids)))
    if len(ids) == 1:
        data: Any = {"redriven": done[0]}
    else:
        data = {"results": [{"id": i, "redriven": r} for i, r in zip(ids, done, strict=True)]}
    lines = [f"redrove {i}" for i, r in zip(ids, done, strict=True) if r]
    problems = [
        f"{i}: not redriven: no dead job with this id (it is not dead, or gone)"
        for i, r in zip(ids, done, strict=True)
        if not r
    ]
    return Outcome(data, "\n".join(lines) if lines else None, problems, failed=bool(problems))


async def _purge(client: Client, args: argparse.Namespace, now: float) -> Outcome:
    count = await client.purge_dead(args.queue)
    text = f"purged {count:,} dead {'job' if count == 1 else 'jobs'} of {args.queue}"
    return Outcome({"purged": count}, text)


_LIMIT_FLAGS = ("concurrency", "burst", "partition_concurrency", "partition_burst")


def show_limits(queue: str, limits: dict[str, Any]) -> str:
    """A queue's limits, one line: ``api: concurrency 10, rate 100 per 60 s, ...``."""
    parts = []
    for scope, label in (("", ""), ("partition_", "per key: ")):
        if limits.get(scope + "concurrency") is not None:
            parts.append(f"{label}concurrency {limits[scope + 'concurrency']}")
        if limits.get(scope + "rate") is not None:
            per = limits[scope + "per_s"]
            burst = limits.get(scope + "burst")
            rate = f"{label}rate {limits[scope + 'rate']} per {per:g} s"
            parts.append(rate + ("" if burst is None else f", burst {burst}"))
    return f"{queue}: " + ("; ".join(parts) if parts else "no limits")


async def _limits(client: Client, args: argparse.Namespace, now: float) -> Outcome:
    given = {name: getattr(args, name) for name in _LIMIT_FLAGS}
    for scope in ("", "partition_"):
        rate = getattr(args, scope + "rate")
        if rate is not None:
            given[scope + "rate"], given[scope + "per_s"] = rate
    given = {name: value for name, value in given.items() if value is not None}
    if not given and not args.clear:  # only show them
        found = await client.stats(args.queue)
        limits = found[args.queue]["limits"]
        return Outcome({"queue": args.queue, "limits": limits}, show_limits(args.queue, limits))
    limits = await client.set_limits(args.queue, **given)
    return Outcome({"queue": args.queue, "limits": limits}, show_limits(args.queue, limits))


_PERIODS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hour": 3600.0}


def _rate(value: str) -> tuple[int, float]:
    """``N/PERIOD`` (``100/60s``, ``10/s``, ``500/min``, ``5/1.5s``) or ``N`` (per second):
    the count and the period in seconds."""
    count_text, _, period = value.partition("/")
    try:
        count = int(count_text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected N/PERIOD, e.g. 100/60s") from None
    period = period.strip() or "s"
    number = period.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = period[len(number) :] or "s"
    if unit not in _PERIODS:
        raise argparse.ArgumentTypeError(
            f"{value!r}: unknown unit {unit!r} (use s, min or h, e.g. 100/60s)"
        )
    try:
        seconds = (float(number) if number else 1.0) * _PERIODS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected N/PERIOD, e.g. 100/60s") from None
    return count, seconds


async def _pause(client: Client, args: argparse.Namespace, now: float) -> Outcome:
    await client.pause(args.queue)
    return Outcome({"queue": args.queue, "paused": True}, f"paused {args.queue}")


async def _resume(client: Client, args: argparse.Namespace, now: float) -> Outcome:
    await client.resume(args.queue)
    return Outcome({"queue": args.queue, "paused": False}, f"resumed {args.queue}")


# -- arguments ------------------------------------------------------------------------


def _moment(value: str) -> float:
    """``--run-at``: epoch seconds, or an ISO 8601 date and time (local when it names no
    zone): ``2024-05-01T14:00`` or ``"2024-05-01 14:00:00+02:00"``."""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be epoch seconds or an ISO 8601 date and time, got {value!r}"
        ) from None
    return moment.timestamp()  # (a naive one is taken as local time)


def _limit(value: str) -> int:
    try:
        limit = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {value!r}") from None
    if limit < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {limit}")
    return limit


def _paging_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit",
        type=_limit,
        default=_env_default("CONVEYOR_LIMIT", str(DEFAULT_LIMIT)),  # (as --timeout's)
        help=f"jobs per page, at most (CONVEYOR_LIMIT; default {DEFAULT_LIMIT})",
    )
    parser.add_argument(
        "--cursor",
        help=f"where the page starts: the cursor the previous page printed {_PER_CALL}",
    )


def _command(commands: Any, name: str, summary: str, action: Action) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        name, help=summary, description=summary[0].upper() + summary[1:] + "."
    )
    parser.set_defaults(run=lambda args: run_client(args, action))
    return parser


def _enqueue_run(args: argparse.Namespace) -> int:
    try:
        args.payload_value = decode_value(args.payload)
    except WireError as exc:
        say(f"the payload is not valid JSON: {exc}")
        return EXIT_USAGE
    return run_client(args, _enqueue)


def add_admin_commands(commands: Any) -> None:
    """Add the one-shot client subcommands to ``conveyor``'s subparsers."""
    per_call = _PER_CALL

    enqueue = _command(commands, "enqueue", "enqueue one job", _enqueue)
    enqueue.set_defaults(run=_enqueue_run)
    enqueue.add_argument("queue")
    enqueue.add_argument("payload", help='the payload as JSON, e.g. \'{"to": "a@b.c"}\'')
    enqueue.add_argument("--priority", type=int, help=f"higher runs first; default 0 {per_call}")
    enqueue.add_argument(
        "--delay", dest="delay_s", type=float, metavar="SECONDS", help=f"run after this {per_call}"
    )
    enqueue.add_argument(
        "--run-at",
        dest="run_at",
        type=_moment,
        metavar="WHEN",
        help=f"run at this time: epoch seconds or an ISO 8601 date and time, local unless "
        f"it names a zone {per_call}",
    )
    enqueue.add_argument(
        "--expires",
        dest="expires_s",
        type=float,
        metavar="SECONDS",
        help=f"drop the job if it has not run this long after enqueue {per_call}",
    )
    enqueue.add_argument(
        "--max-attempts",
        dest="max_attempts",
        type=int,
        help=f"attempts before it is dead (the queue's default otherwise) {per_call}",
    )
    enqueue.add_argument(
        "--key", help=f"idempotency key: the same key stores the job once {per_call}"
    )
    enqueue.add_argument(
        "--time-limit",
        dest="timeout_s",
        type=float,
        metavar="SECONDS",
        help=f"the handler's time limit: past it, it is cancelled and the job retried {per_call}",
    )
    enqueue.add_argument(
        "--partition",
        metavar="KEY",
        help=f"partition key (a tenant, a customer) for per-key limits and fair turns {per_call}",
    )
    enqueue.add_argument(
        "--after",
        metavar="ID",
        action="append",
        default=[],
        help="run only once the job ID has been acked (repeat for several); if it dies or "
        f"is cancelled, this job dies too {per_call}",
    )
    connection_args(enqueue)

    job = _command(commands, "job", "show one job", _job)
    job.add_argument("id")
    connection_args(job)

    watch = _command(
        commands,
        "watch",
        "follow one job live: its progress and retries, a line each, until it ends "
        "(exit 0 when it completed)",
        _watch,
    )
    watch.add_argument("id")
    connection_args(watch)

    jobs = _command(commands, "jobs", "list the jobs of a queue in one state", _jobs)
    jobs.add_argument("queue")
    jobs.add_argument(
        "--state",
        choices=STATES,
        default="ready",
        help=f"which jobs: default ready {per_call}",
    )
    jobs.add_argument(
        "--search",
        metavar="TEXT",
        help=f"only jobs whose id or key is TEXT, or whose payload JSON contains it; one call "
        f"looks at up to 2,000 jobs, so a page may be short: go on with --cursor {per_call}",
    )
    _paging_args(jobs)
    connection_args(jobs)

    dead = _command(commands, "dead", "list the dead letters of a queue", _dead)
    dead.add_argument("queue")
    _paging_args(dead)
    connection_args(dead)

    stats = _command(commands, "stats", "counts per queue", _stats)
    stats.add_argument("--queue", help=f"this queue only {per_call}")
    connection_args(stats)

    cancel = _command(commands, "cancel", "cancel jobs, in any state", _cancel)
    cancel.add_argument("ids", nargs="+", metavar="ID")
    connection_args(cancel)

    pause = _command(commands, "pause", "stop handing out the jobs of a queue", _pause)
    pause.add_argument("queue")
    connection_args(pause)

    resume = _command(commands, "resume", "hand out the jobs of a paused queue again", _resume)
    resume.add_argument("queue")
    connection_args(resume)

    redrive = _command(
        commands, "redrive", "put dead jobs back to ready, their attempts reset", _redrive
    )
    redrive.add_argument("ids", nargs="*", metavar="ID")
    redrive.add_argument(
        "--all", metavar="QUEUE", help=f"every dead job of QUEUE, in place of IDs {per_call}"
    )
    connection_args(redrive)
    redrive.set_defaults(run=lambda args: _redrive_run(redrive, args))

    limits = _command(
        commands,
        "limits",
        "show or set a queue's flow-control limits (setting replaces them all)",
        _limits,
    )
    limits.add_argument("queue")
    limits.add_argument(
        "--concurrency", type=int, metavar="N", help=f"at most N running at once {per_call}"
    )
    limits.add_argument(
        "--rate",
        type=_rate,
        metavar="N/PERIOD",
        help=f"at most N claims per PERIOD, e.g. 100/60s {per_call}",
    )
    limits.add_argument("--burst", type=int, metavar="N", help=f"of the rate, N at once {per_call}")
    limits.add_argument(
        "--partition-concurrency",
        dest="partition_concurrency",
        type=int,
        metavar="N",
        help=f"at most N running at once per partition key {per_call}",
    )
    limits.add_argument(
        "--partition-rate",
        dest="partition_rate",
        type=_rate,
        metavar="N/PERIOD",
        help=f"at most N claims per PERIOD per partition key {per_call}",
    )
    limits.add_argument(
        "--partition-burst",
        dest="partition_burst",
        type=int,
        metavar="N",
        help=f"of the per-key rate, N at once {per_call}",
    )
    limits.add_argument(
        "--clear", action="store_true", help=f"remove every limit of the queue {per_call}"
    )
    connection_args(limits)

    purge = _command(commands, "purge", "delete the dead letters of a queue", _purge)
    purge.add_argument("queue")
    connection_args(purge)


def _redrive_run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if (args.all is None) == (not args.ids):
        parser.error("give job IDs or --all QUEUE (one of them)")  # exits 2
    return run_client(args, _redrive)


# -- schedules ------------------------------------------------------------------------

_NO_SCHEDULE = "no such schedule"
_UNITS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def every(value: str) -> float:
    """``--every``: ``30s``, ``5m``, ``5min``, ``2h``, ``1d``, ``1.5s`` or a bare number of
    seconds: the interval in seconds (> 0)."""
    text = value.strip().lower()
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(number) :] or "s"
    if unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"{value!r}: unknown unit {unit!r} (use s, m, h or d, e.g. 5m)"
        )
    try:
        seconds = float(number) * _UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r}: expected a number and a unit, e.g. 30s, 5m, 2h"
        ) from None
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"{value!r}: must be more than 0 seconds")
    return seconds


def timing(info: ScheduleInfo) -> str:
    """A schedule's timing in words: ``every 5 min``, ``cron 30 2 * * * (Europe/Paris)``."""
    if info.every_s is not None:
        return f"every {duration(info.every_s)}"
    return f"cron {info.cron} ({info.tz})"


def _state(info: ScheduleInfo) -> str:
    if info.paused:
        return "paused"
    return "active" if info.next_at is not None else "ended"


_SCHEDULE_COLUMNS = (
    Column("ID", limit=_CELL),
    Column("QUEUE", limit=_CELL),
    Column("TIMING", limit=_CELL),
    Column("STATE"),
    Column("NEXT"),
    Column("LAST"),
    Column("LAST JOB"),
    Column("FIRED", right=True),
)


def show_schedules(schedules: Sequence[ScheduleInfo], now: float) -> str:
    """The schedules as a table, one a row: timing in words, next and last fire times as
    local times with how far they are, the last job's id, how many jobs each made."""
    if not schedules:
        return "no schedules yet"
    rows = [
        [
            s.id,
            s.queue,
            timing(s),
            _state(s),
            when(s.next_at, now, short=True),
            when(s.last_at, now, short=True),
            s.last_job or "-",
            f"{s.fired:,}",
        ]
        for s in schedules
    ]
    return table(_SCHEDULE_COLUMNS, rows)


def show_schedule(info: ScheduleInfo, now: float) -> str:
    """One schedule, its fields one per line; the payload as indented JSON."""
    pairs = [
        ("id", info.id),
        ("queue", info.queue),
        ("timing", timing(info)),
        ("state", _state(info)),
        ("next", when(info.next_at, now)),
        ("last", when(info.last_at, now)),
        ("last job", info.last_job or "-"),
        ("fired", f"{info.fired:,}"),
        (
            "missed",
            info.missed + (f" (at most {info.max_catch_up})" if info.missed == "each" else ""),
        ),
        ("starts", when(info.start_at, now)),
        ("ends", when(info.end_at, now)),
        ("priority", str(info.priority)),
        ("max attempts", "-" if info.max_attempts is None else str(info.max_attempts)),
        ("expires", _seconds(info.expires_s)),
        ("time limit", _seconds(info.timeout_s)),
        ("partition", info.partition or "-"),
        ("created", when(info.created_at, now)),
        ("updated", when(info.updated_at, now)),
        ("payload", _pretty(info.payload)),
    ]
    return fields(pairs)


async def _schedule_set(client: Client, args: argparse.Namespace, now: float) -> Outcome:
    options = {
        name: getattr(args, name)
        for name in ("priority", "max_attempts", "expires_s", "timeout_s", "partition")
        if getattr(args, name) is not None
    }
    info = await client.set_schedule(
        args.id,
        args.queue,
        args.payload_value,
        cron=args.cron,
        every_s=args.every,
        tz=args.tz,
        start_at=args.start,
        end_at=args.end,
        missed=args.missed,
        max_catch_up=args.max_catch_up,
        paused=args.paused,
        **options,
    )
    text = f"set schedule {info.id}: {timing(info)} on {info.queue}"
    text += "; paused" if info.paused else f"; next {when(info.next_at, now)}"
    return Outcome(dataclasses.asdict(info), text)


async def _schedule_list(client: Client, args: argparse.Namespace, now: float) -> Outcome:
    found = await client.schedules()
    return Outcome([dataclasses.asdict(s) for s in found], show_schedules(found, now))


def _missing(schedule_id: str, data: Any) -> Outcome:
    return Outcome(data, None, [f"{schedule_id}: {_NO_SCHEDULE}"], failed=True)


async def _schedule_show(client: Client, args: argparse.Namespace, now: float) -> Outcome:
    info = await client.get_schedule(args.id)
    if info is None:
        return _missing(args.id, None)
    return Outcome(dataclasses.asdict(info), show_schedule(info, now))


async def _schedule_delete(client: Client, args: argparse.Namespace, now: float) -> Outcome:
    if not await client.delete_schedule(args.id):
        return _missing(args.id, {"deleted": False})
    return Outcome({"deleted": True}, f"deleted schedule {args.id} (the jobs it made stay)")


async def _schedule_pause(client: Client, args: argparse.Namespace, now: float) -> Outcome:
    info = await client.pause_schedule(args.id)
    if info is None:
        return _missing(args.id, {"schedule": None})
    return Outcome({"schedule": dataclasses.asdict(info)}, f"paused schedule {args.id}")


async def _schedule_resume(client: Client, args: argparse.Namespace, now: float) -> Outcome:
    info = await client.resume_schedule(args.id)
    if info is None:
        return _missing(args.id, {"schedule": None})
    text = f"resumed schedule {args.id}; next {when(info.next_at, now)}"
    return Outcome({"schedule": dataclasses.asdict(info)}, text)


async def _schedule_run(client: Client, args: argparse.Namespace, now: float) -> Outcome:
    job_id = await client.run_schedule(args.id)
    if job_id is None:
        return _missing(args.id, {"id": None})
    return Outcome({"id": job_id}, f"enqueued {job_id} from schedule {args.id}")


def _schedule_set_run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if (args.cron is None) == (args.every is None):
        parser.error("give --cron EXPR or --every INTERVAL (one of them)")  # exits 2
    try:
        args.payload_value = None if args.payload is None else decode_value(args.payload)
    except WireError as exc:
        say(f"the payload is not valid JSON: {exc}")
        return EXIT_USAGE
    return run_client(args, _schedule_set)


def add_schedule_commands(commands: Any) -> None:
    """``conveyor schedule set|list|show|delete|pause|resume|run``."""
    per_call = _PER_CALL
    schedule = commands.add_parser(
        "schedule",
        help="make, list and change schedules: jobs enqueued by cron or at an interval",
        description="Make, list and change schedules: jobs the broker enqueues at each "
        "tick of a cron expression or an interval (docs/schedules.md).",
    )
    actions = schedule.add_subparsers(dest="schedule_command", metavar="ACTION", required=True)

    put = _command(actions, "set", "make a schedule, or replace its definition", _schedule_set)
    put.set_defaults(run=lambda args: _schedule_set_run(put, args))
    put.add_argument("id", help="the schedule's name (A-Z a-z 0-9 . _ - :)")
    put.add_argument("queue", help="the queue its jobs go to")
    put.add_argument(
        "payload", nargs="?", help='each job\'s payload as JSON, e.g. \'{"kind": "daily"}\''
    )
    put.add_argument(
        "--cron",
        metavar="EXPR",
        help=f"five cron fields or @hourly, @daily, @weekly, @monthly, e.g. '30 2 * * *' "
        f"{per_call}",
    )
    put.add_argument(
        "--every",
        type=every,
        metavar="INTERVAL",
        help=f"or a tick every INTERVAL: 30s, 5m, 2h, 1d or seconds {per_call}",
    )
    put.add_argument(
        "--tz",
        default="UTC",
        metavar="ZONE",
        help=f"the IANA zone the cron is read in, e.g. Europe/Paris; default UTC {per_call}",
    )
    put.add_argument(
        "--start",
        type=_moment,
        metavar="WHEN",
        help=f"no tick before this: epoch seconds or an ISO 8601 date and time, local "
        f"unless it names a zone {per_call}",
    )
    put.add_argument(
        "--end", type=_moment, metavar="WHEN", help=f"no tick after this, as --start {per_call}"
    )
    put.add_argument(
        "--missed",
        choices=("skip", "once", "each"),
        default="once",
        help=f"ticks missed while the broker was down: make none, one, or one each; "
        f"default once {per_call}",
    )
    put.add_argument(
        "--max-catch-up",
        dest="max_catch_up",
        type=_limit,
        default=100,
        metavar="N",
        help=f"with --missed each, at most N missed ticks; default 100 {per_call}",
    )
    put.add_argument(
        "--priority", type=int, help=f"each job's priority; higher runs first {per_call}"
    )
    put.add_argument(
        "--max-attempts",
        dest="max_attempts",
        type=int,
        help=f"each job's attempts before it is dead {per_call}",
    )
    put.add_argument(
        "--expires",
        dest="expires_s",
        type=float,
        metavar="SECONDS",
        help=f"drop a job that has not run this long after its tick {per_call}",
    )
    put.add_argument(
        "--time-limit",
        dest="timeout_s",
        type=float,
        metavar="SECONDS",
        help=f"each job's handler time limit {per_call}",
    )
    put.add_argument("--partition", metavar="KEY", help=f"each job's partition key {per_call}")
    put.add_argument(
        "--paused", action="store_true", help=f"make it paused: no job until resumed {per_call}"
    )
    connection_args(put)

    listing = _command(actions, "list", "list every schedule", _schedule_list)
    connection_args(listing)
    for name, summary, action in (
        ("show", "show one schedule", _schedule_show),
        ("delete", "delete a schedule (the jobs it made stay)", _schedule_delete),
        ("pause", "stop a schedule making jobs", _schedule_pause),
        ("resume", "let a paused schedule make jobs again", _schedule_resume),
        ("run", "enqueue one job of a schedule now", _schedule_run),
    ):
        sub = _command(actions, name, summary, action)
        sub.add_argument("id", help="the schedule's id")
        connection_args(sub)
