"""The claim log (``broker/store/_claim_log.py``): a commit of claims only is appended to
``<db>-claims`` first, its pushes leave, and then it is written into SQLite (with either
``--sync``). A broker killed between the two leaves claims that only the log holds:
``load`` must lay them over their rows (so the worker's leases stay valid and the
attempts stay counted), write them into SQLite, and empty the log. A torn last record
(what a killed broker leaves), or a log of another database, is ignored; anything else
that is not a record stops the start, unless the loss is accepted."""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from conveyor.broker.engine import Changes, JobTable, QueueOpts, ScheduleSpec
from conveyor.broker.store import SqliteStore, StoreError, _claim_log
from conveyor.broker.store import sqlite as sqlite_store
from conveyor.broker.store._claim_log import ClaimLog, LoggedClaims

ROOT = Path(__file__).resolve().parents[2]


def _load(store: SqliteStore) -> JobTable:
    return store.load(clock=lambda: 1000.0, rng=random.Random(0), max_payload_bytes=1 << 20)


def _log_path(db: Path) -> Path:
    return db.with_name(db.name + "-claims")


def _stored_claim_records(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        count: int = conn.execute("SELECT count(*) FROM claims").fetchone()[0]
    return count


def _header(store: SqliteStore) -> bytes:
    """What an empty claim log holds: its header."""
    assert store._claim_log is not None
    return store._claim_log._header


async def _committed(store: SqliteStore, changes: Changes, order: list[str]) -> None:
    done = store.commit_now(changes, lambda: order.append("written"))
    assert done is not False
    if done is not True:
        await done


@pytest.mark.parametrize("sync", ["full", "normal"])
async def test_a_commit_of_claims_only_calls_back_before_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: str
) -> None:
    store = SqliteStore(tmp_path / "c.db", sync=sync)
    table = _load(store)
    queue = table.queue("q")
    order: list[str] = []
    write = store.write

    def spy(changes: Changes, packed: tuple[str, bytes] | None = None) -> None:
        order.append("write")
        write(changes, packed)

    monkeypatch.setattr(store, "write", spy)
    try:
        queue.enqueue({"i": 0})
        queue.claim_batch("w1", 1)  # enqueued and claimed in one commit: a new row
        await _committed(store, table.take_changes(), order)
        # A new row is not for the log: the frames wait for the write (and with full,
        # only to the fsync that follows it, so written is called between the two).
        assert order == (["write", "written"] if sync == "full" else ["write"])
        assert _log_path(store.path).stat().st_size == len(_header(store))
        queue.enqueue({"i": 1})
        await _committed(store, table.take_changes(), [])
        order.clear()
        queue.claim_batch("w1", 1)  # the claim of a stored row: claims only
        await _committed(store, table.take_changes(), order)
        assert order == ["written", "write"]
        assert _log_path(store.path).stat().st_size > len(_header(store))
    finally:
        store.close()


@pytest.mark.parametrize("sync", ["full", "normal"])
async def test_a_commit_of_claims_and_a_schedule_change_is_not_claims_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync: str
) -> None:
    # The log holds claims only: a schedule's change beside them (a pause, say) would be
    # lost with a broker killed after the pushes left, before the write.
    store = SqliteStore(tmp_path / "c.db", sync=sync)
    table = _load(store)
    queue = table.queue("q")
    order: list[str] = []
    write = store.write

    def spy(changes: Changes, packed: tuple[str, bytes] | None = None) -> None:
        order.append("write")
        write(changes, packed)

    monkeypatch.setattr(store, "write", spy)
    try:
        table.set_schedule(ScheduleSpec(id="s", queue="q", every_s=60.0))
        queue.enqueue({"i": 0})
        await _committed(store, table.take_changes(), [])
        order.clear()
        queue.claim_batch("w1", 1)
        table.pause_schedule("s", True)
        changes = table.take_changes()
        assert changes.claims and changes.schedules and not (changes.upserts or changes.updates)
        await _committed(store, changes, order)
        assert order == (["write", "written"] if sync == "full" else ["write"])
        assert _log_path(store.path).stat().st_size == len(_header(store))
    finally:
        store.close()
    again = SqliteStore(tmp_path / "c.db", sync="normal")
    try:
        info = _load(again).get_schedule("s")
        assert info is not None and info.spec.paused and info.next_at is None
    finally:
        again.close()


_KILLED_BETWEEN_LOG_AND_COMMIT = textwrap.dedent(
    """
    import asyncio, os, random, signal, sys
    from conveyor.broker.store import SqliteStore

    async def main():
        store = SqliteStore(sys.argv[1], sync=sys.argv[2])
        table = store.load(clock=lambda: 1000.0, rng=random.Random(0), max_payload_bytes=1 << 20)
        queue = table.queue("q")
        for i in range(3):
            queue.enqueue({"i": i})
        await store.commit(table.take_changes())
        handles = queue.claim_batch("w1", 2)
        print(" ".join(f"{h.id}={h.lease}" for h in handles), flush=True)
        # The gate's callback puts the pushes on the wire; the broker dies right after.
        store.commit_now(table.take_changes(), lambda: os.kill(os.getpid(), signal.SIGKILL))
        print("still alive", flush=True)

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("sync", ["full", "normal"])
def test_claims_pushed_before_a_kill_survive_it(tmp_path: Path, sync: str) -> None:
    db = tmp_path / "c.db"
    child = subprocess.run(
        [sys.executable, "-c", _KILLED_BETWEEN_LOG_AND_COMMIT, str(db), sync],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == -9, child.stderr
    pushed = dict(pair.split("=") for pair in child.stdout.split())
    assert len(pushed) == 2 and "still alive" not in child.stdout
    assert _stored_claim_records(db) == 0  # SQLite never got them: only the log has them

    store = SqliteStore(db)
    table = _load(store)
    try:
        held = {(job_id, lease, worker) for job_id, lease, worker in table.held_leases()}
        assert held == {(job_id, lease, "w1") for job_id, lease in pushed.items()}
        for job_id in pushed:
            job = table.get_job(job_id)
            assert job is not None and job.state == "processing" and job.attempts == 1
        # A new claim gets a lease that none of the pushed ones has.
        [third] = table.queue("q").claim_batch("w2", 1)
        assert third.lease not in pushed.values()
        # The log was emptied, its claims now in SQLite.
        assert _log_path(db).read_bytes() == _header(store)
        assert _stored_claim_records(db) == 1
        # The worker that got the pushes reconnects and acks them.
        assert all(table.ack(job_id, lease) for job_id, lease in pushed.items())
    finally:
        store.close()
    _log_path(db).unlink()
    store = SqliteStore(db)  # without the log: the claims are in SQLite
    table = _load(store)
    try:
        assert {job_id for job_id, _, _ in table.held_leases()} == set(pushed)
    finally:
        store.close()


def _claims_not_committed(db: Path) -> tuple[list[str], list[str], LoggedClaims]:
    """A database with three stored jobs, two of them claimed in a commit that only the
    log would hold: returns the ids, those claims' leases, and that log record."""
    store = SqliteStore(db, sync="normal")
    table = _load(store)
    ids = [table.queue("q").enqueue({"i": i}) for i in range(3)]
    store.write(table.take_changes())
    handles = table.queue("q").claim_batch("w1", 2)
    changes = table.take_changes()
    texts, numbers = sqlite_store._pack_claims(changes.claims)
    record = LoggedClaims(store._commit_no + 1, changes.meta[2], texts, numbers)
    store.close()
    return ids, [h.lease for h in handles], record


def _append(db: Path, prefix: str, *records: LoggedClaims) -> ClaimLog:
    log = ClaimLog.lock(_log_path(db))
    log.read(prefix)
    for record in records:
        log.append(*record)
    return log


def _prefix(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        prefix: str = conn.execute("SELECT id_prefix FROM meta").fetchone()[0]
    return prefix


def test_a_torn_record_after_a_whole_one_is_ignored(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    ids, leases, record = _claims_not_committed(db)
    log = _append(db, _prefix(db), record)
    log.close()
    whole = _log_path(db).stat().st_size
    later = record._replace(commit_no=record.commit_no + 1, leases_issued=record.leases_issued + 1)
    log = _append(db, _prefix(db), later)
    log.close()
    with open(_log_path(db), "r+b") as file:
        file.truncate(whole + 20)  # the second record torn
    store = SqliteStore(db, sync="normal")
    table = _load(store)
    try:
        assert sorted(lease for _, lease, _ in table.held_leases()) == sorted(leases)
        assert store._commit_no == record.commit_no
        job = table.get_job(ids[2])
        assert job is not None and job.state == "pending"
    finally:
        store.close()


def test_a_log_record_already_in_sqlite_is_not_laid_over_again(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    ids, _, record = _claims_not_committed(db)
    # A commit with that number reached SQLite (here one with no claims in it), so the
    # record's claims were in SQLite when it was written, or were overtaken since.
    store = SqliteStore(db, sync="normal")
    table = _load(store)
    store.write(table.take_changes())
    store.close()
    _append(db, _prefix(db), record).close()
    store = SqliteStore(db, sync="normal")
    table = _load(store)
    try:
        assert table.held_leases() == []
        assert all(table.get_job(i).state == "pending" for i in ids)  # type: ignore[union-attr]
    finally:
        store.close()


def test_another_databases_log_is_ignored_and_emptied(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    _, _, record = _claims_not_committed(db)
    _append(db, "someone-else-", record).close()
    store = SqliteStore(db, sync="normal")
    table = _load(store)
    try:
        assert table.held_leases() == []
        assert _log_path(db).read_bytes() == _header(store)
    finally:
        store.close()


async def test_the_log_is_emptied_once_it_is_large_and_its_claims_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_claim_log, "_LIMIT", 1)  # emptied after every commit
    db = tmp_path / "c.db"
    store = SqliteStore(db)
    table = _load(store)
    queue = table.queue("q")
    header = b""
    try:
        for i in range(4):
            queue.enqueue({"i": i})
        await _committed(store, table.take_changes(), [])
        for _ in range(4):
            queue.claim_batch("w1", 1)
            await _committed(store, table.take_changes(), [])
        log = store._claim_log
        assert log is not None and log.resets == 4
        header = log._header
        assert _log_path(db).read_bytes() == header
    finally:
        store.close()
    store = SqliteStore(db)
    table = _load(store)
    try:
        assert len(table.held_leases()) == 4
    finally:
        store.close()


def _file_of(records: list[LoggedClaims]) -> tuple[bytes, list[int]]:
    """A log holding ``records``, and where each record ends in it."""
    header = b"conveyor-claims 1\nP\n"
    data, ends = bytearray(header), []
    for record in records:
        encoded = record.texts.encode()
        body = _claim_log._BODY.pack(record.commit_no, record.leases_issued, len(encoded))
        body += encoded + record.numbers
        data += _claim_log._RECORD.pack(len(body), _claim_log.zlib.crc32(body)) + body
        ends.append(len(data))
    return bytes(data), ends


def _numbered(records: list[LoggedClaims]) -> list[LoggedClaims]:
    """The records with commit numbers that go up, as a broker writes them."""
    return [r._replace(commit_no=n) for n, r in enumerate(records, 1)]


_records = st.lists(
    st.builds(
        LoggedClaims,
        st.integers(0, 2**62),
        st.integers(0, 2**62),
        st.text(max_size=40),
        st.binary(max_size=60),
    ),
    max_size=5,
).map(_numbered)


@settings(max_examples=200, deadline=None)
@given(records=_records, cut=st.integers(0, 10**6))
def test_a_log_cut_anywhere_reads_back_the_records_wholly_before_the_cut(
    records: list[LoggedClaims], cut: int
) -> None:
    data, ends = _file_of(records)
    start = len(b"conveyor-claims 1\nP\n")
    at = start + cut % (len(data) - start + 1)
    kept = [r for r, end in zip(records, ends, strict=True) if end <= at]
    assert _claim_log._parse(data[:at], start) == (kept, None)  # a torn tail is no damage


@settings(max_examples=200, deadline=None)
@given(records=_records.filter(bool), where=st.integers(0, 10**6), flip=st.integers(1, 255))
def test_a_log_with_a_corrupt_byte_reads_back_the_records_before_it(
    records: list[LoggedClaims], where: int, flip: int
) -> None:
    data, ends = _file_of(records)
    start = len(b"conveyor-claims 1\nP\n")
    at = start + where % (len(data) - start)
    corrupt = bytearray(data)
    corrupt[at] ^= flip
    before = [r for r, end in zip(records, ends, strict=True) if end <= at]
    kept, damage = _claim_log._parse(bytes(corrupt), start)
    assert kept == before
    # With a record after the corrupt one, it is no torn tail, unless the corrupt byte
    # is in its length, which may then reach past the end as a torn record's does.
    hit = len(before)
    begins = ends[hit - 1] if before else start
    if hit < len(records) - 1 and at - begins >= 4:
        assert damage is not None and f"byte {begins} of {len(data)}" in damage


def test_garbage_after_the_records_is_damage_and_zeros_at_the_end_a_torn_record() -> None:
    records = _numbered([LoggedClaims(0, 5, '[["processing"],["w"],["l"]]', bytes(24))] * 2)
    data, ends = _file_of(records)
    start = len(b"conveyor-claims 1\nP\n")
    garbage = random.Random(3).randbytes(200)
    kept, damage = _claim_log._parse(data + garbage, start)
    assert kept == records
    assert damage is not None and f"byte {ends[-1]} of {ends[-1] + 200}" in damage
    # A power loss may leave a last record's length on the disk but not its bytes.
    zeros = data[: ends[0]] + bytes(ends[1] - ends[0])
    assert _claim_log._parse(zeros, start) == (records[:1], None)
    # A whole record, intact, behind a bad one: the bad one is no torn tail.
    middle = bytearray(data)
    middle[ends[0] - 1] ^= 1
    kept, damage = _claim_log._parse(bytes(middle), start)
    assert kept == [] and damage is not None


def test_a_garbage_log_stops_the_load_naming_the_file_and_accept_loss_empties_it(
    tmp_path: Path,
) -> None:
    db = tmp_path / "c.db"
    _claims_not_committed(db)
    _log_path(db).write_bytes(random.Random(6).randbytes(300))
    with pytest.raises(StoreError) as caught:
        _load(SqliteStore(db, sync="normal"))
    message = str(caught.value)
    assert message.startswith(f"{_log_path(db)}: damaged claim log: "), message
    assert "--accept-loss" in message
    assert len(_log_path(db).read_bytes()) == 300  # left as it was
    store = SqliteStore(db, sync="normal", accept_loss=True)
    table = _load(store)
    try:
        assert table.held_leases() == []
        assert _log_path(db).read_bytes() == _header(store)
    finally:
        store.close()


def test_a_missing_log_directory_entry_is_created_at_load(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    store = SqliteStore(db, sync="normal")
    _load(store)
    store.close()
    _log_path(db).unlink()
    store = SqliteStore(db, sync="normal")
    _load(store)
    try:
        assert _log_path(db).exists()
    finally:
        store.close()


def test_a_stored_record_whose_claim_a_logged_reclaim_overtook_is_deleted_at_load(
    tmp_path: Path,
) -> None:
    db = tmp_path / "c.db"
    now = [1000.0]
    store = SqliteStore(db, sync="normal")
    table = store.load(clock=lambda: now[0], rng=random.Random(0), max_payload_bytes=1 << 20)
    queue = table.queue("q", QueueOpts(visibility_timeout_s=5.0))
    job_id = queue.enqueue({"i": 0})
    store.write(table.take_changes())
    queue.claim_batch("w1", 1)
    store.write(table.take_changes())  # the first claim: a record in SQLite
    assert _stored_claim_records(db) == 1
    now[0] += 10.0  # its lease lapses
    [again] = queue.claim_batch("w2", 1)  # a reclaim, that only the log gets
    changes = table.take_changes()
    assert changes.claims and not (changes.upserts or changes.updates)
    texts, numbers = sqlite_store._pack_claims(changes.claims)
    record = LoggedClaims(store._commit_no + 1, changes.meta[2], texts, numbers)
    store.close()
    _append(db, _prefix(db), record).close()
    store = SqliteStore(db, sync="normal")
    table = store.load(clock=lambda: now[0], rng=random.Random(0), max_payload_bytes=1 << 20)
    try:
        assert table.held_leases() == [(job_id, again.lease, "w2")]
        job = table.get_job(job_id)
        assert job is not None and job.attempts == 2
        assert _stored_claim_records(db) == 1  # the reclaim's record; the first one went
        with sqlite3.connect(db) as conn:
            [(commit_no,)] = conn.execute("SELECT commit_no FROM claims").fetchall()
        assert commit_no == record.commit_no
    finally:
        store.close()


def test_a_second_store_on_an_open_database_is_refused_until_the_first_closes(
    tmp_path: Path,
) -> None:
    db = tmp_path / "c.db"
    first = SqliteStore(db)
    table = _load(first)
    table.queue("q").enqueue({"i": 0})
    second = SqliteStore(db)
    with pytest.raises(StoreError, match="another Conveyor broker has this database open"):
        _load(second)
    # The refused store read and wrote nothing: the first commits on as before.
    first.write(table.take_changes())
    table.queue("q").claim_batch("w1", 1)
    first.write(table.take_changes())
    first.close()
    third = SqliteStore(db)
    try:
        restored = _load(third)
        assert restored.queue("q").stats().processing == 1
    finally:
        third.close()


def _copy_files(db: Path, to: Path) -> Path:
    """The database's files as they are now, copied to ``to`` (between commits)."""
    to.mkdir()
    for suffix in ("", "-wal", "-claims"):
        source = db.with_name(db.name + suffix)
        if source.exists():
            (to / (db.name + suffix)).write_bytes(source.read_bytes())
    return to / db.name


def test_a_lease_forgotten_by_a_power_loss_is_not_issued_again(tmp_path: Path) -> None:
    # A push leaves before its commit's fsync, so a power loss can forget its claim, and
    # the lease count with it. The worker may still hold that lease when the broker is
    # back: a new claim of the same job must not get the same lease, or that worker's
    # late ack would land on another worker's attempt.
    db = tmp_path / "c.db"
    store = SqliteStore(db, sync="normal")
    table = _load(store)
    job_id = table.queue("q").enqueue({"i": 0})
    store.write(table.take_changes())
    durable = _copy_files(db, tmp_path / "at-the-last-fsync")
    [pushed] = table.queue("q").claim_batch("w1", 1)
    store.write(table.take_changes())
    store.close()

    after = SqliteStore(durable, sync="normal")  # what the disk held after the power loss
    try:
        table = _load(after)
        [again] = table.queue("q").claim_batch("w2", 1)
        assert again.id == job_id and again.attempt == 1  # the claim was forgotten
        assert again.lease != pushed.lease
        assert not table.ack(job_id, pushed.lease)  # the old worker's ack does not land
        assert table.ack(job_id, again.lease)
    finally:
        after.close()


def test_with_sync_full_load_fsyncs_the_raised_lease_count_before_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "c.db"
    store = SqliteStore(db)
    table = _load(store)
    table.queue("q").enqueue({"i": 0})
    table.queue("q").claim_batch("w1", 1)
    store.write(table.take_changes())
    store.close()

    def stored_count() -> int:
        with sqlite3.connect(db) as conn:
            count: int = conn.execute("SELECT leases_issued FROM meta").fetchone()[0]
        return count

    before = stored_count()
    counts_at_fsync: list[int] = []
    fdatasync = os.fdatasync

    def noting(fd: int) -> None:
        counts_at_fsync.append(stored_count())
        fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", noting)
    again = SqliteStore(db)
    try:
        _load(again)
        # The raised count was in the WAL by the fsync that load made before returning.
        assert counts_at_fsync and counts_at_fsync[-1] == before + sqlite_store._LEASE_GAP
    finally:
        again.close()
