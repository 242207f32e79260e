"""The SQLite store: the job table in one file, written by group commit.

Durability (docs in README, "What is promised"): the database runs in WAL mode. With
``sync="full"`` (the default) the WAL is fsynced after every commit, before the commit's
replies are released, so a committed batch survives an OS crash or power loss, not only a
killed process (pushes go once written, before the fsync: see ``broker/commit.py``).
``sync="normal"`` fsyncs only at checkpoints: a killed process loses nothing committed,
but an OS crash may lose the last batches. It is faster, and weaker, and must be asked
for.

A commit is written into the WAL on the caller's (the event loop's) thread, with SQLite's
own ``synchronous=NORMAL``: no fsync inside it, tens of microseconds for a batch. Handing
the write to a thread cost several times the write itself: Python's sqlite3 lets go of
the GIL around every row's step, so a thread writing while the loop is busy waited for
the GIL once per row. With ``full``, the WAL is then fsynced (``fdatasync`` of the WAL
file, which is what SQLite's ``synchronous=FULL`` does at a commit in WAL mode) before
the gate releases the commit's replies: by a helper process (``_wal_sync.py``), while the
loop goes on with the next requests and commits (see ``commit_now``). The one other part
that fsyncs, the checkpoint that copies the WAL back into the database, comes with every
``_CHECKPOINT_EVERY``-th commit (``_CHECKPOINT_EVERY_FULL``-th with ``full``; SQLite's
automatic checkpoint would run inside some commit on the event loop and stall it for
milliseconds): with ``normal`` beside the commits, on a thread and connection of its own,
until the WAL must restart (``_RESTART_FRAMES``); with ``full``, and for a restart, on
the writer thread after that commit's write (the commit is written on the loop, and its
pushes leave then), the commits waiting. Reading happens once, at ``load``.

Claims. Most of a drain's writes are claims, and an UPDATE of each claimed row was half
of a drain's time in SQLite. A commit's claims (``Changes.claims``) are instead written
as one record, ``claims(commit_no, texts, numbers)`` (see ``_pack_claims``). ``load``
lays each entry over its row when the claim's commit came after the row was last written
whole (``jobs.v``, set by every update; a row's insert leaves it 0, and no claim precedes
an insert). The store remembers which record holds each row's live claim; a record whose
every row was since acked, rewritten or claimed again is deleted in the same commit, so
the table never holds more records than there are jobs under a lease.

The claim log. A commit of claims only (no row inserted or rewritten: a drain's refill
after an ack) is first appended to ``<db>-claims`` (``_claim_log.py``), and ``written``
is called then, before the SQLite write: the claims survive a killed broker once that one
``write`` returns, so the pushes need not wait for SQLite: in a 1-worker drain the
worker no longer sits idle while the broker writes each refill's commit (the drains
measured with and without the log: docs/benchmarks.md). ``load`` lays claims that only
the log holds over their rows as it does a record's, writes them into SQLite, and
empties the log; its lease count raises the table's, so no lease is issued twice.

What the files must hold. ``load`` refuses (``StoreError``) what it cannot account for,
rather than start on an empty or partial table: a database file of 0 bytes, a missing
one that its commit marker (``_marker.py``, ``<db>-commits``) says held commits, files
that hold an older commit than the marker records (a ``-wal`` file deleted or damaged),
a damaged marker, or a claim log damaged other than in its torn last record. With
``accept_loss`` it starts anyway, logs a warning saying what was lost, and records the
files as they are as the new baseline. Every commit updates the marker once written (one
``pwrite``, no fsync: see ``_marker.py`` for why that is enough). A new database is made
under a temporary name and renamed into place once whole, so a file of 0 bytes is never
one of ours.

Schedules (version 5) are rows of ``schedules``, whole, written in the transaction of the
commit that changed them: the jobs a tick made and the schedule's next tick are on the
disk together or not at all. A commit holding one never goes to the claim log.

Schema versions live in ``PRAGMA user_version``; ``_MIGRATIONS[i]`` takes a database
from version ``i`` to ``i + 1``. A file that is not SQLite, is another program's
database, or was made by a newer Conveyor is refused with a ``StoreError``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import sqlite3
import sys
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from ..engine import (
    CLAIM_FIELDS,
    DEP_FIELDS,
    QUEUE_FIELDS,
    ROW_FIELDS,
    SCHEDULE_FIELDS,
    UPDATE_FIELDS,
    Changes,
    JobTable,
)
from ._base import StoreError
from ._claim_log import ClaimLog, LoggedClaims
from ._marker import CommitMarker, Marked
from ._wal_sync import WalSyncer

__all__ = ["SqliteStore"]

log = logging.getLogger("conveyor.store")

# "Conv": marks a database as Conveyor's, so another program's file is never mistaken.
_APPLICATION_ID = 0x436F6E76

_SCHEMA_V1 = """
CREATE TABLE jobs (
    seq INTEGER PRIMARY KEY,
    queue TEXT NOT NULL,
    state TEXT NOT NULL,
    payload BLOB NOT NULL,
    priority INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL,
    visibility_timeout_s REAL NOT NULL,
    backoff_base_s REAL NOT NULL,
    backoff_max_s REAL NOT NULL,
    enqueued_at REAL NOT NULL,
    ready_at REAL NOT NULL,
    expires_at REAL,
    worker_id TEXT,
    deadline REAL,
    lease TEXT,
    last_error TEXT,
    died_at REAL,
    key TEXT
);
CREATE TABLE queues (
    name TEXT PRIMARY KEY,
    paused INTEGER NOT NULL,
    enqueued INTEGER NOT NULL,
    completed INTEGER NOT NULL,
    retried INTEGER NOT NULL,
    dead INTEGER NOT NULL,
    expired INTEGER NOT NULL,
    cancelled INTEGER NOT NULL
);
CREATE TABLE meta (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    id_prefix TEXT NOT NULL,
    seq INTEGER NOT NULL,
    leases_issued INTEGER NOT NULL
);
"""

# Version 2: claims are written as one record per commit (see "Claims" in the module
# docstring). ``jobs.v`` is the commit that last wrote a row whole (0: its insert, or any
# write before version 2); ``meta.commits`` counts commits.
_SCHEMA_V2 = """
ALTER TABLE jobs ADD COLUMN v INTEGER NOT NULL DEFAULT 0;
ALTER TABLE meta ADD COLUMN commits INTEGER NOT NULL DEFAULT 0;
CREATE TABLE claims (
    commit_no INTEGER PRIMARY KEY,
    texts TEXT NOT NULL,
    numbers BLOB NOT NULL
);
"""

# Version 3: a job's own handler time limit (``timeout_s``, docs/worker.md); NULL for the
# jobs of older files, which had none.
_SCHEMA_V3 = """
ALTER TABLE jobs ADD COLUMN timeout_s REAL;
"""

# Version 4: flow control (docs/contract.md, FLW-3 and FLW-9): a job's partition key, and
# a queue's limits as JSON text; NULL for none, as in every older file.
_SCHEMA_V4 = """
ALTER TABLE jobs ADD COLUMN partition TEXT;
ALTER TABLE queues ADD COLUMN limits TEXT;
"""

# Version 5: schedules (docs/contract.md, SCH-1 on), a row each, as SCHEDULE_FIELDS: the
# definition (its payload as JSON bytes, as a job's), then its progress. A commit writes
# the jobs a tick made and the schedule's next tick in one transaction (SCH-3).
_SCHEMA_V5 = """
CREATE TABLE schedules (
    id TEXT PRIMARY KEY,
    queue TEXT NOT NULL,
    payload BLOB NOT NULL,
    cron TEXT,
    every_s REAL,
    tz TEXT NOT NULL,
    start_at REAL,
    end_at REAL,
    missed TEXT NOT NULL,
    max_catch_up INTEGER NOT NULL,
    paused INTEGER NOT NULL,
    priority INTEGER NOT NULL,
    max_attempts INTEGER,
    visibility_timeout_s REAL,
    expires_s REAL,
    backoff_base_s REAL,
    timeout_s REAL,
    partition TEXT,
    next_at REAL,
    last_at REAL,
    last_job TEXT,
    fired INTEGER NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
"""

# Version 6: results (docs/contract.md, RES-1 on): the result an ack stored, as JSON
# bytes, and when the job completed; NULL for every job of an older file, none of which
# was kept once acked.
_SCHEMA_V6 = """
ALTER TABLE jobs ADD COLUMN result BLOB;
ALTER TABLE jobs ADD COLUMN completed_at REAL;
"""

# Version 7: progress (docs/contract.md, PRG-1 on): the latest progress a lease holder
# reported, as JSON bytes; NULL for none, as for every job of an older file. Written apart
# from the row's other fields, the latest of each job once per commit (PRG-2).
_SCHEMA_V7_PROGRESS = """
ALTER TABLE jobs ADD COLUMN progress BLOB;
"""

# Version 8: dependencies (docs/contract.md, DEP-1 on): a job's edges, a row each, as DEP_FIELDS:
# the dependent's seq, its dependency's seq and place in its ``after``, whether that
# dependency's ack landed and the result it stored. The rows of a job go with it. A
# job waiting for its dependencies has state 'waiting' (a state text like the others).
_SCHEMA_DEPS = """
CREATE TABLE deps (
    seq INTEGER NOT NULL,
    dep INTEGER NOT NULL,
    pos INTEGER NOT NULL,
    met INTEGER NOT NULL,
    result BLOB,
    PRIMARY KEY (seq, dep)
) WITHOUT ROWID;
"""

# _MIGRATIONS[i] upgrades a database at user_version i to i + 1.
_MIGRATIONS: tuple[str, ...] = (
    _SCHEMA_V1,
    _SCHEMA_V2,
    _SCHEMA_V3,
    _SCHEMA_V4,
    _SCHEMA_V5,
    _SCHEMA_V6,
    _SCHEMA_V7_PROGRESS,
    _SCHEMA_DEPS,
)
_SWITCH_INTERVAL_S = 0.0005
# Commits per checkpoint with sync="normal". A commit adds a few pages to the WAL, so this
# keeps the WAL to some MB ("normal" restarts it less often, see _RESTART_FRAMES).
_CHECKPOINT_EVERY = 50
# The same with sync="full", where each checkpointing commit goes whole to the writer
# thread and the frames of the commits behind it wait (see commit). Fewer and larger
# checkpoints: the pages a run of commits rewrites (meta, the queue's row, the same jobs
# leaves) are copied once, not once per 50 commits, and fewer jobs meet a stall (the
# latency p99 measured both ways, and the WAL's size: docs/benchmarks.md).
_CHECKPOINT_EVERY_FULL = 250
# sync="normal": the checkpoints run beside the commits (_side_checkpoint), which cannot
# restart the WAL while commits keep coming; once the WAL holds more frames than this
# (16 MiB of 4 KiB pages), the next checkpoint is a whole one that the commits wait for.
# Beside the commits, a drain's checkpoints no longer stall it every 50 commits.
_RESTART_FRAMES = 4096
# At each start the lease count goes on this far above the count the file holds, which
# is made durable before any lease is issued. A power loss can forget leases handed out
# before their commit's fsync (a push leaves once its claims are written, or once they
# are in the claim log, which is never fsynced), and a worker may still hold one: no
# lease issued after the restart repeats it, unless a single run issued 2**32 leases
# past its last fsync.
_LEASE_GAP = 1 << 32
_VERSION = len(_MIGRATIONS)

_UPSERT_JOB = (
    f"INSERT OR REPLACE INTO jobs ({', '.join(ROW_FIELDS)}) "
    f"VALUES ({', '.join('?' for _ in ROW_FIELDS)})"
)
# A stored row's changing fields only (a retry or a heartbeat does not rewrite the
# payload), and the commit that wrote them: (*UPDATE_FIELDS tuple, commit number).
_UPDATE_JOB = (
    "UPDATE jobs SET "
    + ", ".join(f"{name} = ?{i}" for i, name in enumerate(UPDATE_FIELDS[:-1], 1))
    + f", v = ?{len(UPDATE_FIELDS) + 1} WHERE seq = ?{len(UPDATE_FIELDS)}"
)
# Where the CLAIM_FIELDS sit in a ROW_FIELDS tuple (a claim record laid over its row).
_CLAIM_AT = tuple(ROW_FIELDS.index(name) for name in CLAIM_FIELDS)
_UPSERT_SCHEDULE = (
    f"INSERT OR REPLACE INTO schedules ({', '.join(SCHEDULE_FIELDS)}) "
    f"VALUES ({', '.join('?' for _ in SCHEDULE_FIELDS)})"
)
_INSERT_EDGE = (
    f"INSERT OR REPLACE INTO deps ({', '.join(DEP_FIELDS)}) "
    f"VALUES ({', '.join('?' for _ in DEP_FIELDS)})"
)
_UPSERT_QUEUE = (
    f"INSERT INTO queues ({', '.join(QUEUE_FIELDS)}) "
    f"VALUES ({', '.join('?' for _ in QUEUE_FIELDS)}) ON CONFLICT (name) DO UPDATE SET "
    + ", ".join(f"{name} = excluded.{name}" for name in QUEUE_FIELDS[1:])
)


def _nothing() -> None:
    pass


class SqliteStore:
    """A job table kept in the SQLite file at ``path``. See the module docstring."""

    name = "sqlite"
    durable = True

    def __init__(
        self,
        path: str | Path,
        *,
        sync: str = "full",
        accept_loss: bool = False,
    ) -> None:
        """``accept_loss``: start even on files that lost commits or are damaged (see
        "What the files must hold" in the module docstring), logging what was lost."""
        if sync not in ("full", "normal"):
            raise StoreError(f"sync: must be 'full' or 'normal', got {sync!r}")
        self.path = Path(path)
        self.sync = sync
        self.accept_loss = accept_loss
        self._marker = CommitMarker(self.path.with_name(self.path.name + "-commits"))
        # The last commit known to be fsynced (set at checkpoints, read by write).
        self._durable_no = 0
        self._db: sqlite3.Connection | None = None
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="conveyor-sqlite")
        # sync="normal": checkpoints beside the commits (see _side_checkpoint).
        self._checkpointer = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="conveyor-checkpoint"
        )
        self._side: Future[None] | None = None
        self._side_db: sqlite3.Connection | None = None
        self._wal_frames = 0  # frames in the WAL at the last checkpoint
        self.side_checkpoints = 0  # checkpoints made beside the commits (for tests)
        self._lock = threading.Lock()
        self.commits = 0  # transactions written (for metrics)
        # sync="full": every commit waits for an fsync of the WAL.
        self.slow_commits = sync == "full"
        self._since_checkpoint = 0
        self._wal_fd: int | None = None  # sync="full": the WAL, opened by load
        self._syncer: WalSyncer | None = None  # sync="full": the commits' fsyncs
        self._thread_syncs = 0  # WAL fsyncs of checkpointing commits (writer thread)
        self.checkpoints = 0  # checkpoints made (for tests)
        # Claim records (see "Claims" above): the number of the last commit, the record
        # holding each row's live claim (seq -> commit number), and how many live claims
        # each record holds (commit number -> count).
        self._commit_no = 0
        self._claim_of: dict[int, int] = {}
        self._claims_live: dict[int, int] = {}
        # Claims pushed before their commit is written (see _claim_log.py); open once loaded.
        self._claim_log: ClaimLog | None = None

    # -- opening --------------------------------------------------------------------------

    def _create(self) -> None:
        """Make a new, empty database at ``path``: whole under a temporary name (in WAL
        mode, at the current schema), fsynced, then renamed into place, so that a file
        of 0 bytes at ``path`` is never one this store made. Raises ``StoreError``."""
        new = self.path.with_name(self.path.name + ".new")
        try:
            for leftover in (new, Path(f"{new}-wal"), Path(f"{new}-shm")):
                leftover.unlink(missing_ok=True)  # (of a start killed while making it)
            db = sqlite3.connect(new, isolation_level=None)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                _migrate(db, 0)
            finally:
                db.close()  # the WAL goes back into the file, which SQLite fsyncs
            os.replace(new, self.path)
            directory = os.open(self.path.parent, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"{self.path}: cannot create: {exc}") from None

    def _open(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open: {exc}") from None
        try:
            app_id = db.execute("PRAGMA application_id").fetchone()[0]
            version = db.execute("PRAGMA user_version").fetchone()[0]
            tables = db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if app_id != _APPLICATION_ID and (tables or version or app_id):
                raise StoreError(
                    f"{self.path}: this is not a Conveyor database (another program's SQLite file)"
                )
            if version > _VERSION:
                raise StoreError(
                    f"{self.path}: made by a newer Conveyor (schema {version}; "
                    f"this one knows up to {_VERSION})"
                )
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"{self.path}: cannot switch to WAL mode (got {mode})")
            # No fsync inside a commit: with sync="full" the store fsyncs the WAL itself,
            # off the event loop (see the module docstring and commit).
            db.execute("PRAGMA synchronous=NORMAL")
            # Bound the WAL file: after a checkpoint it is cut back to this size.
            db.execute("PRAGMA journal_size_limit=67108864")
            # The store checkpoints itself, every so many commits (see commit).
            db.execute("PRAGMA wal_autocheckpoint=0")
            _migrate(db, version)
        except StoreError:
            db.close()
            raise
        except sqlite3.DatabaseError as exc:
            db.close()
            raise StoreError(f"{self.path}: unreadable or corrupt database: {exc}") from None
        return db

    def load(
        self,
        *,
        clock: Callable[[], float],
        rng: random.Random,
        max_payload_bytes: int,
        id_prefix: str | None = None,
    ) -> JobTable:
        """Open (creating or upgrading) the file and rebuild the table from it.

        ``id_prefix`` applies only to a new, empty database (a stored one keeps its own).
        Raises ``StoreError`` (the store is then closed), also when another broker has the
        database open: the store locks it, through its claim log, until ``close``.
        """
        if not self.path.parent.is_dir():  # (else the claim log's path would be named)
            raise StoreError(f"{self.path}: cannot open: no directory {self.path.parent}")
        # First of all, before anything is read or written: no other store has it open.
        log = self._claim_log = ClaimLog.lock(self._claim_log_path())
        try:
            return self._load(
                log, clock=clock, rng=rng, max_payload_bytes=max_payload_bytes, id_prefix=id_prefix
            )
        except BaseException:
            log.discard_if_empty()
            self.close()
            raise

    def _load(
        self,
        log: ClaimLog,
        *,
        clock: Callable[[], float],
        rng: random.Random,
        max_payload_bytes: int,
        id_prefix: str | None,
    ) -> JobTable:
        marked = self._account()
        db = self._open()
        if self.slow_commits:
            # Before the first commit, so that no commit waits for the helper to start;
            # and before the store counts as open, so that no commit goes unsynced.
            try:
                self._syncer = WalSyncer(self._open_wal(), str(self.path))
            except StoreError:
                db.close()
                if self._wal_fd is not None:
                    os.close(self._wal_fd)
                    self._wal_fd = None
                raise
        self._db = db
        # The writer thread needs the GIL back the moment its fsync returns, or every
        # reply of the batch waits while the busy event loop runs on: with Python's
        # default switch interval commits took several times their disk time.
        sys.setswitchinterval(min(sys.getswitchinterval(), _SWITCH_INTERVAL_S))
        try:
            meta = db.execute("SELECT id_prefix, seq, leases_issued, commits FROM meta").fetchone()
            if meta is None:
                table = JobTable(
                    clock=clock, rng=rng, max_payload_bytes=max_payload_bytes, id_prefix=id_prefix
                )
                table.start_journal()
                # (A log beside a database that never committed holds nothing of it.)
                self._read_log(log, table.id_prefix)
                log.reset()
                self._marker.baseline(0, 0)
                return table
            self._commit_no = meta[3]
            claims = self._read_claims(db)
            logged = self._read_log(log, meta[0])
            late = [record for record in logged if record.commit_no > meta[3]]
            leases_issued = meta[2]
            for record in late:  # pushed, but the broker stopped before their commit
                for entry in _unpack_claims(record.texts, record.numbers):
                    claims[entry[-1]] = (record.commit_no, entry)
                leases_issued = max(leases_issued, record.leases_issued)
                self._commit_no = max(self._commit_no, record.commit_no)
            leases_issued += _LEASE_GAP
            queues = db.execute(f"SELECT {', '.join(QUEUE_FIELDS)} FROM queues").fetchall()
            columns = ", ".join(ROW_FIELDS)
            if claims:
                rows = self._with_claims(
                    db.execute(f"SELECT {columns}, v FROM jobs ORDER BY seq"), claims
                )
            else:  # no job was under a lease: the rows as they are
                rows = db.execute(f"SELECT {columns} FROM jobs ORDER BY seq")
            schedules = db.execute(f"SELECT {', '.join(SCHEDULE_FIELDS)} FROM schedules")
            progress = db.execute("SELECT seq, progress FROM jobs WHERE progress IS NOT NULL")
            edges = db.execute(f"SELECT {', '.join(DEP_FIELDS)} FROM deps").fetchall()
            table = JobTable.restore(
                (meta[0], meta[1], leases_issued),
                queues,
                rows,
                clock=clock,
                rng=rng,
                max_payload_bytes=max_payload_bytes,
                schedules=schedules,
                progress=progress.fetchall(),
                edges=edges,
            )
            if late:
                self._keep_logged(db, late, claims, leases_issued)
            else:
                db.execute("UPDATE meta SET leases_issued = ?", (leases_issued,))
            self._sync_at_load()
            log.reset()
            self._baseline(marked)
            return table
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: unreadable or corrupt database: {exc}") from None
        except (ValueError, TypeError, IndexError) as exc:
            raise StoreError(f"{self.path}: a stored row makes no sense: {exc}") from None

    def _lost(self, what: str) -> None:
        """Files that lost something, or are damaged, as ``what`` says: refused with a
        ``StoreError``, or with ``accept_loss`` a warning, and the start goes on."""
        if not self.accept_loss:
            raise StoreError(f"{what}; start with --accept-loss to accept the loss")
        log.warning("%s; starting anyway (--accept-loss)", what)

    def _account(self) -> Marked | None:
        """Before anything is opened for writing: what the commit marker records (or
        ``None``); refuse (``_lost``) a database file that is empty, one missing while the
        marker says it held commits, and files that hold fewer commits than it records
        (``_check_held``). Makes a new database where there is none."""
        try:
            marked = self._marker.read()
        except StoreError as exc:
            self._lost(str(exc))
            marked = None
        recorded = f"{self._marker.path} records commit {marked.written}" if marked else ""
        try:
            size = self.path.stat().st_size if self.path.is_file() else None
        except OSError:
            size = None  # (_open names what is wrong)
        if not self.path.exists():
            if marked is not None and marked.written > 0:
                self._lost(f"{self.path}: the database file is missing, but {recorded}")
            # A WAL and shared memory left by a lost file are no use to the new one, and
            # SQLite would read them into it.
            for left in (Path(f"{self.path}-wal"), Path(f"{self.path}-shm")):
                left.unlink(missing_ok=True)
            self._create()
        elif size == 0:
            self._lost(
                f"{self.path}: the database file is empty (0 bytes)"
                + (f"; {recorded}" if marked else "")
            )
        elif marked is not None:
            held = self._peek_commits()
            if held is not None:
                self._check_held(marked, held)
        return marked

    def _peek_commits(self) -> int | None:
        """The commit the database and its WAL hold (0: none), read on a read-only
        connection, which leaves the files as they are (a connection that may write
        would copy the WAL into the database as it closes, and delete it); ``None`` when
        it cannot be read (``_open`` then says why)."""
        try:
            db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)
        except (sqlite3.Error, OSError):
            return None
        try:
            row = db.execute("SELECT commits FROM meta").fetchone()
        except sqlite3.Error:
            return None
        finally:
            db.close()
        return int(row[0]) if row is not None else 0

    def _check_held(self, marked: Marked | None, held: int) -> None:
        """Refuse (``_lost``) files that hold commit ``held``, older than the marker
        says they must (see ``_marker.py``: after a restart of the machine, only what
        was fsynced must be there, and what else is gone is told in a warning)."""
        if marked is None:
            return
        expected = marked.expected(self._marker.boot)
        gone = f"the database and its -wal file hold commit {held}"
        if held < expected:
            self._lost(
                f"{self.path}: {expected - held} commits lost: {self._marker.path} records "
                f"commit {expected}, {gone} (the -wal file is missing or damaged)"
            )
        elif held < marked.written:
            log.warning(
                "%s: the machine restarted: %d commits written after the last fsync are "
                "lost (%s records commit %d, %s)",
                self.path, marked.written - held, self._marker.path, marked.written, gone,
            )  # fmt: skip

    def _read_log(self, log: ClaimLog, id_prefix: str) -> list[LoggedClaims]:
        """The claim log's records; damage in it refused (``_lost``), or accepted and
        dropped."""
        records, damage = log.read(id_prefix)
        if damage is not None:
            self._lost(f"{log.path}: {damage}")
        return records

    def _baseline(self, marked: Marked | None) -> None:
        """Record the loaded files as what the next start must find: every commit
        they hold as written; as fsynced too with ``full`` (``load`` fsynced them),
        else what was fsynced before."""
        durable = self._commit_no
        if not self.slow_commits:
            durable = min(durable, marked.durable if marked is not None else 0)
        self._durable_no = durable
        self._marker.baseline(self._commit_no, durable)

    def _sync_at_load(self) -> None:
        """``full``: fsync what ``load`` wrote (the lease count above all, see
        ``_LEASE_GAP``) before anything is handed out. Raises ``StoreError``."""
        if self._wal_fd is None:
            return
        try:
            os.fdatasync(self._wal_fd)
        except OSError as exc:
            raise StoreError(f"{self.path}-wal: fsync failed: {exc}") from None

    def _read_claims(self, db: sqlite3.Connection) -> dict[int, tuple[int, tuple[Any, ...]]]:
        """Every stored claim entry by seq, the latest record's for a row claimed twice:
        ``seq -> (commit number, CLAIM_FIELDS tuple)``."""
        claims: dict[int, tuple[int, tuple[Any, ...]]] = {}
        for commit_no, texts, numbers in db.execute(
            "SELECT commit_no, texts, numbers FROM claims ORDER BY commit_no"
        ):
            for entry in _unpack_claims(texts, numbers):
                claims[entry[-1]] = (commit_no, entry)
        return claims

    def _claim_log_path(self) -> Path:
        return self.path.with_name(self.path.name + "-claims")

    def _keep_logged(
        self,
        db: sqlite3.Connection,
        late: list[LoggedClaims],
        claims: dict[int, tuple[int, tuple[Any, ...]]],
        leases_issued: int,
    ) -> None:
        """Write into SQLite the claims ``load`` took from the claim log (those laid over
        a row), each in a record of its logged commit's number, so that the log may be
        emptied; and the commit count and lease count they bring. A stored record whose
        every claim a logged one overtook (a reclaim) is deleted, as a commit would."""
        numbers = {record.commit_no for record in late}
        by_commit: dict[int, list[tuple[Any, ...]]] = {}
        for seq, commit_no in self._claim_of.items():
            if commit_no in numbers:
                by_commit.setdefault(commit_no, []).append(claims[seq][1])
        stored = [row[0] for row in db.execute("SELECT commit_no FROM claims")]
        overtaken = [(n,) for n in stored if n not in self._claims_live]
        db.execute("BEGIN")
        try:
            db.executemany("DELETE FROM claims WHERE commit_no = ?", overtaken)
            for commit_no, entries in sorted(by_commit.items()):
                db.execute(
                    "INSERT INTO claims (commit_no, texts, numbers) VALUES (?, ?, ?)",
                    (commit_no, *_pack_claims(entries)),
                )
            db.execute(
                "UPDATE meta SET leases_issued = ?, commits = ?", (leases_issued, self._commit_no)
            )
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def _with_claims(
        self, rows: Iterable[tuple[Any, ...]], claims: dict[int, tuple[int, tuple[Any, ...]]]
    ) -> Iterator[tuple[Any, ...]]:
        """The stored rows (``ROW_FIELDS`` and ``v``) as ``ROW_FIELDS`` tuples, each with
        its claim laid over it when the claim's commit came after the row was last written
        whole; the store's claim bookkeeping rebuilt from the claims that count."""
        live = self._claims_live
        for row in rows:
            got = claims.get(row[0])
            if got is None or got[0] <= row[-1]:
                yield row[:-1]
                continue
            commit_no, entry = got
            values = list(row[:-1])
            for at, value in zip(_CLAIM_AT, entry, strict=True):
                values[at] = value
            self._claim_of[row[0]] = commit_no
            live[commit_no] = live.get(commit_no, 0) + 1
            yield tuple(values)

    # -- writing --------------------------------------------------------------------------

    def commit_now(
        self, changes: Changes, written: Callable[[], None] = _nothing
    ) -> bool | asyncio.Future[None]:
        """Write ``changes`` here and now when this commit can be made on the caller's
        thread (the event loop's), and return ``True`` when it is then as durable as
        ``sync`` makes it, or a future that ends once it is (``full``: when the WAL's
        fsync is back; the future raises ``StoreError`` if it failed). Else write nothing
        and return ``False``: call ``commit``. ``written`` is called once the commit's
        claims survive a killed broker, if that is before the commit is as durable as
        ``sync`` makes it: the commit gate puts on the wire there the frames that need no
        more (pushed claims, see ``broker/commit.py``). For a commit of claims only, that
        is before the write, once they are in the claim log; otherwise, with ``full``,
        between the write (the commit is in the WAL) and the fsync, and with ``normal``
        not at all.

        ``normal``: every commit but a checkpointing one that must restart the WAL (see
        ``_RESTART_FRAMES``), which ``commit`` makes; a checkpoint that need not is
        started beside the commits, on a thread and connection of its own. ``full``:
        every commit but a checkpointing one; its fsync is asked of the
        helper process (``WalSyncer``), so the caller may write the next commits while
        the disk syncs, and the futures end in order. Raises ``StoreError``.
        """
        turn = self._since_checkpoint + 1 >= self._checkpoint_every()
        if turn and self._whole_checkpoint_due():
            return False
        self._since_checkpoint = 0 if turn else self._since_checkpoint + 1
        syncer = self._syncer  # there once loaded, with full
        self._write_here(changes, written, written_after=syncer is not None)
        if syncer is not None:
            return syncer.request()
        if turn:
            self._side = self._checkpointer.submit(self._side_checkpoint, self._commit_no)
        return True

    async def commit(self, changes: Changes, written: Callable[[], None] = _nothing) -> None:
        """Write one batch in one transaction; return when it is as durable as ``sync``
        makes it. Raises ``StoreError`` when the write or the fsync fails: the broker
        must then promise nothing more. ``written`` is called as in ``commit_now``, and
        also once a whole checkpoint's commit is written (with either ``sync``: the
        checkpoint still follows).

        The write happens here and now, with no fsync in it. ``full``: then the helper
        process fsyncs the WAL, and this returns after that. ``normal``: nothing to wait
        for. Every ``_CHECKPOINT_EVERY``-th commit (``full``: ``_CHECKPOINT_EVERY_FULL``-th)
        checkpoints. With ``full``, and with ``normal`` when the WAL must restart, it is
        a whole checkpoint: the commit is written here, then the writer thread fsyncs the
        WAL (``full``) and checkpoints, and this returns after that. The commit gate has
        one commit in flight at a time, so nothing is written while that checkpoint runs,
        it copies the whole WAL, and the next commit starts the WAL from its beginning
        again. (A checkpoint beside a stream of commits never catches up, so the WAL
        would grow without end.) Otherwise ``normal`` starts the checkpoint beside the
        commits (see ``_side_checkpoint``).
        """
        loop = asyncio.get_running_loop()
        self._since_checkpoint += 1
        if self._since_checkpoint >= self._checkpoint_every():
            self._since_checkpoint = 0
            if self._whole_checkpoint_due():
                # Written here like any other commit, so that its pushes leave now; only
                # the fsync and the checkpoint wait on the writer thread. (Written there
                # too, its pushes waited for the whole checkpoint: a stall every 250
                # commits that set the p99.)
                self._write_here(changes, written, written_after=True)
                await loop.run_in_executor(self._writer, self._sync_and_checkpoint)
                return
            self.write(changes)
            self._side = self._checkpointer.submit(self._side_checkpoint, self._commit_no)
            return
        self.write(changes)  # (raises StoreError when the store is closed)
        syncer = self._syncer  # there once loaded, with full
        if syncer is not None:
            written()
            await syncer.request()

    def _checkpoint_every(self) -> int:
        """Commits per checkpoint (read at each commit, so a test may change it)."""
        return _CHECKPOINT_EVERY_FULL if self.slow_commits else _CHECKPOINT_EVERY

    def _whole_checkpoint_due(self) -> bool:
        """Whether this checkpointing commit makes a whole checkpoint, on the writer
        thread, the commits waiting: always with ``full``; with ``normal`` when the WAL
        must restart, because the last checkpoint beside the commits found it over
        ``_RESTART_FRAMES`` frames, failed, or has not finished yet (so the commits
        outrun it)."""
        if self.slow_commits:
            return True
        side = self._side
        if side is not None and not side.done():
            return True
        return self._wal_frames > _RESTART_FRAMES

    def _side_checkpoint(self, commit_no: int) -> None:
        """``normal``: checkpoint on the checkpointer thread, with a connection of its
        own, while the event loop goes on committing (no commit waits for it; SQLite lets
        a checkpoint run beside a writer). Notes how many frames the WAL holds, for
        ``_whole_checkpoint_due``. A failure is logged: the WAL keeps everything, and the next
        checkpoint is a whole one. Once it succeeds, commit ``commit_no`` (written
        before it began) is on the disk: SQLite fsyncs the WAL before it copies it."""
        self._wal_frames = _RESTART_FRAMES + 1  # until this one succeeds
        try:
            if self._side_db is None:
                self._side_db = sqlite3.connect(
                    self.path, isolation_level=None, check_same_thread=False
                )
            _, frames, _ = self._side_db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as exc:
            log.warning("%s: checkpoint failed (retried later): %s", self.path, exc)
            return
        self._wal_frames = frames
        self._durable_no = max(self._durable_no, commit_no)
        self.side_checkpoints += 1

    @property
    def syncs(self) -> int:
        """WAL fsyncs made, for tests: the helper's (counted as answered requests) and
        those of checkpointing commits, on the writer thread."""
        helper = self._syncer.syncs if self._syncer is not None else 0
        return self._thread_syncs + helper

    def _open_wal(self) -> int:
        """The WAL file, opened once for its fsyncs; its directory is fsynced then too.

        On Linux an fsync writes out the file whatever descriptor it is called on, so a
        descriptor of our own does what SQLite's ``synchronous=FULL`` does at a commit.
        SQLite keeps the WAL file (the same inode) while its connection is open; it is
        only truncated, after checkpoints. The directory's fsync makes the WAL's own entry
        in it survive a power loss (SQLite does this at the first sync of a WAL it
        created, which with ``synchronous=NORMAL`` comes only at the first checkpoint).
        Raises StoreError.
        """
        if self._wal_fd is not None:
            return self._wal_fd
        try:
            fd = os.open(f"{self.path}-wal", os.O_RDONLY | os.O_CLOEXEC)
            try:
                directory = os.open(self.path.parent, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.fsync(directory)
                finally:
                    os.close(directory)
            except OSError:
                os.close(fd)
                raise
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot open the WAL to fsync it: {exc}") from None
        self._wal_fd = fd
        return fd

    def _sync_wal(self) -> None:
        """fsync the WAL here: every commit written so far is then on the disk. An fsync
        error is fatal: the pages it failed to write may be dropped from the page cache,
        so a later fsync that succeeds would prove nothing. Raises StoreError."""
        fd = self._open_wal()
        try:
            os.fdatasync(fd)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot fsync the WAL: {exc}") from None
        self._thread_syncs += 1

    def _write_here(
        self, changes: Changes, written: Callable[[], None], *, written_after: bool
    ) -> None:
        """Write one commit on the calling thread (the event loop's), and call
        ``written`` once its claims survive a killed broker: for a commit of claims only,
        before the write, once they are in the claim log; otherwise after the write if
        ``written_after`` (something still follows it: an fsync, a checkpoint). Raises
        ``StoreError``."""
        if self._db is None:
            raise StoreError("the store is closed")
        packed = _pack_claims(changes.claims) if changes.claims else None
        # A commit of claims only (the rows they change are all in the file already)
        # goes to the claim log first: they then survive a killed broker, so the pushes
        # leave before the commit is written, and the worker starts on its window while
        # the broker writes. (A schedule's change is not a claim: the log cannot hold it.)
        log = self._claim_log
        if (
            log is not None
            and packed is not None
            and not (
                changes.upserts
                or changes.updates
                or changes.schedules
                or changes.schedules_deleted
                or changes.progress
                or changes.edges
                or changes.edges_met
                or changes.edges_deleted
            )
        ):
            log.append(self._commit_no + 1, changes.meta[2], *packed)
            written()
            self.write(changes, packed)
            log.written()
        else:
            self.write(changes, packed)
            if written_after:
                written()

    def _sync_and_checkpoint(self) -> None:
        """The end of a whole checkpoint's commit, already written, on the writer thread:
        with ``full`` the WAL's fsync, then the checkpoint, which copies the whole WAL
        (the commit gate writes nothing meanwhile), so the next commit starts the WAL from
        its beginning again."""
        if self._side is not None:
            # Two checkpoints at once: the second would do nothing. (Its own failure
            # was logged where it ran.)
            futures.wait([self._side])
        if self.slow_commits:
            self._sync_wal()  # the checkpoint below fsyncs only if it copies anything
        db = self._db
        assert db is not None
        with self._lock:
            try:
                db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            except sqlite3.Error as exc:  # the WAL keeps everything: retried next time
                log.warning("%s: checkpoint failed (retried later): %s", self.path, exc)
                return
        self.checkpoints += 1
        self._wal_frames = 0  # the next commit starts the WAL again
        # Everything written is fsynced now, into the WAL and then the database file.
        self._durable_no = self._commit_no

    def write(self, changes: Changes, packed: tuple[str, bytes] | None = None) -> None:
        """``commit``, on the calling thread (for tools and tests with no event loop).
        ``packed``: ``changes.claims`` as ``_pack_claims`` made them, if it was called."""
        db = self._db
        if db is None:
            raise StoreError("the store is closed")
        with self._lock:
            commit_no = self._commit_no + 1
            dead = self._settle_claims(changes, commit_no)
            try:
                db.execute("BEGIN")
                if changes.upserts:
                    db.executemany(_UPSERT_JOB, changes.upserts)
                if changes.updates:
                    db.executemany(_UPDATE_JOB, [(*u, commit_no) for u in changes.updates])
                if changes.progress:  # (after the upserts: a new row's comes here)
                    db.executemany("UPDATE jobs SET progress = ? WHERE seq = ?", changes.progress)
                if changes.claims:
                    db.execute(
                        "INSERT INTO claims (commit_no, texts, numbers) VALUES (?, ?, ?)",
                        (commit_no, *(packed or _pack_claims(changes.claims))),
                    )
                if dead:
                    db.executemany("DELETE FROM claims WHERE commit_no = ?", [(c,) for c in dead])
                if changes.deleted:
                    db.executemany(
                        "DELETE FROM jobs WHERE seq BETWEEN ? AND ?", _runs(changes.deleted)
                    )
                if changes.queues:
                    db.executemany(_UPSERT_QUEUE, changes.queues)
                if changes.schedules_deleted:
                    db.executemany(
                        "DELETE FROM schedules WHERE id = ?",
                        [(i,) for i in changes.schedules_deleted],
                    )
                if changes.schedules:  # in the transaction of the jobs their ticks made
                    db.executemany(_UPSERT_SCHEDULE, changes.schedules)
                if changes.edges:  # (new edges, then acks meeting them, then the gone)
                    db.executemany(_INSERT_EDGE, changes.edges)
                if changes.edges_met:
                    db.executemany(
                        "UPDATE deps SET met = 1, result = ? WHERE seq = ? AND dep = ?",
                        changes.edges_met,
                    )
                if changes.edges_deleted:
                    db.executemany(
                        "DELETE FROM deps WHERE seq = ?", [(s,) for s in changes.edges_deleted]
                    )
                db.execute(
                    "INSERT INTO meta (id, id_prefix, seq, leases_issued, commits) "
                    "VALUES (1, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET id_prefix = "
                    "excluded.id_prefix, seq = excluded.seq, leases_issued = "
                    "excluded.leases_issued, commits = excluded.commits",
                    (*changes.meta, commit_no),
                )
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise StoreError(f"{self.path}: write failed: {exc}") from None
            self._commit_no = commit_no
            self.commits += 1
            self._marker.mark(commit_no, self._durable_no)

    def _settle_claims(self, changes: Changes, commit_no: int) -> list[int]:
        """Update the claim bookkeeping for one commit; return the records it leaves with
        no live entry (to delete in that commit). A deleted or wholly rewritten row no
        longer needs its claim record; a claimed one moves to this commit's record.

        (If the commit then fails, the broker stops: the bookkeeping need not roll back.)
        """
        owner = self._claim_of
        live = self._claims_live
        dead: list[int] = []
        gone = [u[-1] for u in changes.updates] if changes.updates else []
        if owner:
            for seqs in (changes.deleted, gone, [c[-1] for c in changes.claims]):
                for seq in seqs:
                    record = owner.pop(seq, None)
                    if record is not None:
                        left = live[record] - 1
                        if left:
                            live[record] = left
                        else:
                            del live[record]
                            dead.append(record)
        if changes.claims:
            for claim in changes.claims:
                owner[claim[-1]] = commit_no
            live[commit_no] = len(changes.claims)
        return dead

    def close(self) -> None:
        """Finish what is in flight and close every file; the lock on the database goes
        last, once nothing more is written."""
        if self._syncer is not None:
            self._syncer.close()  # its last fsync finishes first; later requests fail
        self._checkpointer.shutdown(wait=True)
        self._writer.shutdown(wait=True)
        if self._side_db is not None:
            self._side_db.close()
            self._side_db = None
        with self._lock:
            if self._wal_fd is not None:
                os.close(self._wal_fd)
                self._wal_fd = None
            if self._db is not None:
                self._db.close()
                self._db = None
            if self._claim_log is not None:
                self._claim_log.close()
            self._marker.close()


def _runs(seqs: list[int]) -> list[tuple[int, int]]:
    """``seqs`` as runs of consecutive numbers, ``(first, last)`` each, in order.

    The acks of a drain come in runs (jobs are claimed in order), and one range DELETE
    costs about half of as many single-row ones.
    """
    ordered = sorted(seqs)
    runs = []
    first = last = ordered[0]
    for seq in ordered[1:]:
        if seq != last + 1:
            runs.append((first, last))
            first = seq
        last = seq
    runs.append((first, last))
    return runs


def _pack_claims(claims: list[tuple[Any, ...]]) -> tuple[str, bytes]:
    """``CLAIM_FIELDS`` tuples as one claim record: the strings as JSON (states, worker
    ids, leases), the numbers as little-endian machine words (attempts and seqs as int64,
    then deadlines as float64: exact, and far cheaper than writing floats as text)."""
    states, attempts, workers, deadlines, leases, seqs = zip(*claims, strict=True)
    texts = _TEXTS.encode((states, workers, leases))
    ints, floats = array("q", attempts + seqs), array("d", deadlines)
    if _BIG_ENDIAN:
        ints.byteswap()
        floats.byteswap()
    return texts, ints.tobytes() + floats.tobytes()


def _unpack_claims(texts: str, numbers: bytes) -> list[tuple[Any, ...]]:
    """The ``CLAIM_FIELDS`` tuples of a record ``_pack_claims`` made. Raises ``ValueError``
    for one it did not make."""
    states, workers, leases = json.loads(texts)
    n = len(states)
    if len(workers) != n or len(leases) != n or len(numbers) != 24 * n:
        raise ValueError(f"a claim record of {n} entries holds {len(numbers)} bytes of numbers")
    ints, floats = array("q", numbers[: 16 * n]), array("d", numbers[16 * n :])
    if _BIG_ENDIAN:
        ints.byteswap()
        floats.byteswap()
    return list(zip(states, ints[:n], workers, floats, leases, ints[n:], strict=True))


_TEXTS = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)
_BIG_ENDIAN = sys.byteorder == "big"


def _migrate(db: sqlite3.Connection, version: int) -> None:
    """Take the database from schema ``version`` to the current one, a transaction per
    step."""
    for step in range(version, _VERSION):
        db.execute("BEGIN IMMEDIATE")
        _run_script(db, _MIGRATIONS[step])
        db.execute(f"PRAGMA user_version={step + 1}")
        db.execute(f"PRAGMA application_id={_APPLICATION_ID}")
        db.execute("COMMIT")


def _run_script(db: sqlite3.Connection, script: str) -> None:
    """Run each statement of ``script`` inside the caller's transaction."""
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)
