"""What the broker cannot account for, it refuses at start (``broker/store/sqlite.py``,
"What the files must hold"): files that lost commits or are damaged stop ``conveyor
serve`` with exit status 2 and one line naming the file, what is wrong and
``--accept-loss``, never an empty or partial table by mistake. With ``--accept-loss`` it
starts, says what was lost, and the next start takes the files as they are.

Brokers run as real processes; a crash is a SIGKILL.
"""

from __future__ import annotations

import random
import re
import signal
from pathlib import Path

import pytest

from conveyor.broker.cli import build_parser
from conveyor.broker.config import ConfigError, config_from_args
from conveyor.broker.store import SqliteStore, StoreError
from conveyor.broker.store._marker import CommitMarker, boot_id
from conveyor.sdk import Client

from .test_store_errors import WAIT, refused, serving

JOBS = 30


async def _killed_with_jobs(db: Path) -> int:
    """A broker on ``db`` that answered ``JOBS`` enqueues, one commit or more each, then
    was killed: the commit number its marker records."""
    async with serving(db) as served:
        async with Client(served.url, connect_timeout=WAIT, request_timeout=WAIT) as client:
            for n in range(JOBS):
                await client.enqueue("emails", {"n": n})
        await served.stop(signal.SIGKILL)
    # Fewer commits than a checkpoint takes: everything since the start is in the WAL.
    assert _read(_wal(db))
    return JOBS


def _wal(db: Path) -> Path:
    return db.with_name(db.name + "-wal")


def _read(path: Path) -> bytes:
    return path.read_bytes()


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def _damage(path: Path) -> bytes:
    """Overwrite bytes in the middle of the file at ``path``; what it then holds."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = random.Random(2).randbytes(64)
    path.write_bytes(bytes(data))
    return bytes(data)


def _one_line_refusal(returncode: int | None, out: bytes, message: str, path: Path) -> None:
    assert returncode == 2, message
    assert out == b""  # it never listened
    assert message.startswith(f"conveyor: {path}: "), message
    assert "start with --accept-loss to accept the loss" in message, message
    assert "Traceback" not in message and message.count("\n") == 1, message


async def _ready_count(db: Path, *flags: str) -> tuple[int, str]:
    """Start a broker on ``db`` (it must start): how many jobs are ready in "emails", and
    what it wrote to stderr (its warnings) by the time it stopped."""
    async with serving(db, *flags) as served:
        async with Client(served.url, connect_timeout=WAIT, request_timeout=WAIT) as client:
            ready = (await client.stats()).get("emails", {}).get("ready", 0)
        assert await served.stop() == 0
    return ready, served.stderr


async def test_an_empty_database_file_is_refused_and_accept_loss_starts_on_it(
    tmp_path: Path,
) -> None:
    db = tmp_path / "conveyor.db"
    _write(db, b"")
    returncode, out, message = await refused(db)
    _one_line_refusal(returncode, out, message, db)
    assert "the database file is empty (0 bytes)" in message, message
    assert _read(db) == b""  # left as it was

    ready, logged = await _ready_count(db, "--accept-loss")
    assert ready == 0
    assert "WARNING" in logged and "the database file is empty" in logged, logged
    assert "starting anyway (--accept-loss)" in logged, logged
    # The loss was accepted once: the next start needs no flag.
    assert (await _ready_count(db))[0] == 0


async def test_a_brand_new_path_starts_empty(tmp_path: Path) -> None:
    ready, logged = await _ready_count(tmp_path / "conveyor.db")
    assert (ready, logged) == (0, "")


async def test_an_emptied_database_file_after_jobs_names_the_commits_it_held(
    tmp_path: Path,
) -> None:
    db = tmp_path / "conveyor.db"
    async with serving(db) as served:
        async with Client(served.url, connect_timeout=WAIT, request_timeout=WAIT) as client:
            await client.enqueue("emails", {"n": 1})
        assert await served.stop() == 0
    _write(db, b"")
    returncode, out, message = await refused(db)
    _one_line_refusal(returncode, out, message, db)
    marker = re.escape(f"{db}-commits")
    assert re.search(rf"empty \(0 bytes\); {marker} records commit \d+", message), message


async def test_a_deleted_wal_after_a_sigkill_is_refused_with_the_commits_lost(
    tmp_path: Path,
) -> None:
    db = tmp_path / "conveyor.db"
    await _killed_with_jobs(db)
    _wal(db).unlink()
    returncode, out, message = await refused(db)
    _one_line_refusal(returncode, out, message, db)
    found = re.search(r": (\d+) commits lost: .*-commits records commit (\d+), ", message)
    assert found, message
    assert int(found[1]) == int(found[2]) >= JOBS  # the files hold none of them
    assert "the -wal file is missing or damaged" in message
    # Refused again, the same way: nothing was changed by the refusal.
    assert (await refused(db))[2] == message


async def test_accept_loss_after_a_deleted_wal_starts_and_says_how_much_was_lost(
    tmp_path: Path,
) -> None:
    db = tmp_path / "conveyor.db"
    await _killed_with_jobs(db)
    _wal(db).unlink()
    message = (await refused(db))[2]
    lost = re.search(r"(\d+) commits lost", message)
    assert lost, message

    ready, logged = await _ready_count(db, "--accept-loss")
    assert ready == 0  # what only the WAL held is gone, as the warning says
    assert "WARNING" in logged and f"{lost[1]} commits lost" in logged, logged
    assert "starting anyway (--accept-loss)" in logged, logged
    # Re-baselined: the next start takes the files as they are.
    assert await _ready_count(db) == (0, "")


async def test_a_damaged_wal_after_a_sigkill_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "conveyor.db"
    await _killed_with_jobs(db)
    damaged = _damage(_wal(db))
    returncode, out, message = await refused(db)
    _one_line_refusal(returncode, out, message, db)
    found = re.search(r": (\d+) commits lost: .*records commit (\d+), ", message)
    assert found, message
    # SQLite reads the WAL up to the damaged frame: the files hold a part, not all.
    assert 0 < int(found[1]) <= int(found[2])
    assert _read(_wal(db)) == damaged  # left as it was, for whoever looks into it


async def test_a_sigkill_and_restart_with_the_wal_in_place_is_not_refused(
    tmp_path: Path,
) -> None:
    db = tmp_path / "conveyor.db"
    await _killed_with_jobs(db)
    assert await _ready_count(db) == (JOBS, "")


async def test_a_damaged_commit_marker_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "conveyor.db"
    await _killed_with_jobs(db)
    marker = db.with_name(db.name + "-commits")
    _write(marker, b"x" * 7)
    returncode, out, message = await refused(db)
    _one_line_refusal(returncode, out, message, marker)
    assert "damaged commit marker" in message
    ready, logged = await _ready_count(db, "--accept-loss")
    assert ready == JOBS
    assert f"WARNING conveyor.store: {marker}: damaged commit marker: 7 bytes; " in logged


async def test_a_garbage_claim_log_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "conveyor.db"
    await _killed_with_jobs(db)
    log = db.with_name(db.name + "-claims")
    garbage = random.Random(4).randbytes(500)
    _write(log, garbage)
    returncode, out, message = await refused(db)
    _one_line_refusal(returncode, out, message, log)
    assert "damaged claim log" in message
    assert _read(log) == garbage
    ready, logged = await _ready_count(db, "--accept-loss")
    assert ready == JOBS and "damaged claim log" in logged, logged


def test_conveyor_accept_loss_in_the_environment_does_what_the_flag_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def accepts(*flags: str) -> bool:
        return config_from_args(build_parser().parse_args(["serve", *flags])).accept_loss

    monkeypatch.delenv("CONVEYOR_ACCEPT_LOSS", raising=False)
    assert (accepts(), accepts("--accept-loss")) == (False, True)
    monkeypatch.setenv("CONVEYOR_ACCEPT_LOSS", "1")
    assert accepts()
    monkeypatch.setenv("CONVEYOR_ACCEPT_LOSS", "0")
    assert not accepts()
    monkeypatch.setenv("CONVEYOR_ACCEPT_LOSS", "maybe")
    with pytest.raises(ConfigError, match="CONVEYOR_ACCEPT_LOSS: cannot read 'maybe' as 1 or 0"):
        accepts()


def test_after_a_reboot_only_what_was_fsynced_must_be_there(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A power loss may take commits that were written but not yet fsynced (never
    # confirmed with --sync full; allowed to go with --sync normal): after a restart of
    # the machine, only the marker's fsynced commit must be there, and the rest is told.
    db = tmp_path / "conveyor.db"
    store = SqliteStore(db, sync="normal")
    table = store.load(clock=lambda: 1000.0, rng=random.Random(0), max_payload_bytes=1 << 20)
    table.queue("q").enqueue({"n": 1})
    store.write(table.take_changes())
    held = store._commit_no
    store.close()
    marker = CommitMarker(db.with_name(db.name + "-commits"))

    def marked(boot: bytes) -> None:
        marker.boot = boot
        marker.baseline(held + 5, held)
        marker.close()

    marked(bytes(16) if boot_id() != bytes(16) else b"another boot....")
    store = SqliteStore(db, sync="normal")
    store.load(clock=lambda: 1000.0, rng=random.Random(0), max_payload_bytes=1 << 20)
    store.close()
    assert "the machine restarted: 5 commits written after the last fsync are lost" in caplog.text

    marked(boot_id())  # the same boot: the broker alone restarted, and they were kept
    with pytest.raises(StoreError, match="5 commits lost: "):
        SqliteStore(db, sync="normal").load(
            clock=lambda: 1000.0, rng=random.Random(0), max_payload_bytes=1 << 20
        )
