"""The commit marker: what the database's files must hold, kept outside them.

SQLite keeps the commits since the last checkpoint only in the ``-wal`` file. If that
file is deleted, or damaged (SQLite stops reading a WAL at its first bad frame, silently),
the database opens as it was at an older commit, and nothing in the files says so. The
marker, ``<db>-commits``, is how ``load`` finds out: it records the number of the last
commit (``meta.commits``, which every commit writes in its own transaction), and ``load``
compares it with the number the files hold.

Cost: no fsync on the hot path. Each commit overwrites the marker's one record in place
(one ``pwrite`` of ``_RECORD.size`` bytes, a few microseconds), with no fsync: like the
WAL's own write, it survives a killed broker once the call returns. ``baseline``, at each
start once the table is loaded, writes it durably: to a new file, fsynced, then renamed
over the old one, the directory fsynced. The record has a checksum; written in place, it
fits in one disk sector, so it is never torn.

A power loss may leave the marker older than the WAL (nothing is wrong then), or newer
than what the WAL kept of commits that were not fsynced yet (those were never confirmed
with ``--sync full``; with ``--sync normal``, an OS crash may lose them, as promised). So
the record holds two numbers: ``written``, the last commit written, which a killed broker
keeps; and ``durable``, the last commit known to be on the disk (fsynced: at a
checkpoint, or by ``load``), which an OS crash keeps too; and the boot it was written in
(Linux's ``boot_id``). ``load`` expects ``written`` after a restart of the broker, and
only ``durable`` after a restart of the machine.

A database with no marker beside it (made before markers, or the marker deleted) is taken
as it is, and given one.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import NamedTuple

from ._base import StoreError

__all__ = ["CommitMarker", "Marked", "boot_id"]

_MAGIC = b"convcmt1"
# magic, last commit written, last commit on the disk, boot id, crc32 of what precedes it
_BODY = struct.Struct("<8sqq16s")
_RECORD = struct.Struct(f"<{_BODY.size}sI")
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> bytes:
    """This boot of the machine (16 bytes), or zeros where the system does not say: then
    every restart counts as the broker's alone (the stricter reading)."""
    try:
        return bytes.fromhex(_BOOT_ID.read_text().strip().replace("-", ""))[:16].ljust(16, b"\0")
    except (OSError, ValueError):
        return bytes(16)


class Marked(NamedTuple):
    """What a marker recorded."""

    written: int  # the last commit written (a killed broker keeps it)
    durable: int  # the last commit fsynced (an OS crash keeps it too)
    boot: bytes  # the boot of the machine it was written in

    def expected(self, boot: bytes) -> int:
        """The commit the files must hold at least, when started in ``boot``."""
        return self.written if boot == self.boot else self.durable


class CommitMarker:
    """The marker of one database. ``read`` at start, ``baseline`` once loaded, ``mark``
    after each commit, ``close`` at the end. Raises ``StoreError`` naming the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.boot = boot_id()
        self._fd = -1
        self._durable = 0

    def read(self) -> Marked | None:
        """What the marker holds; ``None`` when there is none. Raises ``StoreError`` for
        a file that is not a whole marker (it is never torn: see the module docstring)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot read the commit marker: {exc}") from None
        if len(data) != _RECORD.size:
            raise StoreError(f"{self.path}: damaged commit marker: {len(data)} bytes")
        body, crc = _RECORD.unpack(data)
        magic, written, durable, boot = _BODY.unpack(body)
        if magic != _MAGIC or zlib.crc32(body) != crc:
            raise StoreError(f"{self.path}: damaged commit marker: not a Conveyor commit marker")
        return Marked(written, durable, boot)

    def baseline(self, commit_no: int, durable: int) -> None:
        """Replace the marker, durably (written, fsynced, renamed into place), with one
        that records ``commit_no`` written and ``durable`` on the disk; then keep it open
        for ``mark``."""
        self.close()
        new = self.path.with_name(self.path.name + ".new")
        try:
            fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            try:
                os.write(fd, self._record(commit_no, durable))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(new, self.path)
            directory = os.open(self.path.parent, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot write the commit marker: {exc}") from None
        self._durable = durable

    def mark(self, commit_no: int, durable: int | None = None) -> None:
        """Record that commit ``commit_no`` is written (and, if given, that commit
        ``durable`` is on the disk): one ``pwrite``, no fsync. Call after the commit."""
        if durable is not None:
            self._durable = durable
        try:
            os.pwrite(self._fd, self._record(commit_no, self._durable), 0)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot write the commit marker: {exc}") from None

    def _record(self, written: int, durable: int) -> bytes:
        body = _BODY.pack(_MAGIC, written, durable, self.boot)
        return _RECORD.pack(body, zlib.crc32(body))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
