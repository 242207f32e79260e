"""Conveyor on PostgreSQL against procrastinate and graphile-worker, on one PostgreSQL server.

    .venv/bin/python bench/pg_compare.py                 # full run (3 to 5 minutes)
    .venv/bin/python bench/pg_compare.py --quick         # a smoke run (a couple of minutes)
    .venv/bin/python bench/pg_compare.py --systems procrastinate,conveyor-pg-1

Every system keeps its jobs in the same PostgreSQL server (BENCH_PG, by default
postgresql://postgres@127.0.0.1:5432/postgres, used only to create and drop databases and
to read the statistics views). Each measurement gets a database of its own, named
``conveyor_bench_<system>_<random>``, created for it and dropped after it (at the end of the
run too, should it be interrupted): the harness never touches another database.

The systems, each with the clients its users run:

* procrastinate (Python): ``defer_async`` / ``batch_defer_async``; workers are
  ``run_worker_async`` processes (concurrency 4, a pool of 6 connections each, LISTEN/NOTIFY
  on); finished jobs are kept, procrastinate's default;
* graphile-worker (Node, bench/node/graphile.mjs): ``addJob`` / ``addJobs`` through
  WorkerUtils; workers are ``run()`` processes with 16 concurrent jobs, its batching on
  (a local queue of 64 jobs, completions batched, ``completeJobBatchDelay`` 0);
* conveyor-pg-N: N brokers (``conveyor serve --db <dsn>``, run as ``python -m conveyor serve``
  from this checkout, on a free port each) on the one database; the SDK's
  ``Client`` publishes and the SDK's ``Worker`` (prefetch 64) works, worker i connected to
  broker i mod N; conveyor-memory is one broker with the memory store (a reference: it
  keeps nothing in PostgreSQL).

The workloads (jobs of ~100 bytes, a no-op handler):

* enqueue, one awaited at a time: one publisher, one process, the next enqueue sent when
  the last returned; and in batches of 1,000 (one batch awaited at a time);
* drain: N jobs enqueued first (in batches, then ``ANALYZE``, as autovacuum would have
  it in a live database), then 1 and then 4 worker processes; jobs/s from "go" to the end
  of the last handler (and when the queue was seen empty, in the log);
* latency: a steady 1,000 jobs/s for 10 s, from the enqueue call to the handler starting
  (the send time travels in the payload; one host clock, CLOCK_MONOTONIC in Python and
  Node alike); 1 publisher and 2 workers, and for Conveyor one publisher per broker (the
  rate split between them) and max(2, N) workers.

For each, PostgreSQL's side: CPU (utime + stime from /proc) of the server processes that
serve the bench database (its backends and autovacuum workers, sampled every 50 ms so that
connections opened during the phase count) plus the WAL writer's, per job; and the
database's committed transactions (``pg_stat_database.xact_commit``) per job, read once
every client and broker has disconnected (a backend reports them at exit). Every
measurement is bounded in time and checks that each job was handled exactly once and that
the queue is empty afterwards. One round: only ratios from one run compare.

Clients run as subprocesses speaking lines: they print ``ready``, wait for ``go`` on
stdin, workers print ``count N`` as they go and stop at ``stop``; each ends with
``result {json}``. The Python ones are this file with ``--child``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import math
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
NODE_DIR = ROOT / "bench" / "node"
sys.path.insert(0, str(ROOT / "bench"))
from compare import conveyor_build, load, machine, quantile, settle  # noqa: E402

ADMIN_DSN = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
HOST = "127.0.0.1"
QUEUE = "bench"
FILLER = "x" * 28  # the job's JSON is ~100 bytes, as in bench/compare.py
BATCH = 1000  # enqueue in batches: Conveyor's max_batch
PREFETCH = 64  # Conveyor per worker; graphile-worker's local queue
# Concurrent jobs per worker process. procrastinate's: the best of 1, 4 and 16 in a trial
# drain here (all within 15%: a no-op handler waits on nothing); graphile-worker's: 16, as
# its local queue (64 jobs, like Conveyor's prefetch) hands jobs out without a round trip.
PROCRASTINATE_CONCURRENCY = 4
GRAPHILE_CONCURRENCY = 16
WINDOW = 64  # latency: at most 64 enqueues in flight per publisher


def payload(seq: int, sent: float) -> dict[str, Any]:
    return {"seq": seq, "sent": sent, "to": "someone@example.com", "body": FILLER}


def say(text: str = "") -> None:
    print(text, flush=True)


class Skip(Exception):
    """A system that cannot run here."""


class Failed(Exception):
    """A measurement that did not complete correctly."""


# -- PostgreSQL: databases and what the server spends ---------------------------------------


def dsn_for(dbname: str) -> str:
    """ADMIN_DSN with its database replaced by ``dbname``."""
    base, _, query = ADMIN_DSN.partition("?")
    head, _, _ = base.rpartition("/")
    return f"{head}/{dbname}" + (f"?{query}" if query else "")


def admin() -> Any:
    import psycopg

    return psycopg.connect(ADMIN_DSN, autocommit=True)


CREATED: list[str] = []  # databases this run made and has not dropped yet


@contextlib.contextmanager
def database(system: str) -> Iterator[str]:
    """A new database for one measurement; dropped (with its connections) afterwards."""
    from psycopg import sql

    name = f"conveyor_bench_{re.sub(r'[^a-z0-9]+', '_', system.lower())}_{secrets.token_hex(4)}"
    with admin() as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    CREATED.append(name)
    try:
        yield name
    finally:
        drop_database(name)


def drop_database(name: str) -> None:
    from psycopg import sql

    assert name.startswith("conveyor_bench_") and name in CREATED, name
    with admin() as conn:
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
        conn.execute(drop.format(sql.Identifier(name)))
    CREATED.remove(name)


def committed(dbname: str, timeout: float = 15.0) -> int:
    """The database's committed transactions, once no backend is connected to it (an idle
    backend reports its counts only every 10 s, an exiting one at once)."""
    with admin() as conn:
        deadline = time.monotonic() + timeout
        while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                           (dbname,)).fetchone()[0]:  # fmt: skip
            if time.monotonic() > deadline:
                raise Failed(f"clients still connected to {dbname} after {timeout:.0f} s")
            time.sleep(0.05)
        time.sleep(0.3)  # the last backend's exit flushes its counts
        row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s",
                           (dbname,)).fetchone()  # fmt: skip
    return int(row[0])


TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def proc_cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace")


class PgCpu:
    """CPU seconds spent by the PostgreSQL processes serving one database (backends and
    autovacuum workers, whose process title names it) plus the WAL writer's, over a phase.

    A thread samples /proc every 50 ms, so that a backend which connects during the phase
    counts from its start; one that exits during it loses at most its last 50 ms."""

    INTERVAL = 0.05

    def __init__(self, dbname: str) -> None:
        self.dbname = dbname
        self.base: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.titles: dict[int, bool] = {}  # pid -> is it one of ours (when known for good)
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    def _ours(self, pid: int) -> bool:
        """Whether ``pid`` serves the database (or is the WAL writer). A PostgreSQL
        process that does not is asked again next time: a backend names its database
        only once it has authenticated."""
        known = self.titles.get(pid)
        if known is not None:
            return known
        title = proc_cmdline(pid)
        if not title.startswith("postgres: "):
            self.titles[pid] = False
            return False
        words = title.split()
        if self.dbname in words or words[-1] == "walwriter":
            self.titles[pid] = True
            return True
        return False

    def _sample(self, first: bool) -> None:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            if not self._ours(pid):
                continue
            cpu = proc_cpu(pid)
            if cpu is None:
                continue
            if first:
                self.base[pid] = cpu
            self.base.setdefault(pid, 0.0)  # started during the phase: all of it counts
            self.last[pid] = cpu

    def _run(self) -> None:
        while not self.stopping.wait(self.INTERVAL):
            self._sample(first=False)

    def start(self) -> None:
        self._sample(first=True)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def stop(self) -> float:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join()
        self._sample(first=False)
        return sum(self.last[pid] - self.base[pid] for pid in self.last)


# -- client processes --------------------------------------------------------------------

CHILDREN: list[Child] = []


class Child:
    """A client subprocess speaking the line protocol (see the module's docstring)."""

    def __init__(self, argv: list[str], name: str, logs: Path, cwd: Path = ROOT) -> None:
        self.name = name
        self.log = logs / f"{name}.log"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))  # fmt: skip
        self.proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=open(self.log, "wb"),  # the child keeps it; closed at its exit
        )  # fmt: skip
        CHILDREN.append(self)
        self.ready = threading.Event()
        self.finished = threading.Event()
        self.count = 0
        self.result: Any = None
        self.error: str | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            if line == "ready":
                self.ready.set()
            elif line.startswith("count "):
                self.count = int(line[6:])
            elif line.startswith("result "):
                self.result = orjson.loads(line[7:])
                self.finished.set()
            elif line.startswith("error "):
                self.error = orjson.loads(line[6:])
        self.finished.set()

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()

    def failure(self) -> str:
        tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
        return f"{self.name} failed: {self.error or ''}\n{tail}"

    def check(self) -> None:
        if self.error is not None or (self.finished.is_set() and self.result is None):
            raise Failed(self.failure())

    def wait(self, event: threading.Event, deadline: float, what: str) -> None:
        while not event.wait(0.02):
            self.check()
            if time.monotonic() > deadline:
                raise Failed(f"{self.name}: timed out waiting for {what}")
        self.check()

    def finish(self, deadline: float) -> Any:
        """Tell it to stop (workers) and wait for its result."""
        self.send("stop")
        self.wait(self.finished, deadline, "its result")
        return self.result

    def close(self) -> None:
        proc = self.proc
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                assert proc.stdin is not None
                proc.stdin.close()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                if pipe is not None:
                    pipe.close()
        with contextlib.suppress(ValueError):
            CHILDREN.remove(self)


def python_child(spec: dict[str, Any]) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--child", orjson.dumps(spec).decode()]


# -- the systems ---------------------------------------------------------------------------


@dataclass
class System:
    """One job queue on the bench database; start() with the database's name, stop()."""

    name: str
    kind: str  # procrastinate | graphile | conveyor
    brokers: int = 0  # conveyor
    store: str = "postgres"  # conveyor: postgres | memory
    _brokers: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)
    urls: list[str] = field(default_factory=list, repr=False)
    dbname: str = ""

    @property
    def conveyor(self) -> bool:
        return self.kind == "conveyor"

    def check(self) -> str:
        """Raise Skip when the system cannot run here; return its version."""
        if self.kind == "procrastinate":
            try:
                version = importlib.metadata.version("procrastinate")
            except importlib.metadata.PackageNotFoundError:
                pip_install("procrastinate>=3,<4")
                version = importlib.metadata.version("procrastinate")
            return f"procrastinate {version}, psycopg {importlib.metadata.version('psycopg')}"
        if self.kind == "graphile":
            return node_check()
        from conveyor import broker

        if self.store == "postgres" and not conveyor_has_postgres():
            raise Skip("this `conveyor serve` has no PostgreSQL store (--db postgresql://...)")
        return f"conveyor {broker.__version__} ({conveyor_build()}), {self.brokers} broker(s)"

    def start(self, dbname: str, logs: Path) -> None:
        """Make the database ready (schema, brokers)."""
        self.dbname = dbname
        dsn = dsn_for(dbname)
        if self.kind == "procrastinate":
            asyncio.run(procrastinate_schema(dsn))
        elif self.kind == "graphile":
            out = subprocess.run(["node", "graphile.mjs", "migrate", dsn], cwd=NODE_DIR,
                                 capture_output=True, text=True, timeout=60)  # fmt: skip
            if out.returncode:
                raise Failed(f"graphile-worker migrate failed: {out.stderr[-2000:]}")
        else:
            for i in range(self.brokers):
                proc, url = start_broker(dsn if self.store == "postgres" else None, logs, i)
                self._brokers.append(proc)
                self.urls.append(url)

    def stop(self) -> None:
        for proc in self._brokers:
            stop_popen(proc)
        self._brokers.clear()
        self.urls.clear()

    def publisher(self, index: int, logs: Path, name: str) -> Child:
        spec: dict[str, Any]
        if self.kind == "graphile":
            spec = {"role": "publish", "dsn": dsn_for(self.dbname)}
            return Child(["node", "graphile.mjs", "child", orjson.dumps(spec).decode()],
                         name, logs, cwd=NODE_DIR)  # fmt: skip
        spec = {"system": self.kind, "role": "publish", "index": index, **self._where(index)}
        return Child(python_child(spec), name, logs)

    def worker(self, index: int, latency: bool, logs: Path) -> Child:
        spec: dict[str, Any] = {"role": "work", "index": index, "latency": latency}
        if self.kind == "graphile":
            spec |= {"dsn": dsn_for(self.dbname), "concurrency": GRAPHILE_CONCURRENCY,
                     "local_queue": PREFETCH}  # fmt: skip
            return Child(["node", "graphile.mjs", "child", orjson.dumps(spec).decode()],
                         f"worker-{index}", logs, cwd=NODE_DIR)  # fmt: skip
        spec |= {"system": self.kind, **self._where(index),
                 "concurrency": PROCRASTINATE_CONCURRENCY}  # fmt: skip
        return Child(python_child(spec), f"worker-{index}", logs)

    def _where(self, index: int) -> dict[str, Any]:
        if self.conveyor:
            return {"url": self.urls[index % len(self.urls)]}
        return {"dsn": dsn_for(self.dbname)}

    def latency_layout(self) -> tuple[int, int]:
        """(publishers, workers) for the latency phase."""
        return (self.brokers, max(2, self.brokers)) if self.conveyor else (1, 2)

    def remaining(self) -> int:
        """Jobs not yet done: waiting, scheduled or being worked."""
        if self.conveyor:
            from compare import conveyor_remaining

            return sum(asyncio.run(conveyor_remaining(url)) for url in self.urls[:1])
        import psycopg

        query = {
            "procrastinate": "SELECT count(*) FROM procrastinate_jobs "
            "WHERE status IN ('todo', 'doing')",
            "graphile": "SELECT count(*) FROM graphile_worker._private_jobs",
        }[self.kind]
        with psycopg.connect(dsn_for(self.dbname), autocommit=True) as conn:
            return int(conn.execute(query).fetchone()[0])  # type: ignore[index]


def all_systems() -> dict[str, System]:
    systems = [
        System("procrastinate", "procrastinate"),
        System("graphile-worker", "graphile"),
        System("conveyor-pg-1", "conveyor", brokers=1),
        System("conveyor-pg-2", "conveyor", brokers=2),
        System("conveyor-pg-3", "conveyor", brokers=3),
        System("conveyor-memory", "conveyor", brokers=1, store="memory"),
    ]
    return {s.name: s for s in systems}


DEFAULT_SYSTEMS = ["procrastinate", "graphile-worker", "conveyor-pg-1", "conveyor-pg-2",
                   "conveyor-pg-3"]  # fmt: skip


def pip_install(requirement: str) -> None:
    say(f"installing {requirement} (bench only) ...")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", requirement], check=True,
                   timeout=600)  # fmt: skip
    importlib.invalidate_caches()


def node_check() -> str:
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise Skip("node and npm are needed for graphile-worker")
    if not (NODE_DIR / "node_modules" / "graphile-worker").exists():
        say("installing bench/node's packages (npm ci) ...")
        out = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR,
                             capture_output=True, text=True, timeout=600)  # fmt: skip
        if out.returncode:
            raise Skip(f"npm ci failed in bench/node: {out.stderr[-1000:]}")
    package = orjson.loads((NODE_DIR / "node_modules" / "graphile-worker" / "package.json")
                           .read_bytes())  # fmt: skip
    node = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    return f"graphile-worker {package['version']}, node {node}"


def conveyor_has_postgres() -> bool:
    """Whether this Conveyor's ``serve`` takes a PostgreSQL URL."""
    out = subprocess.run([sys.executable, "-m", "conveyor", "serve", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    return "postgres" in out.stdout.lower()


def start_broker(dsn: str | None, logs: Path, index: int) -> tuple[subprocess.Popen[bytes], str]:
    """`conveyor serve` on a free port, on ``dsn`` (or the memory store); its URL."""
    store = ["--db", dsn] if dsn else ["--store", "memory"]
    log = logs / f"broker-{index}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor", "serve", "--host", HOST, "--port", "0", *store,
         "--log-level", "warning",
         "--max-connections-per-address", "50000", "--max-connections", "50000"],
        cwd=ROOT, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
        stderr=open(log, "wb"),  # the child keeps it; closed at its exit
    )  # fmt: skip
    BROKERS.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("conveyor listening on "):
        stop_popen(proc)
        raise Failed(f"conveyor did not start: {line!r} {log.read_text(errors='replace')[-2000:]}")
    return proc, line.split()[3]


BROKERS: list[subprocess.Popen[bytes]] = []


def stop_popen(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
    with contextlib.suppress(ValueError):
        BROKERS.remove(proc)


async def procrastinate_schema(dsn: str) -> None:
    import logging

    import procrastinate

    # (It warns that the App is made in __main__: a worker would not find the tasks
    # there, and this one has none.)
    logging.getLogger("procrastinate").setLevel(logging.ERROR)

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


# -- one measurement ------------------------------------------------------------------------


@dataclass
class Phase:
    """What one measurement gives: its figure, and PostgreSQL's cost per job."""

    value: Any  # jobs/s, or [p50, p99, max] in ms
    cpu_ms: float  # PostgreSQL CPU per job
    xacts: float  # committed transactions per job
    note: str = ""


class Measure:
    """A database, the system started on it, client processes; all cleaned up at exit."""

    def __init__(self, system: System, seconds: float) -> None:
        self.system = system
        self.deadline = time.monotonic() + seconds
        self.children: list[Child] = []

    def __enter__(self) -> Measure:
        self.logs = Path(tempfile.mkdtemp(prefix="pg-bench-"))
        self.db = database(self.system.name)
        self.dbname = self.db.__enter__()
        try:
            self.system.start(self.dbname, self.logs)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            for child in self.children:
                child.close()
            self.system.stop()
        finally:
            self.db.__exit__(None, None, None)
            shutil.rmtree(self.logs, ignore_errors=True)

    def spawn(self, child: Child) -> Child:
        self.children.append(child)
        return child

    def publish(self, index: int, mode: str, n: int, rate: float = 0.0) -> Child:
        child = self.spawn(self.system.publisher(index, self.logs, f"publisher-{index}"))
        child.send(orjson.dumps({"mode": mode, "n": n, "rate": rate, "batch": BATCH,
                                 "window": WINDOW, "index": index}).decode())  # fmt: skip
        return child

    def fill(self, n: int) -> None:
        """``n`` jobs in the queue (untimed); their depth checked."""
        child = self.publish(0, "batch", n)
        child.wait(child.ready, self.deadline, "ready")
        child.send("go")
        out = child.finish(self.deadline)
        if out["accepted"] != n:
            raise Failed(f"fill: {out['accepted']:,} of {n:,} accepted")
        child.close()
        self.children.remove(child)
        self.expect_remaining(n, "after the fill")
        # The planner's statistics, as autovacuum keeps them in a live database: without,
        # a fresh table of thousands of jobs is planned as if empty.
        import psycopg

        with psycopg.connect(dsn_for(self.dbname), autocommit=True) as conn:
            conn.execute("ANALYZE")

    def expect_remaining(self, n: int, when: str) -> None:
        left = self.system.remaining()
        settle_by = time.monotonic() + 5  # completions batched or sent after the handler
        while left != n and time.monotonic() < settle_by:
            time.sleep(0.05)
            left = self.system.remaining()
        if left != n:
            raise Failed(f"{left:,} jobs left {when}, {n:,} expected")

    def until(self, workers: list[Child], n: int) -> None:
        while sum(w.count for w in workers) < n:
            for w in workers:
                w.check()
            if time.monotonic() > self.deadline:
                done = sum(w.count for w in workers)
                raise Failed(f"timed out: {done:,} of {n:,} handled")
            time.sleep(0.005)

    def close_all(self) -> int:
        """Every client and broker gone; the database's committed transactions then."""
        for child in self.children:
            child.close()
        self.children.clear()
        self.system.stop()
        return committed(self.dbname)


def measure_enqueue(system: System, n: int, mode: str, seconds: float) -> Phase:
    with Measure(system, seconds) as m:
        child = m.publish(0, mode, n)
        child.wait(child.ready, m.deadline, "ready")
        # What the publisher's connecting and, for Conveyor, the brokers' start did and
        # have not reported yet counts in: a few transactions, against thousands of jobs.
        before = committed_live(m.dbname)
        cpu = PgCpu(m.dbname)
        cpu.start()
        child.send("go")
        out = child.finish(m.deadline)
        spent = cpu.stop()
        if out["accepted"] != n:
            raise Failed(f"{out['accepted']:,} of {n:,} accepted")
        m.expect_remaining(n, "after the enqueues")
        xacts = m.close_all() - before
        return Phase(n / (out["end"] - out["start"]), 1000 * spent / n, xacts / n)


def run_workers(
    m: Measure, workers: int, n: int, publishers: int = 0, rate: float = 0.0
) -> tuple[float, list[Any], float, int, float]:
    """Workers (and publishers at ``rate`` in all) from "go" until ``n`` jobs handled.
    Returns the go time, the workers' results, PostgreSQL CPU s, committed transactions,
    and the seconds from "go" until the queue was seen empty."""
    latency = publishers > 0
    crew = [m.spawn(m.system.worker(i, latency, m.logs)) for i in range(workers)]
    pubs = [m.publish(i, "rate", n // publishers + (i < n % publishers), rate / publishers)
            for i in range(publishers)]  # fmt: skip
    for child in crew + pubs:
        child.wait(child.ready, m.deadline, "ready")
    before = committed_live(m.dbname)
    cpu = PgCpu(m.dbname)
    cpu.start()
    started = time.monotonic()
    for child in crew + pubs:
        child.send("go")
    m.until(crew, n)
    # PostgreSQL's work goes on after the last handler (completions sent after it,
    # batched): the CPU counts until the queue is empty.
    m.expect_remaining(0, "after the handlers")
    emptied = time.monotonic() - started
    spent = cpu.stop()
    for pub in pubs:
        pub.finish(m.deadline)
    time.sleep(0.2)  # a job handled twice would show up now
    results = [w.finish(m.deadline) for w in crew]
    seqs = [s for r in results for s in r["seqs"]]
    unique = len(set(seqs))
    if len(seqs) != n or unique != n:
        raise Failed(f"{n:,} jobs: {unique:,} handled, {len(seqs) - unique:,} twice")
    xacts = m.close_all() - before
    return started, results, spent, xacts, emptied


def committed_live(dbname: str) -> int:
    """The counter as it stands (clients connected: what they have reported so far)."""
    with admin() as conn:
        row = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s",
                           (dbname,)).fetchone()  # fmt: skip
    return int(row[0])


def measure_drain(system: System, n: int, workers: int, seconds: float) -> Phase:
    with Measure(system, seconds) as m:
        m.fill(n)
        # The fill's publisher has exited (its counts are in); the brokers' fill commits,
        # if not yet reported, fall into the drain's: 1 per 1,000 jobs.
        started, results, spent, xacts, emptied = run_workers(m, workers, n)
        end = max(r["last"] for r in results)
        return Phase(n / (end - started), 1000 * spent / n, xacts / n,
                     f"queue empty {emptied:.2f} s after go")  # fmt: skip


def measure_latency(system: System, rate: float, duration: float, seconds: float) -> Phase:
    with Measure(system, seconds) as m:
        n = int(rate * duration)
        publishers, workers = system.latency_layout()
        started, results, spent, xacts, _ = run_workers(m, workers, n, publishers, rate)
        lat = sorted(x for r in results for x in r["lat"])
        kept = n / (max(r["last"] for r in results) - started)
        value = [quantile(lat, 0.5) * 1000, quantile(lat, 0.99) * 1000, lat[-1] * 1000, kept]
        return Phase(value, 1000 * spent / n, xacts / n)


# -- the Python clients (this file with --child) -----------------------------------------------


class Tally:
    def __init__(self, latency: bool) -> None:
        self.latency = latency
        self.seqs: list[int] = []
        self.lat: list[float] = []
        self.last = 0.0

    def handle(self, body: dict[str, Any]) -> None:
        now = time.monotonic()
        self.seqs.append(body["seq"])
        if self.latency:
            self.lat.append(now - body["sent"])
        self.last = time.monotonic()


class ConveyorClient:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec

    async def open_publisher(self) -> None:
        from conveyor.sdk import Client

        self.client = Client(self.spec["url"])
        await self.client.__aenter__()

    async def enqueue(self, seq: int) -> None:
        await self.client.enqueue(QUEUE, payload(seq, time.monotonic()))

    async def enqueue_batch(self, seqs: list[int]) -> None:
        now = time.monotonic()
        await self.client.enqueue_many(QUEUE, [payload(s, now) for s in seqs])

    async def close_publisher(self) -> None:
        await self.client.aclose()

    async def open_worker(self, tally: Tally) -> None:
        from conveyor.sdk import Job, Worker

        self.worker = Worker(self.spec["url"], queues=[QUEUE],
                             worker_id=f"bench-{os.getpid()}", prefetch=PREFETCH)  # fmt: skip

        @self.worker.handler(QUEUE)
        async def handle(job: Job) -> None:
            tally.handle(job.payload)

    async def work(self) -> None:
        await self.worker.run()

    async def stop_work(self, task: asyncio.Task[None]) -> None:
        self.worker.stop()
        await asyncio.wait_for(task, 10)


class ProcrastinateClient:
    def __init__(self, spec: dict[str, Any]) -> None:
        import procrastinate

        # A worker's pool: a connection per concurrent job and two more; a publisher's: 10,
        # as graphile-worker's WorkerUtils has.
        size = spec["concurrency"] + 2 if spec["role"] == "work" else 10
        self.spec = spec
        self.app = procrastinate.App(connector=procrastinate.PsycopgConnector(
            conninfo=spec["dsn"], min_size=min(4, size), max_size=size))  # fmt: skip
        self.tally: Tally | None = None

        async def bench(**body: Any) -> None:
            assert self.tally is not None
            self.tally.handle(body)

        self.task = self.app.task(name="bench", queue=QUEUE)(bench)

    async def open_publisher(self) -> None:
        await self.app.open_async()

    async def enqueue(self, seq: int) -> None:
        await self.task.defer_async(**payload(seq, time.monotonic()))

    async def enqueue_batch(self, seqs: list[int]) -> None:
        now = time.monotonic()
        await self.task.batch_defer_async(*(payload(s, now) for s in seqs))

    async def close_publisher(self) -> None:
        await self.app.close_async()

    async def open_worker(self, tally: Tally) -> None:
        self.tally = tally
        await self.app.open_async()

    async def work(self) -> None:
        await self.app.run_worker_async(
            queues=[QUEUE], concurrency=self.spec["concurrency"], wait=True,
            install_signal_handlers=False, listen_notify=True,
            name=f"bench-{os.getpid()}",
        )  # fmt: skip

    async def stop_work(self, task: asyncio.Task[None]) -> None:
        task.cancel()  # run_worker_async stops gracefully when cancelled
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)
        await self.app.close_async()


def emit(kind: str, value: Any = None) -> None:
    line = kind if value is None else f"{kind} {orjson.dumps(value).decode()}"
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def child_main(spec: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str] = asyncio.Queue()

    def read_stdin() -> None:
        for raw in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, raw.strip())
        loop.call_soon_threadsafe(lines.put_nowait, "eof")

    threading.Thread(target=read_stdin, daemon=True).start()
    client: Any = (ConveyorClient if spec["system"] == "conveyor" else ProcrastinateClient)(spec)
    if spec["role"] == "publish":
        job = orjson.loads(await lines.get())
        await client.open_publisher()
        emit("ready")
        if await lines.get() != "go":
            return
        out = await publish(client, job)
        await client.close_publisher()
        emit("result", out)
        return
    tally = Tally(spec["latency"])
    await client.open_worker(tally)
    emit("ready")
    if await lines.get() != "go":
        return
    task = asyncio.create_task(client.work())
    told = asyncio.create_task(lines.get())
    shown = -1
    while not told.done():
        await asyncio.wait({task, told}, timeout=0.02, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()
            raise RuntimeError("the worker ended early")
        if len(tally.seqs) != shown:
            shown = len(tally.seqs)
            emit(f"count {shown}")
    await client.stop_work(task)
    emit("result", {"seqs": tally.seqs, "lat": tally.lat, "last": tally.last})


async def publish(client: Any, job: dict[str, Any]) -> dict[str, Any]:
    n, mode = job["n"], job["mode"]
    accepted = 0
    start = time.monotonic()
    if mode == "single":
        for seq in range(n):
            await client.enqueue(seq)
            accepted += 1
    elif mode == "batch":
        for first in range(0, n, job["batch"]):
            seqs = list(range(first, min(n, first + job["batch"])))
            await client.enqueue_batch(seqs)
            accepted += len(seqs)
    else:  # rate: each enqueue on its own schedule, at most `window` in flight
        slots = asyncio.Semaphore(job["window"])
        tasks: set[asyncio.Task[None]] = set()
        base = job.get("index", 0) * 10_000_000  # unique seqs across publishers

        async def one(seq: int) -> None:
            nonlocal accepted
            try:
                await client.enqueue(seq)
                accepted += 1
            finally:
                slots.release()

        for i in range(n):
            delay = start + i / job["rate"] - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await slots.acquire()
            task = asyncio.create_task(one(base + i))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*list(tasks))
    return {"start": start, "end": time.monotonic(), "accepted": accepted}


def run_child(raw: str) -> None:
    import logging

    logging.basicConfig(level=logging.WARNING)
    spec = orjson.loads(raw)
    from conveyor.sdk._loop import loop_factory

    try:
        with asyncio.Runner(loop_factory=loop_factory("auto")) as runner:
            runner.run(child_main(spec))
    except BaseException:
        emit("error", traceback.format_exc())
        raise


# -- reporting ------------------------------------------------------------------------------

ROWS = [  # key, label, unit
    ("enq1", "enqueue, 1 awaited at a time, jobs/s", "rate"),
    ("enq1.cpu", "  PostgreSQL CPU, ms/job", "ms"),
    ("enq1.xact", "  transactions/job", "x"),
    ("enqB", f"enqueue, batches of {BATCH:,}, jobs/s", "rate"),
    ("enqB.cpu", "  PostgreSQL CPU, ms/job", "ms"),
    ("enqB.xact", "  transactions/job", "x"),
    ("drain1", "drain, 1 worker process, jobs/s", "rate"),
    ("drain1.cpu", "  PostgreSQL CPU, ms/job", "ms"),
    ("drain1.xact", "  transactions/job", "x"),
    ("drain4", "drain, 4 worker processes, jobs/s", "rate"),
    ("drain4.cpu", "  PostgreSQL CPU, ms/job", "ms"),
    ("drain4.xact", "  transactions/job", "x"),
    ("lat.p50", "latency p50, ms", "ms"),
    ("lat.p99", "latency p99, ms", "ms"),
    ("lat.max", "latency max, ms", "ms"),
    ("lat.kept", "  handled, jobs/s (below the rate: it fell behind)", "rate"),
    ("lat.cpu", "  PostgreSQL CPU, ms/job", "ms"),
    ("lat.xact", "  transactions/job", "x"),
]
RATIOS = ["enq1", "enqB", "drain1", "drain4"]  # Conveyor / the best other system


def cell(value: float | None, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if unit == "rate":
        return f"{value:,.0f}"
    if unit == "x":
        return f"{value:.2f}"
    return f"{value:.3f}" if value < 1 else f"{value:.2f}"


def record(table: dict[str, dict[str, float | None]], name: str, key: str, phase: Phase | None,
           ) -> None:  # fmt: skip
    row = table.setdefault(name, {})
    if phase is None:
        return
    if key == "lat":
        row["lat.p50"], row["lat.p99"], row["lat.max"], row["lat.kept"] = phase.value
    else:
        row[key] = phase.value
    row[f"{key}.cpu"], row[f"{key}.xact"] = phase.cpu_ms, phase.xacts


def print_table(table: dict[str, dict[str, float | None]], names: list[str]) -> None:
    others = [n for n in names if not n.startswith("conveyor")]
    conveyors = [n for n in names if n.startswith("conveyor")]
    say("\n| | " + " | ".join(names) + " |")
    say("|---|" + "---:|" * len(names))
    for key, label, unit in ROWS:
        cells = [cell(table.get(n, {}).get(key), unit) for n in names]
        label = label.replace("  ", "&nbsp;&nbsp;", 1) if label.startswith("  ") else label
        say(f"| {label} | " + " | ".join(cells) + " |")
        if key in RATIOS and others and conveyors:
            best = [v for v in (table.get(o, {}).get(key) for o in others) if v]
            top = max(best) if best else None
            ratios = []
            for n in names:
                value = table.get(n, {}).get(key)
                ok = n in conveyors and value and top
                ratios.append(f"{value / top:.2f}x" if ok else "")  # type: ignore[operator]
            say("| &nbsp;&nbsp;Conveyor ÷ best other | " + " | ".join(ratios) + " |")


# -- main ---------------------------------------------------------------------------------


def timed(label: str, system: System, fn: Callable[[System], Phase]) -> Phase | None:
    settle(limit=5.0)  # a shared machine: a short wait, so that the run stays bounded
    began = time.monotonic()
    try:
        phase = fn(system)
    except Exception as exc:
        say(f"  {label}: FAILED: {type(exc).__name__}: {exc}")
        return None
    value = phase.value
    shown = ("p50 {:.2f} ms, p99 {:.2f} ms, max {:.2f} ms, handled {:,.0f} jobs/s".format(*value)
             if isinstance(value, list) else f"{value:,.0f} jobs/s")  # fmt: skip
    note = f" ({phase.note})" if phase.note else ""
    say(f"  {label}: {shown}{note}; PostgreSQL {phase.cpu_ms:.3f} ms CPU and "
        f"{phase.xacts:.2f} transactions per job  [{time.monotonic() - began:.1f} s]")  # fmt: skip
    return phase


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                        help=f"comma-separated, of: {', '.join(all_systems())}")  # fmt: skip
    parser.add_argument("--jobs", type=int, default=20_000, help="N for batches and drains")
    parser.add_argument("--single-jobs", type=int, default=2_000,
                        help="jobs enqueued one at a time")  # fmt: skip
    parser.add_argument("--rate", type=float, default=1000.0, help="latency: jobs/s")
    parser.add_argument("--duration", type=float, default=10.0, help="latency: seconds")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 2,000 jobs, 500 one at a time, 3 s of latency",
    )
    parser.add_argument("--timeout", type=float, default=90.0,
                        help="seconds allowed for one measurement")  # fmt: skip
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child(args.child)
        return
    if args.quick:
        args.jobs, args.single_jobs = min(args.jobs, 2_000), min(args.single_jobs, 500)
        args.duration = min(args.duration, 3.0)
    known = all_systems()
    wanted = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in known]
    if unknown:
        parser.error(f"unknown system(s): {', '.join(unknown)}")

    began = time.monotonic()
    say(f"bench/pg_compare.py  {time.strftime('%Y-%m-%d %H:%M:%S')}")
    for line in machine():
        say(line)
    with admin() as conn:
        say(f"postgresql: {conn.execute('SHOW server_version').fetchone()[0]} at "
            f"{conn.info.host}:{conn.info.port}, synchronous_commit "
            f"{conn.execute('SHOW synchronous_commit').fetchone()[0]}, fsync "
            f"{conn.execute('SHOW fsync').fetchone()[0]}")  # fmt: skip
    say(f"workload: {args.single_jobs:,} jobs one at a time, {args.jobs:,} in batches and "
        f"drains; latency {args.rate:,.0f} jobs/s for {args.duration:g} s")  # fmt: skip
    systems: list[System] = []
    for name in wanted:
        system = known[name]
        try:
            version = system.check()
        except Skip as exc:
            say(f"SKIPPED {name}: {exc}")
            continue
        say(f"system {name:<16} {version}")
        systems.append(system)

    table: dict[str, dict[str, float | None]] = {}
    t = args.timeout
    try:
        for s in systems:
            say(f"\n{s.name}")
            phases: list[tuple[str, str, Callable[[System], Phase]]] = [
                ("enq1", "enqueue 1 at a time",
                 lambda s: measure_enqueue(s, args.single_jobs, "single", t)),
                ("enqB", "enqueue in batches", lambda s: measure_enqueue(s, args.jobs, "batch", t)),
                ("drain1", "drain, 1 worker", lambda s: measure_drain(s, args.jobs, 1, t)),
                ("drain4", "drain, 4 workers", lambda s: measure_drain(s, args.jobs, 4, t)),
                ("lat", "latency", lambda s: measure_latency(s, args.rate, args.duration, t)),
            ]  # fmt: skip
            for key, label, fn in phases:
                record(table, s.name, key, timed(label, s, fn))
    finally:
        for child in list(CHILDREN):
            child.close()
        for proc in list(BROKERS):
            stop_popen(proc)
        for name in list(CREATED):
            with contextlib.suppress(Exception):
                drop_database(name)
    names = [s.name for s in systems]
    say(f"\n## PostgreSQL job queues, one server ({time.strftime('%Y-%m-%d %H:%M')})\n")
    say(f"{args.jobs:,} jobs in batches and drains, {args.single_jobs:,} one at a time; latency "
        f"at {args.rate:,.0f} jobs/s for {args.duration:g} s (1 publisher and 2 workers; "
        "Conveyor: a publisher per broker, max(2, brokers) workers). PostgreSQL CPU: the "
        "bench database's backends and the WAL writer. Ratios: Conveyor ÷ the best other "
        "system (above 1: Conveyor is faster).")  # fmt: skip
    print_table(table, names)
    say(f"\ntotal time {time.monotonic() - began:.0f} s; {load()}")


if __name__ == "__main__":
    main()
