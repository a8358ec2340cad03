"""The confirmed frontiers of every journal a broker holds spools of, in one file per broker.

Each replica of a journal keeps a confirmed frontier (`replicated_spool`): the offset below
which every member of the journal's route holds it. It must survive a restart, and it moves
with every acknowledged append. Kept in a file per journal, it cost each journal's first
append a new inode, and each confirmation an open, a write and a close. On the benchmark
VM's file system (ext4 without a journal, where allocating an inode scans recently deleted
ones) a new file took 0.3-0.5 ms of CPU, a third of a broker's share of a first append.

Here every frontier is a record appended to one file beside the broker's spools, through a
descriptor held open: a confirmation costs one `write`. A record is

    crc32 (u32) | offset (u64) | name length (u16) | journal name (UTF-8)

little-endian (an offset of 2^64-1 is a tombstone: the journal's frontier is forgotten),
written with one `write` (it lands whole in the page cache: a process that
dies leaves no half record; a torn record, after a power loss, fails its CRC and it and
everything after it are dropped, so a frontier may come back older, never newer). The file
is rewritten with one record a journal (compacted) when it is loaded and once it holds
COMPACT_RATIO times more records than journals: written to a temporary file, synced, and
renamed over it. Records are not synced as they are written, except with `sync` (a broker
run with `--sync`; its replicas set it): then each record is synced (fdatasync) before `set`
or `forget` returns, and the file's creation and each compaction sync its directory, so a
frontier survives a power loss as the spools' acknowledged appends do. A primary records a
confirmation before it acknowledges the appends it covers: without the sync, a power loss of
every member could bring all of them back with older frontiers, and each would then cut
acknowledged content as unconfirmed.

A frontier a per-journal `confirmed` file left (written by earlier versions) is read by
`legacy_frontier` and folded in by its caller.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading
import weakref
import zlib
from pathlib import Path
from typing import ClassVar

from pygazette.broker.fragment.spool import fsync_dir

log = logging.getLogger(__name__)

# Beside the journals' spool directories, under a name none of them has: "#" is in no journal
# name, and `replica.spool_directory` would quote it (".frontiers" is a valid journal name).
FILE_NAME = ".#frontiers"
LEGACY_FILE = "confirmed"  # A journal's own frontier file, in its spool directory.
COMPACT_RATIO = 4
COMPACT_MIN_RECORDS = 4096
MAX_NAME_BYTES = 0xFFFF

_HEAD = struct.Struct("<IQH")  # crc32 of the rest, offset, name length
_U64 = struct.Struct("<Q")
TOMBSTONE = (1 << 64) - 1


def _record(journal: str, offset: int) -> bytes:
    name = journal.encode()
    if len(name) > MAX_NAME_BYTES:
        raise ValueError(f"journal name of {len(name)} bytes is too long for a frontier record")
    body = _U64.pack(offset) + struct.pack("<H", len(name)) + name
    return struct.pack("<I", zlib.crc32(body)) + body


def parse_records(data: bytes) -> tuple[dict[str, int], int, int]:
    """The frontiers in `data` (for each journal, the greatest offset recorded since its last
    tombstone), the number of whole records, and the length of the valid prefix (a torn or
    corrupt record ends it)."""
    frontiers: dict[str, int] = {}
    pos = count = 0
    while pos + _HEAD.size <= len(data):
        crc, offset, length = _HEAD.unpack_from(data, pos)
        end = pos + _HEAD.size + length
        if end > len(data) or zlib.crc32(data[pos + 4 : end]) != crc:
            break
        try:
            name = data[pos + _HEAD.size : end].decode()
        except UnicodeDecodeError:
            break
        if offset == TOMBSTONE:
            frontiers.pop(name, None)
        elif offset > frontiers.get(name, -1):
            frontiers[name] = offset
        pos, count = end, count + 1
    return frontiers, count, pos


def legacy_frontier(spool_dir: Path) -> int | None:
    """The frontier in a journal's own `confirmed` file, if an earlier version wrote one."""
    path = spool_dir / LEGACY_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(data) != _U64.size:
        log.warning("ignoring a malformed confirmed-offset file", extra={"path": str(path)})
        return None
    return int(_U64.unpack(data)[0])


class FrontierLog:
    """The frontiers of one spool root. One instance per root in a process (`at`), shared by
    its journals' replicas (and closed once none holds it); safe to use from several
    threads."""

    _open: ClassVar[weakref.WeakValueDictionary[Path, FrontierLog]] = weakref.WeakValueDictionary()
    _open_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def at(cls, spool_root: Path) -> FrontierLog:
        key = Path(os.path.abspath(spool_root))
        with cls._open_lock:
            got = cls._open.get(key)
            if got is None:
                got = cls._open[key] = FrontierLog(key / FILE_NAME)
            return got

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fd = -1
        self._records = 0
        self._frontiers: dict[str, int] = {}
        self.sync = False  # See the module docstring.
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            data = b""
        self._frontiers, count, valid = parse_records(data)
        if valid < len(data):
            log.warning(
                "dropping a torn tail of the frontier log",
                extra={"path": str(path), "bytes": len(data) - valid},
            )
        if data and (valid < len(data) or count > len(self._frontiers)):
            self._compact()

    def get(self, journal: str) -> int | None:
        with self._lock:
            return self._frontiers.get(journal)

    def set(self, journal: str, offset: int) -> None:
        """Record `journal`'s frontier (callers move it only forward)."""
        if not 0 <= offset < TOMBSTONE:
            raise ValueError(f"frontier offset {offset} out of range")
        with self._lock:
            self._frontiers[journal] = offset
            self._append(_record(journal, offset))

    def forget(self, journal: str) -> None:
        """Drop `journal`'s frontier (its spools are gone: a deleted journal's, or an orphan's
        moved aside), so that a journal of the same name starts without one."""
        with self._lock:
            if self._frontiers.pop(journal, None) is not None:
                self._append(_record(journal, TOMBSTONE))

    def _append(self, rec: bytes) -> None:
        if self._fd < 0:
            self._open_for_append()
        written = os.write(self._fd, rec)
        if written != len(rec):
            # A full disk took part of it. Left there, it would end the valid prefix at the
            # next load and drop every later record with it: a journal whose records all
            # follow would come back with no frontier, its spool end trusted as confirmed.
            os.ftruncate(self._fd, os.fstat(self._fd).st_size - written)
            raise OSError(errno.ENOSPC, f"short write to the frontier log {self.path}")
        if self.sync:
            os.fdatasync(self._fd)
        self._records += 1
        if self._records >= max(COMPACT_MIN_RECORDS, COMPACT_RATIO * len(self._frontiers)):
            self._compact()

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __del__(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)

    def _open_for_append(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if self.sync:
            fsync_dir(self.path.parent)  # It may have just been created.

    def _compact(self) -> None:
        """Rewrite the file with one record a journal (holding `_lock`, or before use)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        data = b"".join(_record(name, off) for name, off in self._frontiers.items())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)  # Synced before it replaces the old one: a rename can't lose both.
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        if self.sync:
            fsync_dir(self.path.parent)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._records = len(self._frontiers)
