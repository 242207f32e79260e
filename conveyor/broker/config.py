"""The broker's settings: flags, ``CONVEYOR_*`` environment variables, defaults.

Precedence: a command-line flag, then its environment variable, then the default.
Per-queue options come from a TOML file (``--queues FILE``) of the form::

    [queues.emails]
    visibility_timeout_s = 60
    max_attempts = 5
    concurrency = 10          # flow control (docs/contract.md, FLW-1)
    rate = 100                # claims per per_s seconds
    per_s = 60
    partition_concurrency = 2

    [schedules.nightly-report]    # a schedule (docs/schedules.md), set at every start
    queue = "reports"
    cron = "30 2 * * *"
    tz = "Europe/Paris"
    payload = { kind = "daily" }

``load_queues`` and ``load_schedules`` raise ``ConfigError`` with the file, the queue or
schedule, and the field named.
"""

from __future__ import annotations

import argparse
import datetime
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..sdk._loop import LOOP_HELP, LOOPS, loop_problem
from ..sdk._wire import DEFAULT_MAX_FRAME_BYTES, OPS, Op, Role, WireError, validate_fields
from .engine import LIMIT_FIELDS, InvalidArgument, JobTable, Limits, QueueOpts, ScheduleSpec

__all__ = [
    "Config",
    "ConfigError",
    "add_serve_arguments",
    "config_from_args",
    "load_queues",
    "load_schedules",
    "schedules_pausing",
]

ROLES = ("admin", "publish", "work", "read")


class ConfigError(Exception):
    """A setting is wrong; the message names it. The broker does not start."""


@dataclass(frozen=True)
class Config:
    """Everything ``conveyor serve`` can be told. Defaults suit a laptop on loopback."""

    host: str = "127.0.0.1"
    port: int = 8765
    store: str = "sqlite"
    db_path: str = "conveyor.db"
    sync: str = "full"
    # Start on files that lost commits or are damaged (the store refuses them otherwise).
    accept_loss: bool = False
    tokens: Mapping[str, frozenset[Role]] = field(default_factory=dict)
    origins: Sequence[str] = ()
    # Host names served besides IP literals and loopback names (broker/admission.py).
    allowed_hosts: Sequence[str] = ()
    tls_cert: str | None = None
    tls_key: str | None = None
    ping_interval_s: float = 20.0
    ping_timeout_s: float = 20.0
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_payload_bytes: int = 1 << 20
    sweep_interval_s: float = 1.0
    disconnect_grace_s: float = 5.0
    queue_opts: Mapping[str, QueueOpts] = field(default_factory=dict)
    # Flow-control limits of the queues file, set at every start (FLW-1).
    queue_limits: Mapping[str, Limits] = field(default_factory=dict)
    # The schedules of the queues file, set at every start (docs/schedules.md): a
    # definition the table already holds unchanged keeps its progress (SCH-5).
    schedules: Mapping[str, ScheduleSpec] = field(default_factory=dict)
    # Those of them whose table says ``paused``: the others keep the pause or resume made
    # at run time (a restart must not resume a schedule an operator paused).
    schedules_pausing: frozenset[str] = frozenset()
    # The queues file they came from, to name it when the job table refuses one.
    queues_file: str | None = None
    log_level: str = "info"
    loop: str = "auto"
    max_prefetch: int = 1000
    max_batch: int = 1000
    max_connections_per_token: int = 10_000
    max_connections: int = 20_000
    max_connections_per_address: int = 1000
    handshake_timeout_s: float = 10.0
    # Bad frames in a row after which a connection is closed with 1008.
    max_bad_frames: int = 10
    # Frames a connection may have waiting to be written before it is dropped as too slow.
    max_outbox_frames: int = 4096
    # Bytes a connection may have waiting to be written before its reading pauses and
    # the dispatcher pushes it nothing more, until the socket has taken them.
    max_unsent_bytes: int = 1 << 20

    @property
    def secure(self) -> bool:
        return self.tls_cert is not None

    def roles_for(self, token: str | None) -> frozenset[Role] | None:
        """The roles a token grants; every role when no tokens are set; ``None``: refused."""
        if not self.tokens:
            return frozenset(Role)
        if token is None:
            return frozenset()
        return self.tokens.get(token)


def _env(name: str) -> str | None:
    value = os.environ.get(f"CONVEYOR_{name}")
    return value if value else None


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``conveyor serve``; each defaults to its ``CONVEYOR_*`` variable."""
    add = parser.add_argument
    add("--host", help="address to bind (CONVEYOR_HOST; default 127.0.0.1)")
    add("--port", type=int, help="port to bind, 0 for any free one (CONVEYOR_PORT; 8765)")
    add(
        "--store",
        choices=["sqlite", "memory", "postgres"],
        help="where the job table lives: sqlite (durable, the default), memory "
        "(fast, forgets everything at exit) or postgres (a database several brokers "
        "may share; implied by a postgresql:// --db) (CONVEYOR_STORE)",
    )
    add(
        "--db",
        help="the SQLite file, or a postgresql://user@host/dbname URL for a table "
        "shared by several brokers (CONVEYOR_DB; default conveyor.db)",
    )
    add(
        "--sync",
        choices=["full", "normal"],
        help="full: a confirmed change survives power loss (default); normal: faster, "
        "survives a killed broker but maybe not an OS crash (CONVEYOR_SYNC)",
    )
    add(
        "--accept-loss",
        action="store_true",
        default=None,
        help="start even when the database's files lost commits or are damaged (a "
        "missing or damaged -wal, an empty database file, a damaged claim log), which is "
        "refused otherwise; the loss is logged (CONVEYOR_ACCEPT_LOSS=1)",
    )
    for role in ROLES:
        add(
            f"--{role}-token",
            action="append",
            metavar="TOKEN",
            help=f"a token granting the {role} role; repeatable "
            f"(CONVEYOR_{role.upper()}_TOKENS, comma-separated)",
        )
    add(
        "--origin",
        action="append",
        help="another allowed browser Origin; repeatable (CONVEYOR_ORIGINS, comma-separated)",
    )
    add(
        "--allowed-host",
        action="append",
        metavar="NAME",
        help="a host name clients may use in the Host header besides IP addresses and "
        "localhost; '.example.com' allows a domain, '*' any name; repeatable "
        "(CONVEYOR_ALLOWED_HOSTS, comma-separated)",
    )
    add(
        "--max-connections",
        type=int,
        help="open connections at most, in all (CONVEYOR_MAX_CONNECTIONS; 20000)",
    )
    add(
        "--max-connections-per-address",
        type=int,
        help="open connections at most from one client address "
        "(CONVEYOR_MAX_CONNECTIONS_PER_ADDRESS; 1000)",
    )
    add("--tls-cert", help="TLS certificate chain, PEM (CONVEYOR_TLS_CERT)")
    add("--tls-key", help="TLS private key, PEM (CONVEYOR_TLS_KEY)")
    add(
        "--ping-interval",
        type=float,
        help="seconds between keepalive pings (CONVEYOR_PING_INTERVAL; 20)",
    )
    add("--ping-timeout", type=float, help="seconds to wait for a pong (CONVEYOR_PING_TIMEOUT; 20)")
    add(
        "--max-frame-bytes",
        type=int,
        help="largest frame accepted (CONVEYOR_MAX_FRAME_BYTES; 1048576)",
    )
    add(
        "--max-payload-bytes",
        type=int,
        help="largest encoded payload (CONVEYOR_MAX_PAYLOAD_BYTES; 1048576)",
    )
    add(
        "--sweep-interval",
        type=float,
        help="seconds between expiry sweeps (CONVEYOR_SWEEP_INTERVAL; 1)",
    )
    add(
        "--disconnect-grace",
        type=float,
        help="seconds a dropped worker's jobs wait (CONVEYOR_DISCONNECT_GRACE; 5)",
    )
    add(
        "--queues",
        metavar="FILE",
        help="TOML file of per-queue options, limits and schedules (CONVEYOR_QUEUES)",
    )
    add(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="what the broker logs (CONVEYOR_LOG_LEVEL; info)",
    )
    add(
        "--loop",
        choices=LOOPS,
        help=LOOP_HELP,
    )


def _pick(flag: Any, env: str, convert: Any, default: Any) -> Any:
    if flag is not None:
        return flag
    raw = _env(env)
    if raw is None:
        return default
    try:
        return convert(raw)
    except ValueError:
        raise ConfigError(f"CONVEYOR_{env}: cannot read {raw!r} as {convert.__name__}") from None


def _yes(raw: str) -> bool:
    """An environment variable's yes or no: 1/true/yes or 0/false/no."""
    answer = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
    try:
        return answer[raw.strip().lower()]
    except KeyError:
        raise ValueError(raw) from None


_yes.__name__ = "1 or 0"  # (named in _pick's message)


def _tokens(args: argparse.Namespace) -> dict[str, frozenset[Role]]:
    tokens: dict[str, set[Role]] = {}
    for role in ROLES:
        given = getattr(args, f"{role}_token") or []
        env = _env(f"{role.upper()}_TOKENS")
        if env:
            given = [*given, *(t.strip() for t in env.split(",") if t.strip())]
        for token in given:
            if not token:
                raise ConfigError(f"--{role}-token: a token must not be empty")
            granted = tokens.setdefault(token, set())
            # admin may do everything: it includes every other role.
            granted.update(Role) if role == "admin" else granted.add(Role(role))
    return {token: frozenset(roles) for token, roles in tokens.items()}


def config_from_args(args: argparse.Namespace) -> Config:
    """A ``Config`` from parsed ``serve`` flags and the environment; raises ``ConfigError``."""
    origins = list(args.origin or [])
    env_origins = _env("ORIGINS")
    if env_origins:
        origins += [o.strip() for o in env_origins.split(",") if o.strip()]
    allowed_hosts = list(args.allowed_host or [])
    env_hosts = _env("ALLOWED_HOSTS")
    if env_hosts:
        allowed_hosts += [h.strip() for h in env_hosts.split(",") if h.strip()]
    queues_file = _pick(args.queues, "QUEUES", str, None)
    queue_opts, queue_limits = load_queues(Path(queues_file)) if queues_file else ({}, {})
    schedules = load_schedules(Path(queues_file)) if queues_file else {}
    pausing = schedules_pausing(Path(queues_file)) if queues_file else frozenset()
    db_path = _pick(args.db, "DB", str, "conveyor.db")
    store = _pick(args.store, "STORE", str, None)
    if store is None:
        store = "postgres" if is_postgres_url(db_path) else "sqlite"
    config = Config(
        host=_pick(args.host, "HOST", str, "127.0.0.1"),
        port=_pick(args.port, "PORT", int, 8765),
        store=store,
        db_path=db_path,
        sync=_pick(args.sync, "SYNC", str, "full"),
        accept_loss=_pick(args.accept_loss, "ACCEPT_LOSS", _yes, False),
        tokens=_tokens(args),
        origins=tuple(origins),
        allowed_hosts=tuple(allowed_hosts),
        max_connections=_pick(args.max_connections, "MAX_CONNECTIONS", int, 20_000),
        max_connections_per_address=_pick(
            args.max_connections_per_address, "MAX_CONNECTIONS_PER_ADDRESS", int, 1000
        ),
        tls_cert=_pick(args.tls_cert, "TLS_CERT", str, None),
        tls_key=_pick(args.tls_key, "TLS_KEY", str, None),
        ping_interval_s=_pick(args.ping_interval, "PING_INTERVAL", float, 20.0),
        ping_timeout_s=_pick(args.ping_timeout, "PING_TIMEOUT", float, 20.0),
        max_frame_bytes=_pick(
            args.max_frame_bytes, "MAX_FRAME_BYTES", int, DEFAULT_MAX_FRAME_BYTES
        ),
        max_payload_bytes=_pick(args.max_payload_bytes, "MAX_PAYLOAD_BYTES", int, 1 << 20),
        sweep_interval_s=_pick(args.sweep_interval, "SWEEP_INTERVAL", float, 1.0),
        disconnect_grace_s=_pick(args.disconnect_grace, "DISCONNECT_GRACE", float, 5.0),
        queue_opts=queue_opts,
        queue_limits=queue_limits,
        schedules=schedules,
        schedules_pausing=pausing,
        queues_file=queues_file,
        log_level=_pick(args.log_level, "LOG_LEVEL", str, "info"),
        loop=_pick(args.loop, "LOOP", str, "auto"),
    )
    check(config)
    return config


def is_postgres_url(db: str) -> bool:
    """Whether ``--db`` names a PostgreSQL database rather than a SQLite file."""
    return db.startswith(("postgresql://", "postgres://"))


def check(config: Config) -> None:
    """Raise ``ConfigError`` for a setting out of range."""
    if config.store not in ("sqlite", "memory", "postgres"):
        raise ConfigError(
            f"store: unknown store {config.store!r} (choose: sqlite, memory, postgres)"
        )
    if config.store == "postgres" and not is_postgres_url(config.db_path):
        raise ConfigError(
            f"db: the postgres store needs a postgresql://user@host/dbname URL, "
            f"got {config.db_path!r}"
        )
    if config.store == "sqlite" and is_postgres_url(config.db_path):
        raise ConfigError("db: a postgresql:// URL is a PostgreSQL database: drop --store sqlite")
    if config.sync not in ("full", "normal"):
        raise ConfigError(f"sync: must be full or normal, got {config.sync!r}")
    if not 0 <= config.port <= 65535:
        raise ConfigError(f"port: must be 0 to 65535, got {config.port}")
    if (config.tls_cert is None) != (config.tls_key is None):
        raise ConfigError("tls: give both --tls-cert and --tls-key, or neither")
    for name in ("ping_interval_s", "ping_timeout_s", "sweep_interval_s"):
        if not getattr(config, name) > 0:
            raise ConfigError(f"{name}: must be > 0, got {getattr(config, name)}")
    if not config.disconnect_grace_s >= 0:
        raise ConfigError(f"disconnect_grace_s: must be >= 0, got {config.disconnect_grace_s}")
    for name in ("max_frame_bytes", "max_payload_bytes"):
        if getattr(config, name) < 1024:
            raise ConfigError(f"{name}: must be at least 1024, got {getattr(config, name)}")
    if config.max_prefetch < 16:
        raise ConfigError(
            f"max_prefetch: must be at least 16 (the default prefetch), got {config.max_prefetch}"
        )
    for name in ("max_connections", "max_connections_per_address"):
        if getattr(config, name) < 1:
            raise ConfigError(f"{name}: must be at least 1, got {getattr(config, name)}")
    loop = loop_problem(config.loop)
    if loop is not None:
        raise ConfigError(loop)
    if config.log_level not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"log_level: unknown level {config.log_level!r}")


def _read_toml(path: Path) -> dict[str, Any]:
    """The queues file's tables; ``ConfigError`` for a file unreadable or not TOML, or a
    top-level key other than ``queues`` and ``schedules``."""
    try:
        with path.open("rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    unknown = set(data) - {"queues", "schedules"}
    if unknown:
        raise ConfigError(
            f"{path}: unknown top-level key {sorted(unknown)[0]!r}; "
            "use [queues.NAME] or [schedules.ID]"
        )
    return data


def load_queues(path: Path) -> tuple[dict[str, QueueOpts], dict[str, Limits]]:
    """Per-queue options, and the limits of the queues that set any, from a TOML file;
    raises ``ConfigError`` naming what is wrong."""
    data = _read_toml(path)
    queues = data.get("queues", {})
    if not isinstance(queues, dict):
        raise ConfigError(f"{path}: 'queues' must be a table of [queues.NAME] tables")
    option_names = {f.name for f in fields(QueueOpts)}
    known = option_names | set(LIMIT_FIELDS)
    result = {}
    limits: dict[str, Limits] = {}
    probe = JobTable(clock=lambda: 0.0)
    for name, table in queues.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: [queues.{name}] must be a table")
        extra = set(table) - known
        if extra:
            raise ConfigError(
                f"{path}: [queues.{name}] {sorted(extra)[0]}: unknown option "
                f"(known: {', '.join(sorted(known))})"
            )
        try:
            opts = QueueOpts(**{k: v for k, v in table.items() if k in option_names})
            queue = probe.queue(name, opts)  # the engine's own guards: the messages match
            if any(k in LIMIT_FIELDS for k in table):
                queue.set_limits(Limits(**{k: v for k, v in table.items() if k in LIMIT_FIELDS}))
                limits[name] = queue.limits
        except InvalidArgument as exc:
            raise ConfigError(f"{path}: [queues.{name}] {exc}") from None
        result[name] = opts
    return result, limits


_SCHEDULE_SPEC = OPS[Op.SET_SCHEDULE].by_name["schedule"]
_SCHEDULE_MEMBERS = {f.name for f in _SCHEDULE_SPEC.items} - {"id"}


def schedules_pausing(path: Path) -> frozenset[str]:
    """The ids of the queues file's schedules whose table sets ``paused`` (read after
    ``load_schedules`` checked the file)."""
    tables = _read_toml(path).get("schedules", {})
    return frozenset(
        schedule_id
        for schedule_id, table in tables.items()
        if isinstance(table, dict) and "paused" in table
    )


def load_schedules(path: Path) -> dict[str, ScheduleSpec]:
    """The ``[schedules.ID]`` tables of the queues file, as the schedules they define
    (the members are ``set_schedule``'s: ``queue``, ``cron`` or ``every_s``, ``tz``,
    ``payload``...; ``start_at`` and ``end_at`` may be TOML date-times with an offset).

    Each is checked as the broker would check it, by the engine's own ``set_schedule`` on
    a table of its own, so a bad one stops the start, not the first tick: ``ConfigError``
    naming the file, the schedule and the field."""
    data = _read_toml(path)
    tables = data.get("schedules", {})
    if not isinstance(tables, dict):
        raise ConfigError(f"{path}: 'schedules' must be a table of [schedules.ID] tables")
    probe = JobTable(clock=lambda: 0.0)
    found: dict[str, ScheduleSpec] = {}
    for schedule_id, table in tables.items():
        where = f"{path}: [schedules.{schedule_id}]"
        if not isinstance(table, dict):
            raise ConfigError(f"{where} must be a table")
        extra = set(table) - _SCHEDULE_MEMBERS
        if extra:
            raise ConfigError(
                f"{where} {sorted(extra)[0]}: unknown option "
                f"(known: {', '.join(sorted(_SCHEDULE_MEMBERS))})"
            )
        values = {name: _instant(value) for name, value in table.items()}
        try:
            checked = validate_fields(
                OPS[Op.SET_SCHEDULE], {"schedule": {"id": schedule_id, **values}}
            )["schedule"]
        except WireError as exc:  # a member of the wrong type
            raise ConfigError(f"{where} {exc.message.removeprefix('schedule.')}") from None
        try:
            spec = ScheduleSpec(**checked)
            probe.set_schedule(spec)  # the engine's own checks, on a table of its own
        except InvalidArgument as exc:
            raise ConfigError(f"{where} {exc}") from None
        found[schedule_id] = spec
    return found


def _instant(value: Any) -> Any:
    """A TOML date-time as Unix seconds (one with no offset is read as local time, as
    ``--run-at`` reads one); any other value as it is."""
    if isinstance(value, datetime.datetime):
        return value.timestamp()
    return value
