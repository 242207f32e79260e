"""The claim log: a commit's claims, appended to a file of their own before the commit.

A pushed job's claim must survive a killed broker (README, "Claims"). Written into
SQLite, that took one whole commit before every push: in a 1-worker drain the worker then
sat idle while the broker wrote (about a sixth of each window's round trip). Appending
the commit's claim record to this file is one ``write`` system call; once it returns,
the record is in the page cache, which a killed process does not take with it. So the
push may leave at once, and the SQLite commit that holds the same claims follows while
the worker starts.

``load`` reads back the records of commits that never reached SQLite (the broker was
killed between the append and the commit), lays their claims over their rows, writes
them into SQLite, and empties the log. While the broker runs, the log is emptied once it
holds ``_LIMIT`` bytes, right after a commit (everything in it is then in SQLite too).

The store holds an exclusive ``flock`` on this file from the start of ``load`` to
``close``: it is how a second broker started on the same database is refused (the kernel
lets go of it when the process dies, so a killed broker never leaves it behind).

Nothing here is fsynced: like a push before the WAL's fsync, a power loss may forget the
claims of the last moments (the job is then handed out again without that attempt
counted). A job's last attempt never goes out before its fsync (``broker/dispatch.py``).

Format: a header, ``_MAGIC`` and the database's id prefix (a log left by another database
is ignored); then records, each ``<len:u32><crc32:u32>`` and a body of ``len`` bytes:
``<commit number:i64><leases issued:i64><texts length:u32>``, the texts (UTF-8) and the
numbers of a claim record (``sqlite._pack_claims``).

Each record goes in one ``write``; a killed broker (or a full disk) can leave only the
last one torn: cut short, or, after a power loss, its whole length written but not its
bytes. Such a torn last record is dropped (its commit never happened). Anything else
that is not a record (a bad one with more bytes after it, a record whose length or
commit number no broker wrote, a file that does not start with the header) is damage:
``read`` reports it, and the store refuses to start unless told to accept the loss.
"""

from __future__ import annotations

import fcntl
import os
import struct
import zlib
from pathlib import Path
from typing import NamedTuple

from ._base import StoreError

__all__ = ["ClaimLog", "LoggedClaims"]

_MAGIC = b"conveyor-claims 1\n"
_RECORD = struct.Struct("<II")  # body length, crc32 of the body
_BODY = struct.Struct("<qqI")  # commit number, leases issued, length of the texts
# Emptied (after a commit) once it holds this much: a few hundred drain commits.
_LIMIT = 1 << 20
# The longest record taken for a torn one; a longer length is damage. (A commit's claims
# are a few dozen bytes each: this is millions of them.)
_TORN_MAX = 1 << 28


class LoggedClaims(NamedTuple):
    """One record read back: the commit it was to be, the lease count then, the record."""

    commit_no: int
    leases_issued: int
    texts: str
    numbers: bytes


class ClaimLog:
    """An open, locked claim log. ``lock``, then ``read`` to get what it held; ``append``
    each commit's claims before the commit; ``written`` after the commit (it empties the
    log when due); ``close`` at the end, which lets go of the lock. Every method raises
    ``StoreError`` when the file fails."""

    def __init__(self, path: Path, fd: int, header: bytes) -> None:
        self.path = path
        self._fd = fd
        self._header = header
        self._size = len(header)
        self.resets = 0  # times emptied while running (for tests)

    @classmethod
    def lock(cls, path: Path) -> ClaimLog:
        """Open (creating) the log and lock it: the lock is held until ``close`` (or the
        process ends, killed or not), so that no second broker opens the same database
        while this one runs. Its ``load`` would empty a log this one still appends to,
        and both would write the same rows. Then call ``read``. Raises ``StoreError``,
        saying so, when another process holds the lock (or another store in this one)."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StoreError(f"{path}: cannot open the claim log: {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreError(
                f"{path}: locked: another Conveyor broker has this database open; stop "
                "it first, or give this one a database of its own (--db)"
            ) from None
        except OSError as exc:
            os.close(fd)
            raise StoreError(f"{path}: cannot lock the claim log: {exc}") from None
        return cls(path, fd, b"")

    def discard_if_empty(self) -> None:
        """Remove the file if it is empty (made by ``lock``, never read): a store whose
        load failed leaves nothing beside the database. Call before ``close``, while the
        lock still keeps other stores off it."""
        try:
            if os.fstat(self._fd).st_size == 0:
                os.unlink(self.path)
        except OSError:
            pass  # (only tidiness is lost)

    def read(self, id_prefix: str) -> tuple[list[LoggedClaims], str | None]:
        """The records the log holds for the database whose id prefix is ``id_prefix``
        (none when it is new or belongs to another database, which empties it), and
        what is damaged in it (``None`` if nothing: a torn last record is not damage),
        saying where; call once, before ``append``. The records stay in the file until
        ``reset``: call it once they are in SQLite."""
        self._header = _MAGIC + id_prefix.encode() + b"\n"
        try:
            with open(self._fd, "rb", closefd=False) as file:
                data = file.read()
            if not data.startswith(self._header):
                if not (data.startswith(_MAGIC) or self._header.startswith(data)):
                    return [], f"damaged claim log: no claim log header in its {len(data)} bytes"
                self.reset()  # new (its header maybe torn), or another database's
                return [], None
            self._size = len(data)
            return _parse(data, len(self._header))
        except (OSError, StoreError) as exc:
            raise StoreError(f"{self.path}: cannot read the claim log: {exc}") from None

    def append(self, commit_no: int, leases_issued: int, texts: str, numbers: bytes) -> None:
        """Append one commit's claim record; once this returns, it survives a killed
        broker (not a power loss)."""
        encoded = texts.encode()
        body = _BODY.pack(commit_no, leases_issued, len(encoded)) + encoded + numbers
        data = _RECORD.pack(len(body), zlib.crc32(body)) + body
        try:
            written = os.write(self._fd, data)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot write the claim log: {exc}") from None
        if written != len(data):  # a full disk: the tail is torn, so load stops before it
            raise StoreError(f"{self.path}: cannot write the claim log: short write")
        self._size += written

    def written(self) -> None:
        """Everything appended so far is in SQLite now: empty the log if it is due."""
        if self._size >= _LIMIT:
            self.reset()
            self.resets += 1

    def reset(self) -> None:
        """Empty the log: only its header stays. Call it only when every record in it is
        in SQLite."""
        try:
            os.ftruncate(self._fd, 0)
            os.write(self._fd, self._header)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot empty the claim log: {exc}") from None
        self._size = len(self._header)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _parse(data: bytes, at: int) -> tuple[list[LoggedClaims], str | None]:
    """The whole records in ``data`` from ``at``, and the damage found after them (or
    ``None``: the records reach the end, or only a torn last record follows them)."""
    records: list[LoggedClaims] = []
    end = len(data)
    while at < end:
        record, extent = _record_at(data, at)
        if record is None:
            last = records[-1].commit_no if records else 0
            tail = data[at:]
            # (Zeros: a power loss kept the file's length, not the bytes last written.)
            if not any(tail) or (extent >= end and _torn(tail, last)):
                return records, None
            return records, (
                f"damaged claim log: byte {at} of {end} does not start a whole record "
                f"(after {len(records)} records), and it is not a torn last record"
            )
        records.append(record)
        at = extent
    return records, None


def _record_at(data: bytes, at: int) -> tuple[LoggedClaims | None, int]:
    """The record at ``at`` (``None`` if there is no whole, intact one) and the offset
    its header says it ends at (``len(data)`` and more when the header is cut short)."""
    if at + _RECORD.size > len(data):
        return None, len(data)
    length, crc = _RECORD.unpack_from(data, at)
    start = at + _RECORD.size
    extent = start + length
    body = data[start:extent]
    if len(body) != length or length < _BODY.size or zlib.crc32(body) != crc:
        return None, extent
    commit_no, leases_issued, texts_len = _BODY.unpack_from(body)
    texts = body[_BODY.size : _BODY.size + texts_len]
    if len(texts) != texts_len:
        return None, extent
    try:
        decoded = texts.decode()
    except UnicodeDecodeError:
        return None, extent
    return LoggedClaims(commit_no, leases_issued, decoded, body[_BODY.size + texts_len :]), extent


def _torn(tail: bytes, last_commit: int) -> bool:
    """Whether ``tail``, the end of the log from a record that is not whole, can be the
    start of a record a broker was writing (commit numbers only go up), cut short or not
    yet on the disk; rather than bytes no broker wrote."""
    if len(tail) < _RECORD.size:
        return True
    length, _ = _RECORD.unpack_from(tail)
    if not _BODY.size <= length <= _TORN_MAX:
        return False
    body = tail[_RECORD.size :]
    if len(body) < _BODY.size or not any(body):
        return True
    commit_no, _, texts_len = _BODY.unpack_from(body)
    return bool(last_commit < commit_no and texts_len <= length - _BODY.size)
