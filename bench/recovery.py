"""Recovery of a 1,000,000-row SQLite job table: the time and memory a restart costs.

    .venv/bin/python bench/recovery.py [--rows 1000000] [--repeat 3] [--keep FILE]

1. Build: a table made through the engine and the store the broker uses
   (``SqliteStore.load`` on a new file, which starts the engine's journal), filled with
   ``--rows`` jobs of about 100 bytes, each with an idempotency key as the SDK sends one,
   over four queues: about 70 % ready, 20 % scheduled (delayed an hour), 5 % processing
   (claimed, under a lease) and 5 % dead (failed). The changes are written with
   ``SqliteStore.write(table.take_changes())`` every 50,000 jobs, as the group commit
   would, only in larger batches.
2. Load: in a fresh process each time (so that the build's memory is not counted),
   ``SqliteStore.load()`` rebuilds the table from the file; it prints the seconds it took,
   the seconds the broker then spends handing the restored leases to its dispatcher
   (``JobTable.held_leases``), and the process's RSS after the load (current, and peak
   from ``resource.getrusage``) next to its RSS before.
3. Serve: the time from starting ``conveyor serve`` on the file to its listening line,
   which is what an operator waits for after a crash.

The file size (and the WAL's, if any) is printed too. Timings on a shared machine are
noisy: compare within one run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from conveyor.broker.store import SqliteStore

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = {"to": "someone@example.com", "subject": "hello", "body": "x" * 45}  # ~100 bytes
QUEUES = ("emails", "reports", "webhooks", "thumbnails")
CHUNK = 50_000


def rss_kib() -> int:
    """The current resident set size in KiB (Linux ``/proc``; 0 where there is none)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def build(path: Path, rows: int) -> dict[str, int]:
    """Fill a new database at ``path`` with ``rows`` jobs; the count per state."""
    store = SqliteStore(path)
    table = store.load(clock=time.time, rng=random.Random(1), max_payload_bytes=1 << 20)
    queues = [table.queue(name) for name in QUEUES]
    rng = random.Random(7)
    counts = {"ready": 0, "scheduled": 0, "processing": 0, "dead": 0}
    for n in range(rows):
        queue = queues[n % len(queues)]
        roll = rng.random()
        key = f"auto-{uuid.UUID(int=rng.getrandbits(128)).hex}"
        if roll < 0.20:
            queue.enqueue(PAYLOAD, delay_s=3600.0, key=key)
            counts["scheduled"] += 1
            continue
        queue.enqueue(PAYLOAD, priority=n % 3, key=key)
        if roll < 0.25:
            # Taken by a worker: the oldest ready job of the queue, which is this one
            # often enough; what matters is how many rows are under a lease.
            [handle] = queue.claim_batch(f"worker-{n % 64}", 1)
            counts["processing"] += 1
        elif roll < 0.30:
            [handle] = queue.claim_batch(f"worker-{n % 64}", 1)
            handle.fail("it broke")
            counts["dead"] += 1
        else:
            counts["ready"] += 1
        if (n + 1) % CHUNK == 0:
            store.write(table.take_changes())
    store.write(table.take_changes())
    store.close()
    return counts


def load_once(path: Path) -> dict[str, float]:
    """Load ``path`` in this (fresh) process: seconds and RSS (run via ``--load``)."""
    before = rss_kib()
    store = SqliteStore(path)
    # As `conveyor serve` does: no cyclic collection while loading, then the table is
    # frozen out of the collector (broker/cli.py).
    gc.disable()
    started = time.perf_counter()
    table = store.load(clock=time.time, rng=random.Random(), max_payload_bytes=1 << 20)
    load_s = time.perf_counter() - started
    gc.freeze()
    gc.enable()
    started = time.perf_counter()
    held = table.held_leases()
    leases_s = time.perf_counter() - started
    after = rss_kib()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    stats = [table.queue(name).stats() for name in table.queues()]
    store.close()
    return {
        "load_s": load_s,
        "leases_s": leases_s,
        "held_leases": len(held),
        "rows": sum(s.ready + s.scheduled + s.processing + s.dead for s in stats),
        "processing": sum(s.processing for s in stats),
        "rss_before_mib": before / 1024,
        "rss_after_mib": after / 1024,
        "rss_peak_mib": peak / 1024,
    }


def load_in_fresh_process(path: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--load", str(path)],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    ).stdout
    result: dict[str, float] = json.loads(out)
    return result


def time_serve(path: Path) -> float:
    """Seconds from starting ``conveyor serve`` on ``path`` to its listening line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor", "serve", "--port", "0", "--store", "sqlite",
         "--db", str(path), "--log-level", "warning"],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the broker prints it once it listens, or exits
        elapsed = time.perf_counter() - started
        if not line.startswith("conveyor listening on "):
            raise RuntimeError(f"the broker did not start: {line!r}")
        return elapsed
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="loads to time (3)")
    parser.add_argument("--keep", type=Path, help="build the database here and keep it")
    parser.add_argument("--load", type=Path, help=argparse.SUPPRESS)  # one load, as JSON
    args = parser.parse_args()
    if args.load is not None:
        print(json.dumps(load_once(args.load)))
        return 0

    with tempfile.TemporaryDirectory(prefix="conveyor-recovery-") as tmp:
        path = args.keep or Path(tmp) / "recovery.db"
        if path.exists():
            raise SystemExit(f"{path} exists; give a new file")
        started = time.perf_counter()
        counts = build(path, args.rows)
        build_s = time.perf_counter() - started
        size = path.stat().st_size
        wal = Path(f"{path}-wal")
        wal_size = wal.stat().st_size if wal.exists() else 0
        print(f"built {args.rows:,} rows in {build_s:.1f}s: {counts}")
        print(
            f"file: {size / 2**20:.1f} MiB ({size / args.rows:.0f} bytes/row), "
            f"WAL after close: {wal_size / 2**20:.1f} MiB"
        )
        runs = [load_in_fresh_process(path) for _ in range(args.repeat)]
        for i, run in enumerate(runs, 1):
            print(
                f"load {i}: {run['load_s']:.2f}s for {int(run['rows']):,} rows "
                f"({run['rows'] / run['load_s']:,.0f} rows/s); held_leases "
                f"{int(run['held_leases']):,} in {run['leases_s']:.3f}s; RSS "
                f"{run['rss_before_mib']:.0f} -> {run['rss_after_mib']:.0f} MiB "
                f"(peak {run['rss_peak_mib']:.0f} MiB)"
            )
            assert run["rows"] == args.rows, run
            assert run["processing"] == counts["processing"], run
        median = statistics.median(run["load_s"] for run in runs)
        after = statistics.median(run["rss_after_mib"] - run["rss_before_mib"] for run in runs)
        print(
            f"SqliteStore.load(): median {median:.2f}s for {args.rows:,} rows; "
            f"RSS +{after:.0f} MiB after load ({after * 2**20 / args.rows:.0f} bytes/row)"
        )
        serve_s = [time_serve(path) for _ in range(args.repeat)]
        print(
            "conveyor serve to its listening line: "
            + ", ".join(f"{s:.2f}s" for s in serve_s)
            + f" (median {statistics.median(serve_s):.2f}s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
