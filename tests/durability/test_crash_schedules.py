"""Schedules through SIGKILLs (docs/contract.md, SCH-3): an SQLite broker with a schedule
of every second from its queues file, killed again and again at varied offsets around
its fire times and restarted with the same file, makes exactly one job per tick from the
first to the last: none twice (a tick's job and the schedule's progress commit together,
and its key would name the same job), and with ``missed = "each"`` none missing either
(the ticks that fell while it was down are caught up at the restart)."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import time
from collections import Counter
from pathlib import Path

from conveyor import Client

from .test_crash_flow import WAIT, free_port, start_process

# Where in the second each kill lands, after a tick at a whole second (0.0: on the tick).
OFFSETS = (0.02, 0.5, 0.95, 0.0, 0.25, 0.75, 0.1)

QUEUES = """
[schedules.tick]
queue = "ticks"
every_s = 1
missed = "each"
payload = { from = "the queues file" }
"""


async def keys_of(client: Client) -> list[str]:
    """The keys of every ready job of the queue, page by page."""
    keys: list[str] = []
    cursor = None
    while True:
        page = await client.list_jobs("ticks", "ready", cursor=cursor, limit=500)
        keys += [job.key or "" for job in page.jobs]
        cursor = page.next
        if cursor is None:
            return keys


async def test_each_tick_makes_exactly_one_job_through_repeated_sigkills(tmp_path: Path) -> None:
    db, port = tmp_path / "sched.db", free_port()
    queues = tmp_path / "queues.toml"
    queues.write_text(QUEUES)
    url = f"ws://127.0.0.1:{port}/ws"
    extra = ("--queues", str(queues))
    proc = await start_process(db, port, *extra)
    try:
        for offset in OFFSETS:
            # The next whole second of the clock (a tick) plus the offset.
            now = time.time()
            target = math.floor(now) + 1 + offset
            await asyncio.sleep(target - now)  # real time: the broker fires on its own clock
            os.kill(proc.pid, signal.SIGKILL)
            await proc.wait()
            proc = await start_process(db, port, *extra)
        async with Client(url, connect_timeout=WAIT, request_timeout=WAIT) as client:
            paused = await client.pause_schedule("tick")  # no tick while the jobs are counted
            assert paused is not None
            keys = await keys_of(client)
            stats = (await client.stats("ticks"))["ticks"]
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), WAIT)
    twice = [key for key, n in Counter(keys).items() if n > 1]
    assert twice == [], f"ticks that made two jobs: {twice}"
    ticks = sorted(int(key.rsplit(":", 1)[1]) for key in keys)
    assert all(key.startswith("schedule:tick:") for key in keys)
    assert len(ticks) >= len(OFFSETS)  # (it ran for several seconds)
    missing = sorted(set(range(ticks[0], ticks[-1] + 1, 1000)) - set(ticks))
    assert missing == [], f"ticks that made no job: {missing}"
    assert paused.fired == len(ticks) == stats["ready"]
    assert paused.last_at is not None and round(paused.last_at * 1000) == ticks[-1]
