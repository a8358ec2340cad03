"""`SQLiteStore`: a shard's state in an embedded SQLite database — the default store.

The application runs its SQL through `store.db`, an `apsw.Connection` inside the current
consumer transaction (a SQL transaction is begun lazily, at first use in a transaction):

    def new_store(self, shard, recorder):
        return SQLiteStore(recorder, bootstrap_sql="CREATE TABLE IF NOT EXISTS counts("
                           "key TEXT PRIMARY KEY, n INTEGER NOT NULL)")

    def consume_message(self, shard, store, envelope, publisher):
        store.db.execute(
            "INSERT INTO counts VALUES (?, 1) ON CONFLICT(key) DO UPDATE SET n = n + 1",
            (envelope.message["key"],))

`start_commit` writes the checkpoint into the `gazette_checkpoint` table (as Gazette's
store-sqlite: one row, the marshaled Checkpoint) within the same SQL transaction, COMMITs
it locally at once — so the next transaction may run while this one commits — and then, in
call order and once every `wait_for` has resolved, makes that local commit durable:

- With a recovery log `Recorder`: every write SQLite makes to the main database file goes
  through a VFS (`apsw.VFS`) that captures it. The writes of the commits since the last
  one (rewrites of a page within them collapsed to its last content; adjacent pages
  coalesced) are recorded as `record_write`s of the database file's fnode and appended as
  ONE recorder commit (atomic in the log, fenced by the recorder's author). The log thus
  holds whole transactions only, and a Player replaying it into a fresh directory
  rebuilds a database file byte-for-byte equal to the local one as of that commit. Only
  the main database file is recorded: the rollback journal (journal_mode=TRUNCATE) is
  local and never needed by a replay, as the log never holds a partial transaction. As
  the local directory is rebuilt from the log by the next primary, local syncs are off.
- Without a recorder (`directory=`), it is a plain local SQLite database (synchronous=FULL).

A commit is all or nothing, also locally. The VFS keeps, for each locally committed but not
yet durable transaction, the prior content of every byte range it changed (an undo image);
without a recorder these are written and fsync'd to an undo file `<db>-undo-<n>` before
SQLite's commit point, and removed (durably) only once the commit is durable. A commit that
fails (a failed `wait_for`, a fenced or failed recorder) makes the store fail every later
commit, until `restore_checkpoint` rolls the database back to its last durable commit by
applying the undo images (newest first), and returns that commit's checkpoint; a store that
opens a database with undo files left by a crash rolls them back first (after SQLite's own
hot journal, outside the VFS). So neither a failure nor a crash ever leaves a checkpoint
whose outputs weren't durable. Locally, `secure_delete` is on (set after `bootstrap_sql`):
SQLite doesn't journal a free page it reuses, so a page must be written (zeroed) by the
commit that frees it, for that commit's undo images to hold its live content.

Truncation: the recorder has no truncate op, so with a recorder the database file never
shrinks: the VFS ignores SQLite's truncations of it (VACUUM, auto-vacuum, a rollback of a
transaction that grew the file). SQLite keeps the database size in its header and ignores
bytes past it, so this is safe; freed space is simply not returned to the file system. Undo
of a failed commit does restore the file's prior size (the log never held the growth).

Statements that can't run in a transaction (VACUUM, some PRAGMAs) go through
`store.connection` (no BEGIN); their changes become durable with the next commit.

One connection, one database file: ATTACH of other database files is refused (they would
not be recorded). WAL mode is not supported (journal_mode is TRUNCATE).

Compaction (bounded recovery): a player replays every recorded write of the database file
since the file was created, so, left alone, the recovery time of a shard would grow with its
age. Instead, once the log holds more than `compact_ratio` times the file's size of writes
since the file was last written whole (and at least `compact_min_bytes` of them), the store
records the database anew, as a new file `<filename>.compacted` renamed over the old one
(which deletes the old file's fnode). The copy rides along with commits, at most
`compact_chunk_bytes` per commit, each piece read from the local file as of its commit: the
commit that starts it records the new file's creation and the first piece; each later one its
next piece, and its own page writes both to the database file and, where they fall in pieces
already copied, to the new file; the commit that copies the last piece records the rename
(and its page writes only to the new file), so that the new file, as renamed, is the database
as of that commit. Hints built after it name only the new fnode, so a player from hints reads
at most about (1 + `compact_ratio`) times the file's size, plus the writes made during the
copy; `shards prune` removes every fragment before it. A copy that a failed commit cut
short leaves its new file in the log, until the store removes it (with its next commit) and a
new copy starts over. The local file itself is untouched. `compactions` (copies started) and
`history_bytes` report what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import struct
import zlib
from collections.abc import Awaitable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import apsw

from pygazette.consumer.memory_store import CommitPipeline, EarlierCommitFailed, copy_checkpoint
from pygazette.consumer.recoverylog import RecorderFenced
from pygazette.consumer.store import CommitFuture, Store, StoreFenced
from pygazette.protocol.pb import consumer_pb2 as cpb

if TYPE_CHECKING:
    from pygazette.consumer.recoverylog.recorder import Recorder
    from pygazette.consumer.shard_api import Shard

__all__ = ["SQLiteStore"]

DEFAULT_FILENAME = "store.sqlite"
# Recorded writes of adjacent pages are coalesced up to this many bytes.
MAX_RECORDED_WRITE = 1 << 20
# Compaction defaults (see the module docstring).
DEFAULT_COMPACT_RATIO = 1.0
DEFAULT_COMPACT_MIN_BYTES = 4 << 20
DEFAULT_COMPACT_CHUNK_BYTES = 4 << 20
# Where a compaction's new file is recorded before it is renamed over the database.
_COMPACT_SUFFIX = ".compacted"

_CHECKPOINT_DDL = """
CREATE TABLE IF NOT EXISTS gazette_checkpoint (
    rowid INTEGER PRIMARY KEY DEFAULT 0 CHECK (rowid = 0), -- Permit just one row.
    checkpoint BLOB
);
INSERT OR IGNORE INTO gazette_checkpoint(rowid, checkpoint) VALUES (0, x'');
"""

_UNDO_MAGIC = b"PGZUNDO1"
_UNDO_HEADER = struct.Struct("<8sQ")  # magic, size of the file before the batch.
_UNDO_ENTRY = struct.Struct("<QII")  # offset, length, crc32 of (offset, length, data).

_vfs_ids = itertools.count()


class _Batch:
    """The writes to the database file between two commit points (one `start_commit`),
    with the undo images to roll them back and (with a recorder) the content to record."""

    def __init__(self, seq: int, start_size: int, record: bool) -> None:
        self.seq = seq
        self.start_size = start_size
        self.undo: list[tuple[int, bytes]] = []
        self.undo_keys: set[tuple[int, int]] = set()
        self.persisted = 0  # Undo entries written to the undo file so far.
        self.undo_file: Path | None = None
        # offset -> content; the order is that of each offset's last write.
        self.redo: dict[int, bytes] | None = {} if record else None
        # With a compaction in progress (see the module docstring): whether this batch
        # creates the new file, the piece of the database (as of its commit) it copies there
        # and where, the offset below which its writes also go to the new file, and whether
        # it completes the copy (renaming the new file over the database).
        self.copy_create = False
        self.chunk: bytes | None = None
        self.chunk_offset = 0
        self.copy_below = 0
        self.copy_done = False

    def redo_bytes(self) -> int:
        return sum(len(data) for data in self.redo.values()) if self.redo else 0

    def capture_undo(self, offset: int, old: bytes, length: int) -> None:
        key = (offset, length)
        if key not in self.undo_keys:
            self.undo_keys.add(key)
            self.undo.append((offset, old))

    def recorded_writes(self) -> Iterator[tuple[int, bytes]]:
        """The writes to record, in an order whose replay gives the final content."""
        assert self.redo is not None
        entries = sorted(self.redo.items())
        if any(a[0] + len(a[1]) > b[0] for a, b in itertools.pairwise(entries)):
            yield from self.redo.items()  # Overlapping writes: replay in write order.
            return
        run_offset, run = -1, bytearray()
        for offset, data in entries:
            if (
                run
                and offset == run_offset + len(run)
                and len(run) + len(data) <= (MAX_RECORDED_WRITE)
            ):
                run += data
                continue
            if run:
                yield run_offset, bytes(run)
            run_offset, run = offset, bytearray(data)
        if run:
            yield run_offset, bytes(run)


class _Tracker:
    """What the VFS file of the database reports to: the batch being written."""

    def __init__(self, db_path: str, record: bool) -> None:
        self.db_path = db_path
        self.record = record
        self.batch: _Batch | None = None
        self.durable_undo = not record  # Persist undo images at each sync.
        self.directory = os.path.dirname(db_path)


class _DBFile(apsw.VFSFile):  # type: ignore[misc]
    """The database file: captures undo images (and recorded content) of each write."""

    def __init__(self, tracker: _Tracker, name: Any, flags: list[int]) -> None:
        super().__init__("", name, flags)
        self._tracker = tracker

    def _capture(self, offset: int, length: int) -> None:
        batch = self._tracker.batch
        assert batch is not None
        if (offset, length) in batch.undo_keys:
            return
        size = int(super().xFileSize())
        avail = max(0, min(length, size - offset))
        old = bytes(super().xRead(avail, offset)) if avail else b""
        batch.capture_undo(offset, old, length)

    def xWrite(self, data: Any, offset: int) -> None:
        view = memoryview(data)
        length = view.nbytes
        self._capture(offset, length)
        super().xWrite(data, offset)
        batch = self._tracker.batch
        assert batch is not None
        if batch.redo is not None:
            batch.redo.pop(offset, None)
            batch.redo[offset] = view.tobytes()

    def xTruncate(self, newsize: int) -> None:
        if self._tracker.record:
            return  # The recorded file never shrinks (see the module docstring).
        size = int(super().xFileSize())
        if newsize < size:
            self._capture(newsize, size - newsize)
        super().xTruncate(newsize)

    def xSync(self, flags: int) -> None:
        batch = self._tracker.batch
        if self._tracker.durable_undo and batch is not None:
            _persist_undo(batch, self._tracker.db_path)
        super().xSync(flags)


class _VFS(apsw.VFS):  # type: ignore[misc]
    """Opens the store's database file as a `_DBFile`; everything else as the default VFS."""

    def __init__(self, name: str, tracker: _Tracker) -> None:
        self.vfs_name = name
        self._tracker = tracker
        super().__init__(name, "")

    def xOpen(self, name: Any, flags: list[int]) -> apsw.VFSFile:
        if flags[0] & apsw.SQLITE_OPEN_MAIN_DB:
            path = name.filename() if isinstance(name, apsw.URIFilename) else name
            if path is None or os.path.realpath(path) != self._tracker.db_path:
                raise apsw.CantOpenError(
                    f"SQLiteStore records only its own database file, not {path!r} "
                    "(ATTACH is not supported)"
                )
            return _DBFile(self._tracker, name, flags)
        return apsw.VFSFile("", name, flags)


# Undo files ------------------------------------------------------------------------------


def _undo_path(db_path: str, seq: int) -> Path:
    return Path(f"{db_path}-undo-{seq:020d}")


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _persist_undo(batch: _Batch, db_path: str) -> None:
    """Append the batch's undo entries not yet in its undo file, and fsync it."""
    if batch.persisted == len(batch.undo):
        return
    created = batch.undo_file is None
    if batch.undo_file is None:
        batch.undo_file = _undo_path(db_path, batch.seq)
    with open(batch.undo_file, "ab") as f:
        if created:
            f.write(_UNDO_HEADER.pack(_UNDO_MAGIC, batch.start_size))
        for offset, old in batch.undo[batch.persisted :]:
            crc = zlib.crc32(old, zlib.crc32(struct.pack("<QI", offset, len(old))))
            f.write(_UNDO_ENTRY.pack(offset, len(old), crc))
            f.write(old)
        f.flush()
        os.fsync(f.fileno())
    batch.persisted = len(batch.undo)
    if created:
        _fsync_dir(os.path.dirname(db_path))


def _read_undo_file(path: Path) -> tuple[int, list[tuple[int, bytes]]] | None:
    """(start size, entries) of an undo file; entries stop at a torn or corrupt one."""
    raw = path.read_bytes()
    if len(raw) < _UNDO_HEADER.size:
        return None
    magic, start_size = _UNDO_HEADER.unpack_from(raw, 0)
    if magic != _UNDO_MAGIC:
        return None
    entries: list[tuple[int, bytes]] = []
    pos = _UNDO_HEADER.size
    while pos + _UNDO_ENTRY.size <= len(raw):
        offset, length, crc = _UNDO_ENTRY.unpack_from(raw, pos)
        pos += _UNDO_ENTRY.size
        old = raw[pos : pos + length]
        if len(old) != length:
            break
        if zlib.crc32(old, zlib.crc32(struct.pack("<QI", offset, length))) != crc:
            break
        entries.append((offset, old))
        pos += length
    return start_size, entries


def _apply_undo(db_path: str, start_size: int, entries: list[tuple[int, bytes]]) -> None:
    fd = os.open(db_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        for offset, old in reversed(entries):
            if old:
                os.pwrite(fd, old, offset)
        os.ftruncate(fd, start_size)
        os.fsync(fd)
    finally:
        os.close(fd)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _undo_files(db_path: str) -> list[Path]:
    """Undo files left next to the database, oldest first."""
    directory, base = os.path.split(db_path)
    prefix = base + "-undo-"
    names = sorted(n for n in os.listdir(directory or ".") if n.startswith(prefix))
    return [Path(directory) / n for n in names]


def recover_undo_files(db_path: str | os.PathLike[str]) -> int:
    """Roll back local commits that never became durable (a crash left their undo files):
    first SQLite's own hot journal (left by a crash mid-commit, undo files or not), then each
    undo file, newest first. Returns how many undo files were applied."""
    path = os.path.realpath(db_path)
    files = _undo_files(path)
    if os.path.exists(path) and (files or _size(path + "-journal")):
        # Let SQLite roll back a transaction interrupted mid-commit (a hot journal) first,
        # and not through the store's VFS: there, the rollback's writes would be taken for
        # the store's first batch, and their undo images (the torn pages) persisted at its
        # sync, for a later open (or a failed first commit) to put back.
        conn = apsw.Connection(path)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
        finally:
            conn.close()
    if not files:
        return 0
    for undo in reversed(files):
        parsed = _read_undo_file(undo)
        if parsed is not None:
            _apply_undo(path, *parsed)
        undo.unlink()
    _fsync_dir(os.path.dirname(path))
    return len(files)


# The store -------------------------------------------------------------------------------


class SQLiteStore(Store):
    """A store in an embedded SQLite database (see the module docstring).

    `recorder`: the shard's recovery-log Recorder; the database lives in `recorder.root`.
    `directory`: without a recorder, the local directory of the database.
    `filename`: the database file's name (relative to the directory).
    `bootstrap_sql`: run at every open of the database, before the checkpoint table is
    created: PRAGMAs, `CREATE TABLE IF NOT EXISTS` and the like (run outside a transaction).
    `compact_ratio`, `compact_min_bytes`, `compact_chunk_bytes`: with a recorder, record the
    database file anew, at most `compact_chunk_bytes` per commit, once the log holds more
    than `compact_ratio` times its size of writes since it was last recorded whole, and at
    least `compact_min_bytes` (see the module docstring); `compact_ratio=None` never compacts.
    """

    def __init__(
        self,
        recorder: Recorder | None = None,
        *,
        directory: str | os.PathLike[str] | None = None,
        filename: str = DEFAULT_FILENAME,
        bootstrap_sql: str = "",
        compact_ratio: float | None = DEFAULT_COMPACT_RATIO,
        compact_min_bytes: int = DEFAULT_COMPACT_MIN_BYTES,
        compact_chunk_bytes: int = DEFAULT_COMPACT_CHUNK_BYTES,
    ) -> None:
        if compact_ratio is not None and not compact_ratio > 0:
            raise ValueError(f"SQLiteStore: compact_ratio must be > 0, not {compact_ratio}")
        if compact_min_bytes < 0:
            raise ValueError(
                f"SQLiteStore: compact_min_bytes must be >= 0, not {compact_min_bytes}"
            )
        if compact_chunk_bytes <= 0:
            raise ValueError(
                f"SQLiteStore: compact_chunk_bytes must be > 0, not {compact_chunk_bytes}"
            )
        if recorder is not None:
            if directory is not None and Path(directory) != Path(recorder.root):
                raise ValueError("SQLiteStore: `directory` must be the recorder's root")
            root = Path(recorder.root)
        elif directory is not None:
            root = Path(directory)
            root.mkdir(parents=True, exist_ok=True)
        else:
            raise ValueError("SQLiteStore needs a recorder or a directory")
        if os.path.isabs(filename) or os.path.normpath(filename).startswith(".."):
            raise ValueError(f"SQLiteStore: filename {filename!r} must be relative")
        self.recorder = recorder
        self.filename = filename
        self.path = Path(os.path.realpath(root / filename))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.bootstrap_sql = bootstrap_sql
        self.compact_ratio = compact_ratio
        self.compact_min_bytes = compact_min_bytes
        self.compact_chunk_bytes = compact_chunk_bytes
        # Bytes of recorded writes of the database file since it was last recorded whole
        # (its creation or compaction), including that whole file: about what a player from
        # fresh hints reads. Counted as commits are started.
        self.history_bytes = 0
        self.compactions = 0  # Compactions started by this store.
        self._copy_offset: int | None = None  # Next offset to copy, while compacting.
        self._temp_fnode: int | None = None  # The new file of a compaction, once recorded.
        self._tracker = _Tracker(str(self.path), record=recorder is not None)
        self._vfs = _VFS(f"pygazette-sqlite-{os.getpid()}-{next(_vfs_ids)}", self._tracker)
        self._pipeline = CommitPipeline()
        self._pending: list[_Batch] = []  # Committed locally, not yet durable; oldest first.
        self._seq = 0
        self._fnode: int | None = None
        self._conn: apsw.Connection | None = None
        self._destroyed = False
        try:
            self._open()
        except BaseException:
            self._vfs.unregister()
            raise

    # The application's side ----------------------------------------------------------------

    @property
    def db(self) -> apsw.Connection:
        """The connection, within the current consumer transaction's SQL transaction
        (begun now if it isn't yet)."""
        return self.transaction()

    @property
    def connection(self) -> apsw.Connection:
        """The connection as it is, without beginning a transaction: for statements that
        can't run in one (VACUUM, some PRAGMAs). Their changes become durable with the next
        commit (and are rolled back with it, should it fail)."""
        return self._usable()

    def transaction(self) -> apsw.Connection:
        """The connection, within the current consumer transaction's SQL transaction
        (begun now if it isn't yet)."""
        conn = self._usable()
        failure = self._pipeline.failure
        if isinstance(failure, StoreFenced):
            raise StoreFenced(str(failure)) from failure
        if failure is not None:
            raise EarlierCommitFailed(
                "SQLiteStore: a commit failed; restore_checkpoint() rolls back to the last "
                f"durable commit ({failure!r})"
            ) from failure
        if not conn.in_transaction:
            conn.execute("BEGIN")
        return conn

    # Store ---------------------------------------------------------------------------------

    async def restore_checkpoint(self, shard: Shard) -> cpb.Checkpoint:
        conn = self._usable()
        await self._pipeline.drain()
        if self._pipeline.failure is not None or self._pending:
            self._rollback_to_durable()
            conn = self._usable()
        elif conn.in_transaction:
            conn.execute("ROLLBACK")  # An abandoned transaction: nothing of it commits.
        self._pipeline.reset()
        return read_checkpoint(conn)

    def start_commit(
        self, shard: Shard, checkpoint: cpb.Checkpoint, wait_for: Sequence[Awaitable[object]]
    ) -> CommitFuture:
        conn = self._usable()
        if self._pipeline.failure is not None:
            return self._pipeline.failed_commit()
        cp = copy_checkpoint(checkpoint)
        try:
            if not conn.in_transaction:
                conn.execute("BEGIN")
            conn.execute("UPDATE gazette_checkpoint SET checkpoint = ?", (cp.SerializeToString(),))
            conn.execute("COMMIT")
        except Exception as exc:
            if conn.in_transaction:
                with contextlib.suppress(Exception):
                    conn.execute("ROLLBACK")
            error = exc

            async def fail() -> None:
                raise error

            return self._pipeline.start(wait_for, fail)
        batch = self._cut()
        self._maybe_compact(batch)

        async def apply() -> None:
            await self._make_durable(batch)

        return self._pipeline.start(wait_for, apply)

    def destroy(self) -> None:
        """Close the database. Files are left in place (a shard's local directory is removed
        by its replica); without a recorder, undo files of commits that weren't durable yet
        stay too, and the next open rolls those commits back."""
        if self._destroyed:
            return
        self._destroyed = True
        self._pipeline.cancel()
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close(force=True)
            self._conn = None
        self._vfs.unregister()

    # Internals -----------------------------------------------------------------------------

    def _usable(self) -> apsw.Connection:
        if self._destroyed or self._conn is None:
            raise RuntimeError("SQLiteStore was destroyed")
        return self._conn

    def _file_size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def _new_batch(self) -> _Batch:
        self._seq += 1
        batch = _Batch(self._seq, self._file_size(), record=self.recorder is not None)
        self._tracker.batch = batch
        return batch

    def _cut(self) -> _Batch:
        """End the current batch at a local commit; later writes go to a new one."""
        batch = self._tracker.batch
        assert batch is not None
        self._pending.append(batch)
        self._new_batch()
        return batch

    def _maybe_compact(self, batch: _Batch) -> None:
        """Count `batch`'s recorded bytes; past the threshold, or while compacting, have it
        copy the next piece of the database file, as of its commit, to the new file."""
        if self.recorder is None:
            return
        self.history_bytes += batch.redo_bytes()
        size = self._file_size()
        offset = self._copy_offset
        if offset is None:
            if self.compact_ratio is None:
                return
            threshold = max(self.compact_min_bytes, (1 + self.compact_ratio) * size)
            if self.history_bytes <= threshold:
                return
            offset = 0
            self.compactions += 1
            batch.copy_create = True
        with open(self.path, "rb") as f:
            f.seek(offset)
            batch.chunk = f.read(min(self.compact_chunk_bytes, max(0, size - offset)))
        batch.chunk_offset = batch.copy_below = offset
        self._copy_offset = offset + len(batch.chunk)
        if self._copy_offset >= size:
            batch.copy_done = True
            self._copy_offset = None
            self.history_bytes = size

    def _open(self) -> None:
        if self.recorder is None:
            recover_undo_files(self.path)
        batch = self._new_batch()
        self._copy_offset = self._temp_fnode = None
        if self.recorder is not None:
            temp = self.filename + _COMPACT_SUFFIX
            if self.recorder.fnode_of(temp) is not None and self.recorder.failed is None:
                # The new file of a compaction cut short: removed with the next commit.
                self.recorder.record_remove(temp)
            (self.path.parent / os.path.basename(temp)).unlink(missing_ok=True)
            # What the log holds of the database file's history: from the segment where its
            # fnode was created to the recorder's write head.
            fnode = self.recorder.fnode_of(self.filename)
            node = self.recorder.fsm.live_nodes.get(fnode) if fnode is not None else None
            if node is not None and node.segments:
                first = node.segments[0]
                if first.log == self.recorder.journal:
                    self.history_bytes = max(0, self.recorder.write_head - first.first_offset)
        if self.recorder is not None and batch.start_size:
            self._fnode = self.recorder.fnode_of(self.filename)
            if self._fnode is None:
                # A local file the log doesn't know: record all of it with the next commit.
                assert batch.redo is not None
                with open(self.path, "rb") as f:
                    offset = 0
                    while chunk := f.read(MAX_RECORDED_WRITE):
                        batch.redo[offset] = chunk
                        offset += len(chunk)
        conn = apsw.Connection(
            str(self.path),
            flags=apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE,
            vfs=self._vfs.vfs_name,
        )
        try:
            sync = "OFF" if self.recorder is not None else "FULL"
            conn.execute(
                "PRAGMA locking_mode=EXCLUSIVE; PRAGMA journal_mode=TRUNCATE; "
                f"PRAGMA synchronous={sync}; PRAGMA mmap_size=0;"
            ).fetchall()
            if self.bootstrap_sql:
                conn.execute(self.bootstrap_sql).fetchall()
            if self.recorder is None:
                # A page freed is zeroed, so written, by the commit that frees it, and its
                # undo image (its live content) is kept with that commit's. SQLite doesn't
                # journal a free page it reuses: after a crash mid-commit, its hot journal
                # leaves such a page as the interrupted commit wrote it, and it was live in
                # an older state an undo file rolls back to (a corrupt database).
                conn.execute("PRAGMA secure_delete=ON").fetchall()
            conn.execute(_CHECKPOINT_DDL).fetchall()
        except BaseException:
            conn.close(force=True)
            raise
        self._conn = conn

    def _rollback_to_durable(self) -> None:
        """Close the database, roll it back to its last durable commit, and reopen it."""
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close(force=True)  # SQLite rolls back an open transaction.
            self._conn = None
        current = self._tracker.batch
        self._tracker.batch = None
        batches = [*self._pending, *([current] if current is not None else [])]
        self._pending = []
        path = str(self.path)
        for batch in reversed(batches):
            _apply_undo(path, batch.start_size, batch.undo)
            if batch.undo_file is not None:
                batch.undo_file.unlink(missing_ok=True)
        if self.recorder is None:
            _fsync_dir(str(self.path.parent))
        self._open()

    async def _make_durable(self, batch: _Batch) -> None:
        rec = self.recorder
        if rec is not None:
            temp_fnode = self._temp_fnode
            if batch.copy_create:
                temp_fnode = self._temp_fnode = rec.record_create(self.filename + _COMPACT_SUFFIX)
            if batch.chunk is not None:
                assert temp_fnode is not None, "a compaction's pieces follow its creation"
                chunk = memoryview(batch.chunk)
                for at in range(0, len(chunk), MAX_RECORDED_WRITE):
                    piece = chunk[at : at + MAX_RECORDED_WRITE]
                    rec.record_write(temp_fnode, batch.chunk_offset + at, piece)
                batch.chunk = None
            if not batch.copy_done:
                fnode = self._fnode
                if fnode is None:
                    fnode = rec.fnode_of(self.filename)
                    if fnode is None:
                        fnode = rec.record_create(self.filename)
                    self._fnode = fnode
                for offset, data in batch.recorded_writes():
                    rec.record_write(fnode, offset, data)
            if temp_fnode is not None:
                # Writes to pieces already copied go to the new file too (the rest are in
                # this batch's piece, or will be in later ones).
                for offset, data in batch.recorded_writes():
                    if offset < batch.copy_below:
                        rec.record_write(temp_fnode, offset, data[: batch.copy_below - offset])
            if batch.copy_done:
                assert temp_fnode is not None
                rec.record_rename(self.filename + _COMPACT_SUFFIX, self.filename)
                self._fnode, self._temp_fnode = temp_fnode, None
            try:
                await rec.commit()
            except RecorderFenced as exc:
                raise StoreFenced(f"recovery log is fenced by a newer primary: {exc}") from exc
        elif batch.undo_file is not None:
            undo_file = batch.undo_file
            await asyncio.to_thread(_remove_durably, undo_file)
        batch.undo_file = None
        assert self._pending and self._pending[0] is batch
        self._pending.pop(0)


def _remove_durably(path: Path) -> None:
    path.unlink(missing_ok=True)
    _fsync_dir(str(path.parent))


def read_checkpoint(conn: apsw.Connection) -> cpb.Checkpoint:
    """The checkpoint held by a SQLiteStore database."""
    cp = cpb.Checkpoint()
    for (value,) in conn.execute("SELECT checkpoint FROM gazette_checkpoint"):
        if value:
            cp.ParseFromString(value.encode() if isinstance(value, str) else bytes(value))
    return cp
