"""The crash-safe spool: a local fragment being written, and its recovery after a crash.

A spool is two files in the journal's spool directory:

- `<begin>.spool` holds the raw journal bytes [begin, end), so a read at offset `o` is one
  `pread` at `o - begin`;
- `<begin>.log` holds checksummed records: a header (journal, begin, codec, registers at
  creation) and, per committed append, its `[begin, end)`, the SHA-1 of its bytes, its wall
  time and, when the append changed them, the journal registers.

An append's bytes are written to the `.spool` file past the committed end as they arrive.
Its commit record is written only once the append commits; acknowledging follows. A crash
(process kill: the page cache survives) therefore leaves every acknowledged append fully
on disk, plus possibly bytes of an unacknowledged one past the last record. Recovery reads
the records, checks each append's bytes against its SHA-1, and cuts both files after the
last append that checks out — so a torn tail (a half-written record, or content lost by a
power failure when `sync` was off) is found and cut, never served. With `sync` on, both
files are fdatasync'ed before an append is acknowledged.

Hashing stays off an append's critical path where it can. An append hashes its own bytes
as it writes them: their SHA-1 goes in the commit record and is the sum the AppendResponse
reports, so the acknowledgement waits for it. The spool's running SHA-1 over all of
[begin, end) — the open fragment's `sum` — is not needed to acknowledge anything: after a
commit a background hasher thread folds the committed bytes in, reading them back from the
page cache, and `fragment()` finishes whatever it has not reached yet, so the sum it reports
(and the name a persisted fragment gets) is always exactly that of [begin, end).

Page faults stay off it too, and so does the page cache's growth. Writing into the page
cache past a file's end allocates fresh pages, and on a VM whose host reclaims free guest
memory each fresh page is a host fault: the benchmark VM writes 1 MiB into new pages at ~400
MB/s against ~6 GB/s into cached ones. So a background prefaulter keeps the content file
allocated (fallocate) and its pages cached (reading the unwritten range faults in clean,
zeroed pages) a little ahead of the committed end; an append then writes into pages that are
already there. It does so only for spools taking large appends (a small one faults in a page
or two), keeps ready a few of them, at most `_PREFAULT_AHEAD` bytes, and pauses while fresh
pages come cheap (zeroing a page it then overwrites costs more than faulting it in on
write). The content file may therefore run past the committed end by that many bytes of
zeros; like a rolled-back append's bytes, they are cut when the spool closes or is
recovered. Behind the committed end of such a spool, the same thread recycles pages: it
starts writing back what was appended (sync_file_range) and drops from the page cache what
lies more than `_RECYCLE_WINDOW` back, so the kernel hands those just-freed pages to the
next appends instead of fresh ones (on the benchmark VM, 1 MiB writes into a new file ran at
~1.5 GB/s this way against ~0.4 GB/s). Tail readers stay within the window; readers catching
up further back read from disk.

In cluster mode a spool is *held back* (`hold_back`): readers see only [begin,
`readable_end`), the content every replica of the route confirmed, and its `readable_fragment`
names that range with its own SHA-1, so a Read or ListFragments response never describes
content past the journal's write head. Each commit past the readable end keeps a copy of its
running SHA-1 state (the replication path hashes every append as it arrives, so the state is
there at commit), and `set_readable` takes the one at the confirmed offset: no content is read
or hashed again, except for a confirmed offset that is no commit boundary (recovery), which is
hashed on from the nearest state before it.

A full disk (ENOSPC, or EDQUOT) fails the append cleanly with `InsufficientStorage`: bytes an
append wrote past the committed end are rolled back (cut, freeing their space), a commit
record the log could not take whole is cut back off the log, so the spool stays exactly its
committed appends and takes the next append as soon as space is free again. A spool whose
header could not be written is removed rather than left for recovery to trip over.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import os
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from pygazette.broker.fragment import spool_files
from pygazette.broker.metrics import record_commit
from pygazette.protocol.fragment_name import sha1sum_from_digest
from pygazette.protocol.pb import protocol_pb2 as pb

_REC_HEAD = struct.Struct("<II")  # payload length, crc32(payload)
_HEADER = struct.Struct("<BQIdH")  # kind 'H', begin, codec, created, journal length
_COMMIT = struct.Struct("<BQQd20sI")  # kind 'C', begin, end, unix time, sha1, registers length
_KIND_HEADER = ord("H")
_KIND_COMMIT = ord("C")
_READ_CHUNK = 1 << 20
_HASH_CHUNK = 1 << 20  # The background hasher holds a spool's hash lock this long at most.
# A commit leaving at most this much unhashed folds it in right away, saving a thread
# hand-off that would cost more than hashing it.
_HASH_INLINE_MAX = 128 * 1024
# Once a spool took an append of at least _PREFAULT_MIN_APPEND bytes, the prefaulter keeps
# _PREFAULT_APPENDS such appends (at most _PREFAULT_AHEAD bytes) past the committed end
# allocated and cached, topping them up _PREFAULT_STEP at a time once a step is used.
_PREFAULT_MIN_APPEND = 256 * 1024
_PREFAULT_APPENDS = 8
_PREFAULT_AHEAD = 16 << 20
_PREFAULT_STEP = 1 << 20
# A step faulting pages in faster than this (a third of what the benchmark VM's host faults
# cost) found cheap memory: the prefaulter then pauses for _PREFAULT_RECHECK bytes of appends.
_PREFAULT_CHEAP_SECONDS_PER_BYTE = 0.8e-3 / (1 << 20)
_PREFAULT_RECHECK = 16 << 20
# A write of a chunk this large that is as slow as a costly fault-in ends a pause at once
# (the host took free memory back meanwhile).
_PREFAULT_MIN_CHUNK = 128 * 1024
# Behind the committed end of such a spool, the prefaulter thread keeps this much in the page
# cache: every _RECYCLE_STEP appended it starts their writeback, and drops what lies further
# back than _RECYCLE_WINDOW, so that new appends write into pages the kernel just freed
# rather than fresh ones (see the module doc).
_RECYCLE_WINDOW = 32 << 20
_READ_AHEAD = 8 << 20  # What a read of dropped content asks the disk to read on ahead.
_RECYCLE_STEP = 8 << 20


class SpoolCorrupt(Exception):
    """A spool cannot be recovered at all (its header record is unreadable)."""


_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class InsufficientStorage(OSError):
    """The spool's file system is full: the append was refused, nothing of it was kept."""

    def __init__(self, directory: Path, journal: str, cause: OSError) -> None:
        super().__init__(
            cause.errno or errno.ENOSPC,
            f"insufficient storage: spool directory {directory} of journal {journal} is full "
            f"({cause.strerror or cause}); nothing was appended, retry once space is freed",
        )


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc` says the file system (or the user's quota) is out of space."""
    return isinstance(exc, OSError) and exc.errno in _DISK_FULL_ERRNOS


def _frame(payload: bytes) -> bytes:
    return _REC_HEAD.pack(len(payload), zlib.crc32(payload)) + payload


@dataclass(slots=True)
class RecoveryReport:
    """What recovery found: committed appends kept and bytes cut from the tail.

    `cut_content_bytes` counts content past the last kept append up to its last non-zero
    byte: the zeros the prefaulter allocated ahead are not content, so they don't count.
    """

    appends: int
    cut_content_bytes: int
    cut_log_bytes: int


class PendingAppend:
    """Bytes of one in-progress append, written past the spool's committed end.

    A chunk is written (`write_at`), folded into the append's SHA-1 (`hash`), then counted
    (`advance`); `write` does all three. The write and the hash may run on different threads
    at once; hashes must take the chunks in append order, writes may land in any order.
    """

    __slots__ = ("_spool", "begin", "length", "sha")

    def __init__(self, spool: Spool) -> None:
        self._spool = spool
        self.begin = spool.end
        self.length = 0
        self.sha = hashlib.sha1()

    def write(self, chunk: bytes | memoryview) -> None:
        """Write, hash and count one chunk (I/O and hashing release the GIL)."""
        self.write_at(chunk, self.length)
        self.hash(chunk)
        self.advance(len(chunk))

    def write_at(self, chunk: bytes | memoryview, at: int) -> None:
        """Write `chunk` at `at` bytes into the append."""
        spool = self._spool
        view = memoryview(chunk)
        pos = self.begin - spool.begin + at
        began = time.perf_counter()
        try:
            while view:
                n = os.pwrite(spool._content_fd, view, pos)
                view = view[n:]
                pos += n
        except OSError as exc:
            if not is_disk_full(exc):
                raise
            spool.cut_uncommitted()  # Give back what this append took of the disk.
            raise InsufficientStorage(spool.directory, spool.journal, exc) from exc
        size = len(chunk)
        if (
            size >= _PREFAULT_MIN_CHUNK
            and time.perf_counter() - began > size * _PREFAULT_CHEAP_SECONDS_PER_BYTE
        ):
            spool._prefault_resume = 0  # Fresh pages got costly: the prefaulter resumes.

    def hash(self, chunk: bytes | memoryview) -> None:
        """Fold the append's next chunk into its SHA-1."""
        self.sha.update(chunk)

    def advance(self, n: int) -> None:
        """Count `n` more bytes, written and hashed."""
        self.length += n


class Spool:
    """One local fragment: committed bytes [begin, end) plus its recovery log."""

    def __init__(
        self,
        directory: Path,
        journal: str,
        begin: int,
        codec: pb.CompressionCodec,
        *,
        sync: bool,
    ) -> None:
        self.directory = directory
        self.journal = journal
        self.begin = begin
        self.end = begin
        self.codec = codec
        self.sync = sync
        self.first_append_time: float | None = None
        self.last_append_time: float | None = None
        self.registers = pb.LabelSet()
        self.begin_registers = pb.LabelSet()  # The journal's registers at `begin`.
        self.closed = False
        self.deleted = False
        # Held back (cluster mode, see `hold_back`): readers see [begin, _readable_end), whose
        # SHA-1 state is _readable_sha and sum _readable_sum; commits past it keep their
        # (end, SHA-1 state) in _marks, oldest first, until confirmed. Not held back: None.
        self._readable_end: int | None = None
        self._readable_sha: hashlib._Hash | None = None
        self._readable_sum: pb.SHA1Sum | None = None
        self._marks: deque[tuple[int, hashlib._Hash]] = deque()
        # The running SHA-1 of [begin, _hashed); _hashed trails end until the background
        # hasher or fragment() catches up. Hashing, and closing the files, hold _sha_lock.
        self._sha = hashlib.sha1()
        self._hashed = begin
        # Set while a worker still folds the last append's chunks into _sha (see commit).
        self._summing: concurrent.futures.Future[None] | None = None
        self._sha_lock = threading.Lock()
        self._content_fd = -1
        self._log_fd = -1
        self._log_size = 0  # Bytes of whole records in the log file.
        # Content bytes [0, _ready) are allocated and were cached by the prefaulter. Its
        # steps, closing the spool and closing its files hold _prefault_lock.
        self._ready = 0
        self._prefault_ahead = 0
        self._prefault_resume = 0  # No prefaulting until the content reaches this size.
        # Content bytes [0, _flushed) were handed to writeback, [0, _dropped) dropped from the
        # page cache by the recycler.
        self._recycling = True
        self._flushed = 0
        self._dropped = 0
        # Readers of the content file by its path (the persister, `open_content_path`), under
        # _path_lock: while there are some, a deletion removes the file rather than keeping
        # it for a next spool, whose content would reach them through their descriptors.
        self._path_readers = 0
        self._path_lock = threading.Lock()
        self._prefaulting = True
        self._prefault_lock = threading.Lock()

    # Paths.
    @property
    def content_path(self) -> Path:
        return self.directory / f"{self.begin:016x}.spool"

    @contextlib.contextmanager
    def open_content_path(self) -> Iterator[Path]:
        """`content_path`, for a reader that opens it by its path (the persister compressing
        or uploading the spool): a file opened inside the block keeps the spool's content,
        even if the spool is deleted meanwhile (its file is then removed, not reused)."""
        with self._path_lock:
            self._path_readers += 1
        try:
            yield self.content_path
        finally:
            with self._path_lock:
                self._path_readers -= 1

    @property
    def log_path(self) -> Path:
        return self.directory / f"{self.begin:016x}.log"

    @classmethod
    def create(
        cls,
        directory: Path,
        journal: str,
        begin: int,
        codec: pb.CompressionCodec,
        registers: pb.LabelSet,
        *,
        sync: bool,
    ) -> Spool:
        """Start a new, empty spool at `begin`."""
        directory.mkdir(parents=True, exist_ok=True)
        spool = cls(directory, journal, begin, codec, sync=sync)
        spool.registers.CopyFrom(registers)
        spool.begin_registers.CopyFrom(registers)
        name = journal.encode()
        regs = registers.SerializeToString()
        payload = (
            _HEADER.pack(_KIND_HEADER, begin, codec, time.time(), len(name))
            + name
            + struct.pack("<I", len(regs))
            + regs
        )
        try:
            # Files of a deleted spool if there are some (`spool_files`), truncated here.
            spool_files.take(directory, spool.content_path)
            spool_files.take(directory, spool.log_path)
            spool._content_fd = _open_content(spool.content_path, os.O_TRUNC)
            spool._log_fd = os.open(
                spool.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644
            )
            _write_all(spool._log_fd, _frame(payload))
            spool._log_size = len(_frame(payload))
            if sync:
                os.fsync(spool._log_fd)
                fsync_dir(directory)
        except OSError as exc:
            spool.delete()  # No spool without a readable header is left behind.
            if is_disk_full(exc):
                raise InsufficientStorage(directory, journal, exc) from exc
            raise
        return spool

    @classmethod
    def recover(
        cls, log_path: Path, *, sync: bool, end_limit: int | None = None
    ) -> tuple[Spool, RecoveryReport]:
        """Reopen a spool after a restart or crash, cutting whatever does not check out.

        With `end_limit`, appends ending past it are cut too (a replica dropping content
        its cluster never confirmed).
        """
        directory = log_path.parent
        with open(log_path, "rb") as f:
            log_data = f.read()
        records, good_len = _parse_records(log_data)
        if not records or records[0][0] != _KIND_HEADER:
            raise SpoolCorrupt(f"spool log {log_path} has no readable header")
        header = records[0]
        _kind, begin, codec, _created, name_len = _HEADER.unpack_from(header, 0)
        off = _HEADER.size
        journal = header[off : off + name_len].decode()
        off += name_len
        (regs_len,) = struct.unpack_from("<I", header, off)
        spool = cls(directory, journal, begin, cast("pb.CompressionCodec", codec), sync=sync)
        spool.registers.ParseFromString(header[off + 4 : off + 4 + regs_len])
        spool.begin_registers.CopyFrom(spool.registers)
        if spool.log_path != log_path:
            raise SpoolCorrupt(f"spool log {log_path} names begin offset {begin:016x}")

        spool._content_fd = _open_content(spool.content_path)
        content_size = os.fstat(spool._content_fd).st_size
        kept_log = len(_frame(header))
        appends = 0
        for payload in records[1:]:
            if payload[0] != _KIND_COMMIT:
                break
            _k, a_begin, a_end, when, digest, regs_len = _COMMIT.unpack_from(payload, 0)
            if a_begin != spool.end or a_end < a_begin or a_end - spool.begin > content_size:
                break
            if end_limit is not None and a_end > end_limit:
                break
            # Check the append against its SHA-1, folding it into a copy of the running
            # sum on the same read; the copy is kept only if the append checks out.
            sha, running = hashlib.sha1(), spool._sha.copy()
            pos = a_begin
            while pos < a_end:
                n = min(_READ_CHUNK, a_end - pos)
                chunk = os.pread(spool._content_fd, n, pos - spool.begin)
                if not chunk:
                    break
                sha.update(chunk)
                running.update(chunk)
                pos += len(chunk)
            if pos != a_end or sha.digest() != digest:
                break  # Content torn (lost before it reached the disk): cut here.
            spool._sha = running
            spool._hashed = a_end
            if regs_len:
                regs = pb.LabelSet()
                regs.ParseFromString(payload[_COMMIT.size : _COMMIT.size + regs_len])
                spool.registers = regs
            spool.end = a_end
            if spool.first_append_time is None:
                spool.first_append_time = when
            spool.last_append_time = when
            kept_log += len(_frame(payload))
            appends += 1

        kept = spool.end - spool.begin
        cut_content = _data_end(spool._content_fd, kept, content_size) - kept
        if content_size != kept:
            os.ftruncate(spool._content_fd, kept)
        cut_log = len(log_data) - kept_log
        if cut_log or good_len != len(log_data):
            os.truncate(log_path, kept_log)
        spool._log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND)
        spool._log_size = kept_log
        if cut_content or cut_log:
            os.fsync(spool._content_fd)
            os.fsync(spool._log_fd)
        return spool, RecoveryReport(appends, cut_content, cut_log)

    # Writing.
    def start_append(self) -> PendingAppend:
        if self.closed:
            raise RuntimeError("spool is closed")
        self._prefault_soon()
        return PendingAppend(self)

    def commit(
        self,
        pending: PendingAppend,
        registers: pb.LabelSet | None,
        running: hashlib._Hash | None = None,
        summing: concurrent.futures.Future[None] | None = None,
    ) -> None:
        """Make `pending` durable and visible. `registers` is set when the append changed them.

        `running`, when the caller already has it, is the SHA-1 of [begin, new end): it
        becomes the running sum and the background hasher has nothing to do. With `summing`,
        a worker is still folding the append's last chunks into `running`: the spool takes
        `running` over and waits for `summing` before it next reads or extends the sum, so
        the acknowledgement need not wait for that hash.
        Blocking (writes and, with sync, fdatasyncs): run it on a worker thread if `sync`.
        """
        assert pending.begin == self.end, "appends commit in order"
        now = time.time()
        regs = registers.SerializeToString() if registers is not None else b""
        record = (
            _COMMIT.pack(
                _KIND_COMMIT,
                pending.begin,
                pending.begin + pending.length,
                now,
                pending.sha.digest(),
                len(regs),
            )
            + regs
        )
        framed = _frame(record)
        try:
            if self.sync:
                os.fdatasync(self._content_fd)
            _write_all(self._log_fd, framed)
            if self.sync:
                os.fdatasync(self._log_fd)
        except OSError as exc:
            # The record may be in the log in part, or whole but not durable: cut it, so
            # that the next commit's record follows the last good one (recovery stops at
            # the first torn record) and this append is not acknowledged.
            os.ftruncate(self._log_fd, self._log_size)
            if not is_disk_full(exc):
                raise
            self.cut_uncommitted()
            raise InsufficientStorage(self.directory, self.journal, exc) from exc
        self._log_size += len(framed)
        if self._readable_end is not None and running is not None and summing is None:
            # Held back: keep the SHA-1 at this commit for when it is confirmed. Before the
            # end moves, so a confirmation of the new end (on the event loop, while this
            # runs on a worker thread with `sync`) always finds it.
            self._marks.append((pending.begin + pending.length, running.copy()))
        self.end = pending.begin + pending.length
        record_commit(pending.length)
        if pending.length >= _PREFAULT_MIN_APPEND:
            self._prefault_ahead = min(
                _PREFAULT_AHEAD, max(self._prefault_ahead, _PREFAULT_APPENDS * pending.length)
            )
        if registers is not None:
            self.registers = registers
        if self.first_append_time is None:
            self.first_append_time = now
        self.last_append_time = now
        self._prefault_soon()
        if running is not None:
            with self._sha_lock:
                self._sha = running if summing is not None else running.copy()
                self._summing = summing
                self._hashed = self.end
            return
        self._fold_in_committed()

    def cut_uncommitted(self) -> None:
        """Cut the content file back to the committed end: a rolled-back append's bytes and
        the prefaulter's zeros go, and with them the disk space they took. Called after a
        write failed for want of space; no other write of the append is in flight."""
        with self._prefault_lock:
            if self._content_fd < 0:
                return
            size = self.end - self.begin
            with contextlib.suppress(OSError):
                os.ftruncate(self._content_fd, size)
                self._ready = min(self._ready, size)
            # Stop prefaulting ahead for a while: it would take back the space just freed.
            self._prefault_resume = size + _PREFAULT_RECHECK

    def _prefault_soon(self) -> None:
        if self._prefault_wanted(self._prefault_ahead - _PREFAULT_STEP) or self._recycle_wanted():
            _PREFAULTER.kick(self)

    def _recycle_wanted(self) -> bool:
        return (
            self._recycling
            and self._prefault_ahead > 0
            and not self.closed
            and self.end - self.begin - self._flushed >= _RECYCLE_STEP
            and self._content_fd >= 0
        )

    def _page_cache_wanted(self) -> bool:
        return self._prefault_wanted() or self._recycle_wanted()

    def _page_cache_some(self, buf: bytearray) -> bool:
        """A step of the prefaulter thread: recycle pages behind the window, then prefault
        ahead. True if more is wanted."""
        with self._prefault_lock:
            if self._recycle_wanted():
                self._recycle()
        return self._prefault_some(buf) or self._recycle_wanted()

    def _recycle(self) -> None:
        """Start writing back what was appended since the last step, and drop from the page
        cache what was written back _RECYCLE_WINDOW ago. Holds _prefault_lock."""
        size = self.end - self.begin
        if not _start_writeback(self._content_fd, self._flushed, size - self._flushed):
            self._recycling = False  # No sync_file_range here: leave the page cache be.
            return
        self._flushed = size
        drop_to = size - _RECYCLE_WINDOW
        if drop_to - self._dropped >= _RECYCLE_STEP:
            # Only clean pages go: any still being written back stay, and are dropped by
            # the kernel in its own time.
            os.posix_fadvise(
                self._content_fd, self._dropped, drop_to - self._dropped, os.POSIX_FADV_DONTNEED
            )
            self._dropped = drop_to

    def _prefault_wanted(self, ahead: int | None = None) -> bool:
        ahead = self._prefault_ahead if ahead is None else ahead
        return (
            self._prefaulting
            and ahead > 0
            and self.end - self.begin >= self._prefault_resume
            and not self.closed
            and self._ready < self.end - self.begin + ahead
            and self._content_fd >= 0
        )

    def _prefault_some(self, buf: bytearray) -> bool:
        """A prefaulter step: allocate and cache up to _PREFAULT_STEP more bytes past the
        committed end. True if more are wanted."""
        with self._prefault_lock:
            if not self._prefault_wanted():
                return False
            size = self.end - self.begin
            start = max(self._ready, size)
            n = min(len(buf), size + self._prefault_ahead - start)
            began = time.perf_counter()
            # Allocating never shrinks the file nor touches written bytes (unlike extending
            # it with ftruncate or zeros, which could race an append's write), and reading
            # the allocated range only brings in pages no write has brought in yet.
            if not _fallocate(self._content_fd, start, n):
                self._prefaulting = False  # The filesystem can't: write into fresh pages.
                return False
            os.preadv(self._content_fd, [memoryview(buf)[:n]], start)
            self._ready = start + n
            if time.perf_counter() - began < n * _PREFAULT_CHEAP_SECONDS_PER_BYTE:
                # Fresh pages come cheap now (memory the kernel just freed, say): writing
                # into them directly costs less than zeroing them here first. Look again
                # once the spool has grown by _PREFAULT_RECHECK, or as soon as an append's
                # write into fresh pages turns out slow (PendingAppend.write_at).
                self._prefault_resume = self._ready + _PREFAULT_RECHECK
                return False
            return self._prefault_wanted()

    def _fold_in_committed(self) -> None:
        """Get the committed bytes into the running sum: now if few, else in the background.

        Never fails the commit: what cannot be hashed now, `fragment()` meets (and reports).
        """
        if self.end - self._hashed <= _HASH_INLINE_MAX and self._sha_lock.acquire(False):
            try:
                self._hash_to(self.end)
            except OSError:
                pass
            finally:
                self._sha_lock.release()
        else:
            _HASHER.kick(self)

    # Reading.
    def read(self, offset: int, length: int) -> bytes:
        """Committed bytes from `offset` (at most `length`, never past the committed end)."""
        if self.deleted:
            raise FileNotFoundError("spool was persisted and removed")
        length = min(length, self.end - offset)
        if length <= 0 or offset < self.begin:
            return b""
        return os.pread(self._content_fd, length, offset - self.begin)

    def read_may_block(self, offset: int) -> bool:
        """Whether reading at `offset` may wait on the disk: the recycler dropped its pages."""
        return offset - self.begin < self._dropped

    def read_blocking(self, offset: int, length: int) -> bytes:
        """`read`, for a worker thread: the spool's files stay open until it returns."""
        with self._prefault_lock:
            if self._content_fd < 0:
                raise FileNotFoundError("spool was persisted and removed")
            data = self.read(offset, length)
            # Readers catch up front to back: have the disk read on ahead meanwhile.
            ahead = offset - self.begin + len(data)
            os.posix_fadvise(self._content_fd, ahead, _READ_AHEAD, os.POSIX_FADV_WILLNEED)
            return data

    # What readers see.
    def hold_back(self, readable: int) -> None:
        """Show readers only what is confirmed from now on: [begin, min(readable, end)),
        and later only what `set_readable` lets them see (cluster mode)."""
        if self._readable_end is not None:
            self.set_readable(readable)
            return
        self._marks.clear()
        if readable >= self.end > self.begin:
            # All of it (no append is in flight while a spool is taken over).
            sha = self.running_sha()
            self._readable_end = self.end
            self._readable_sha = sha
            self._readable_sum = sha1sum_from_digest(sha.digest())
            return
        self._readable_end = self.begin
        self._readable_sha = hashlib.sha1()
        self._readable_sum = pb.SHA1Sum()
        self.set_readable(readable)

    @property
    def readable_end(self) -> int:
        """The end of what readers may see: the committed end, unless held back."""
        return self.end if self._readable_end is None else self._readable_end

    def set_readable(self, offset: int) -> None:
        """Readers may see content up to `offset` (at most the committed end; it never
        moves back). A no-op unless held back."""
        if self._readable_end is None or offset <= self._readable_end:
            return
        marks = self._marks
        end = min(offset, self.end)
        if end <= self._readable_end:
            return
        base_end, base = self._readable_end, self._readable_sha
        while marks and marks[0][0] <= end:
            base_end, base = marks.popleft()
        assert base is not None
        if base_end < end:
            # No commit ends at `end` with a kept state (a recovered spool confirmed part
            # way, or one committed without its running SHA-1): hash on from the state
            # before it.
            base = base.copy()
            self._hash_file(base, base_end, end)
        self._readable_end = end
        self._readable_sha = base
        self._readable_sum = sha1sum_from_digest(base.digest())

    def _hash_file(self, sha: hashlib._Hash, begin: int, end: int) -> None:
        """Fold committed content [begin, end) into `sha`, reading it from the file."""
        with self._sha_lock:
            pos = begin
            while pos < end:
                if self._content_fd < 0:
                    raise FileNotFoundError("spool was persisted and removed")
                data = os.pread(self._content_fd, min(_HASH_CHUNK, end - pos), pos - self.begin)
                if not data:
                    raise OSError(f"spool {self.content_path} ends before its committed end")
                sha.update(data)
                pos += len(data)

    def readable_fragment(self) -> pb.Fragment:
        """The Fragment readers see: `fragment()`, or, held back, [begin, readable_end)
        with the SHA-1 of exactly that content (empty: no sum)."""
        if self._readable_end is None:
            return self.fragment()
        frag = pb.Fragment(
            journal=self.journal,
            begin=self.begin,
            end=self._readable_end,
            compression_codec=self.codec,
        )
        if self._readable_end > self.begin:
            assert self._readable_sum is not None
            frag.sum.CopyFrom(self._readable_sum)
        return frag

    def fragment(self) -> pb.Fragment:
        """The spool as a Fragment: [begin, end), the SHA-1 of its content, its codec.

        Hashes whatever committed bytes the background hasher has not reached yet (usually
        none, or the last append's), so the sum is always that of exactly [begin, end).
        """
        with self._sha_lock:
            end = self.end
            self._hash_to(end)
            if self._hashed != end:
                raise FileNotFoundError("spool was persisted and removed")
            digest = self._sha.digest()
        return pb.Fragment(
            journal=self.journal,
            begin=self.begin,
            end=end,
            sum=sha1sum_from_digest(digest),
            compression_codec=self.codec,
        )

    def _hash_to(self, stop: int, buf: bytearray | None = None) -> None:
        """Fold committed bytes [_hashed, stop) into the running sum. Holds _sha_lock.

        Reads them back from the content file (the page cache), into `buf` if given. First
        waits for a worker still folding in the last append (at most one chunk's hash).
        """
        if self._summing is not None:
            self._summing.result()
            self._summing = None
        while self._hashed < stop and self._content_fd >= 0:
            n = min(_HASH_CHUNK, stop - self._hashed)
            pos = self._hashed - self.begin
            data: bytes | memoryview
            if buf is None:
                data = os.pread(self._content_fd, n, pos)
            else:
                data = memoryview(buf)[: os.preadv(self._content_fd, [memoryview(buf)[:n]], pos)]
            if not data:
                raise OSError(f"spool {self.content_path} ends before its committed end")
            self._sha.update(data)
            self._hashed += len(data)

    def _hash_some(self, buf: bytearray) -> bool:
        """A background hasher step: fold in up to _HASH_CHUNK bytes. True if more remain."""
        with self._sha_lock:
            end = self.end
            self._hash_to(min(end, self._hashed + _HASH_CHUNK), buf)
            return self._hashed < end and self._content_fd >= 0

    def running_sha(self) -> hashlib._Hash:
        """A copy of the SHA-1 of committed [begin, end), for extending it further."""
        with self._sha_lock:
            self._hash_to(self.end)
            return self._sha.copy()

    def detach(self) -> None:
        """Close the spool's files, leaving them on disk (to recover them again)."""
        with self._prefault_lock, self._sha_lock:
            for fd in (self._content_fd, self._log_fd):
                if fd >= 0:
                    os.close(fd)
            self._content_fd = self._log_fd = -1
        self.deleted = True  # This object no longer serves reads.

    @property
    def content_fd(self) -> int:
        return self._content_fd

    def close(self) -> None:
        """Stop accepting appends; the spool is now waiting to be persisted.

        Bytes of a rolled-back append past the committed end are cut, so the content file is
        exactly the fragment.
        """
        with self._prefault_lock:  # No prefaulter step extends the file again after this.
            self.closed = True
            if not self.deleted:
                os.ftruncate(self._content_fd, self.end - self.begin)

    def delete(self) -> None:
        """Remove the spool's files (after it persisted, or when it will never persist): the
        log first, so that no recovery finds it. Small ones are kept for a next spool
        (`spool_files`)."""
        if self.deleted:
            return
        self.deleted = True
        unknown = spool_files.MAX_BYTES + 1
        sizes = [unknown, unknown]
        # Not while the hasher or the prefaulter uses the content file.
        with self._prefault_lock, self._sha_lock:
            for i, fd in enumerate((self._log_fd, self._content_fd)):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        st = os.fstat(fd)
                        sizes[i] = max(st.st_size, st.st_blocks * 512)
                    os.close(fd)
            self._content_fd = self._log_fd = -1
        spool_files.give(self.directory, self.log_path, sizes[0])
        with self._path_lock:  # Not reused while a reader may have it open (or opens it).
            reusable = self._path_readers == 0
            spool_files.give(self.directory, self.content_path, sizes[1] if reusable else unknown)


class _SpoolWorker:
    """A daemon thread doing one kind of background work on spools, in steps.

    `step(spool, buf)` does a bounded piece of the work and says whether more remains;
    `wanted(spool)` says whether a spool that finished its turn got more work meanwhile.
    The steps do I/O and hashing, which release the GIL.
    """

    def __init__(
        self,
        name: str,
        step: Callable[[Spool, bytearray], bool],
        wanted: Callable[[Spool], bool],
        buf_size: int,
    ) -> None:
        self._name = name
        self._step = step
        self._wanted = wanted
        self._buf_size = buf_size
        self._cond = threading.Condition()
        self._queue: deque[Spool] = deque()
        self._thread: threading.Thread | None = None

    def kick(self, spool: Spool) -> None:
        """`spool` has work for this thread: do it soon."""
        with self._cond:
            if spool not in self._queue:
                self._queue.append(spool)
                self._cond.notify()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()

    def _run(self) -> None:
        buf = bytearray(self._buf_size)
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                spool = self._queue[0]
            failed = False
            try:
                while self._step(spool, buf):
                    pass
            except OSError:
                failed = True  # The spool's owner meets (and reports) it.
            with self._cond:
                self._queue.popleft()
                # Work added after the last step found the spool still queued: go again.
                if not failed and self._wanted(spool):
                    self._queue.append(spool)


# Folds committed appends into their spools' running SHA-1, off every append's critical
# path and off the event loop; what it has not reached yet, `Spool.fragment` does.
_HASHER = _SpoolWorker(
    "pygazette-spool-hasher",
    Spool._hash_some,
    lambda spool: spool._hashed < spool.end and spool._content_fd >= 0,
    _HASH_CHUNK,
)
# Keeps page-cache pages ready past each open spool's committed end (see the module doc).
_PREFAULTER = _SpoolWorker(
    "pygazette-spool-prefaulter",
    Spool._page_cache_some,
    Spool._page_cache_wanted,
    _PREFAULT_STEP,
)


def _load_fallocate() -> Callable[[int, int, int, int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name, use_errno=True).fallocate if name else None
    except (OSError, AttributeError):
        return None
    if fn is not None:
        fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        fn.restype = ctypes.c_int
    return cast("Callable[[int, int, int, int], int] | None", fn)


_FALLOCATE = _load_fallocate()
_SYNC_FILE_RANGE_WRITE = 2


def _load_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name, use_errno=True).sync_file_range if name else None
    except (OSError, AttributeError):
        return None
    if fn is not None:
        fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        fn.restype = ctypes.c_int
    return cast("Callable[[int, int, int, int], int] | None", fn)


_SYNC_FILE_RANGE = _load_sync_file_range()


def _start_writeback(fd: int, offset: int, length: int) -> bool:
    """Start writing back [offset, offset+length) of `fd` without waiting for it, or False
    where sync_file_range(2) is missing."""
    if _SYNC_FILE_RANGE is None:
        return False
    if _SYNC_FILE_RANGE(fd, offset, length, _SYNC_FILE_RANGE_WRITE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ESPIPE):
        return False
    raise OSError(err, os.strerror(err))


def _fallocate(fd: int, offset: int, length: int) -> bool:
    """Allocate [offset, offset+length) of `fd`, growing it if shorter (fallocate(2), mode 0).

    False where the filesystem or C library can't. Unlike posix_fallocate(3), this never
    falls back to writing into the file.
    """
    if _FALLOCATE is None:
        return False
    if _FALLOCATE(fd, 0, offset, length) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err))


def _write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to `fd` (an O_APPEND file), looping on short writes."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.EIO, "short write")
        view = view[n:]


def _open_content(path: Path, flags: int = 0) -> int:
    """Open a spool's content file. Reads of it run front to back (readers catching up on
    content the recycler dropped from the page cache): ask for a doubled readahead window,
    which more than doubled cold reads on the benchmark VM (0.8 to 2.2 GB/s)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o644)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    return fd


def _data_end(fd: int, start: int, size: int) -> int:
    """One past the last non-zero byte of `fd` in [start, size), or `start` if none."""
    end = size
    while end > start:
        n = min(_READ_CHUNK, end - start)
        block = os.pread(fd, n, end - n)
        stripped = len(block.rstrip(b"\0"))
        if stripped:
            return end - n + stripped
        end -= n
    return start


def spool_log_journal(log_path: Path) -> str | None:
    """The journal a spool log's header names; None if it has no readable header."""
    try:
        with open(log_path, "rb") as f:
            head = f.read(_REC_HEAD.size)
            if len(head) < _REC_HEAD.size:
                return None
            length, crc = _REC_HEAD.unpack(head)
            payload = f.read(length)  # The header record: journal name and registers.
    except OSError:
        return None
    if len(payload) != length or length < _HEADER.size or zlib.crc32(payload) != crc:
        return None
    kind, _begin, _codec, _created, name_len = _HEADER.unpack_from(payload, 0)
    if kind != _KIND_HEADER:
        return None
    try:
        return payload[_HEADER.size : _HEADER.size + name_len].decode()
    except UnicodeDecodeError:
        return None


def _parse_records(data: bytes) -> tuple[list[bytes], int]:
    """Framed records from the front of `data`, stopping at the first torn or corrupt one."""
    records = []
    pos = 0
    while pos + _REC_HEAD.size <= len(data):
        length, crc = _REC_HEAD.unpack_from(data, pos)
        end = pos + _REC_HEAD.size + length
        if end > len(data) or length == 0:
            break
        payload = data[pos + _REC_HEAD.size : end]
        if zlib.crc32(payload) != crc:
            break
        records.append(payload)
        pos = end
    return records, pos


def fsync_dir(directory: Path) -> None:
    """Make `directory`'s entries (files created, renamed or removed in it) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
