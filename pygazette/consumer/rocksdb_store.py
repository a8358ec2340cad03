"""`RocksDBStore`: a shard's state in an embedded RocksDB (through `rocksdict`), recorded
into the shard's recovery log as Gazette's RocksDBStore records it.

The application reads and writes raw bytes keys and values through the store; writes of a
consumer transaction are buffered and applied, together with the transaction's checkpoint,
as ONE atomic RocksDB write batch:

    def new_store(self, shard, recorder):
        return RocksDBStore.open(recorder)  # Opened on a worker thread.

    def consume_message(self, shard, store, envelope, publisher):
        key = envelope.message["key"].encode()
        n = int(store.get(key) or b"0") + 1
        store.put(key, str(n).encode())

`get` sees the current transaction's writes and those of transactions still committing;
`store.db` (the `rocksdict.Rdict`, raw mode) sees what was applied to the database. The
checkpoint is stored under Gazette's key (cockroach-encoded NULL, "checkpoint"), and each
source's read-through offset under Gazette's legacy "mark" keys, exactly as Gazette's
store-rocksdb writes them, so a database recorded by either is restored by the other.

Commits run in call order (`CommitPipeline`): once every `wait_for` resolved, the batch is
written with a synced WAL, then the store records what changed in its directory since the
last commit and appends it to the log as one recorder commit (atomic, fenced by the
recorder's author).

Recording without a RocksDB Env hook. Gazette hooks RocksDB's Env to see every file
operation; rocksdict offers no such hook, so the store diffs its directory instead. RocksDB's
files are write-once (SST) or append-only (WAL, MANIFEST); CURRENT, IDENTITY and OPTIONS
are written to a temporary file and renamed in place. So each file is tracked by path, inode
and recorded length: a new path is recorded as a created file (or as a link, if its inode
is that of a tracked file still there; a rename is recorded as a deletion and a creation,
since a vanished file's inode may be reused by a new one), a grown file by recording its
appended bytes, a vanished one as an unlink; a file that shrank or whose inode changed
behind a tracked path is recorded anew (create truncates). A directory snapshot is a
consistent point in time because of what RocksDB guarantees and what the store checks:

- A table or WAL file is complete and synced before the MANIFEST names it, and is deleted
  only after a MANIFEST edit that drops it was synced. Every file is opened before the
  MANIFEST's size is read, and read through its descriptor (a deleted file stays readable);
  a file created during the snapshot that the recorded MANIFEST prefix could name is picked
  up by a second listing after the MANIFEST's size was read.
- The snapshot is accepted only if CURRENT and the MANIFEST's size were the same before and
  after every file was opened, and the MANIFEST is recorded up to that size; else (a
  background flush or compaction installed its result meanwhile) it is taken again. An
  unfinished table file (a flush or compaction still writing it) is recorded
  as far as it goes; RocksDB only ever appends to it, and no recorded MANIFEST names it yet.
- The WAL holds every applied batch (write with sync=True); the store is the only writer,
  and batches are applied one commit at a time, so the recorded state is that of the commit.

IDENTITY is recorded as a property (kept inline in the hints), as Gazette's recorder does.
Bounded recovery: a player reads the log from the first segment of the oldest live file, so
a file that outlives much history (an OPTIONS file written at open, a bottom-level table
that compaction never rewrites) would make recovery time grow with the shard's age. Once the
log holds more than (1 + `refresh_ratio`) times the store's size of history since its oldest
live file (and at least `refresh_min_bytes`), the store records anew, with that commit, every
live file first recorded more than `refresh_ratio` times the store's size behind the log's
head (a create of the same path, which retires the old fnode, and its whole content): hints
then start past that history, and `shards prune` removes it. A hard link of a file recorded
anew keeps its other paths on the old fnode (RocksDB makes no hard links of its own).
`refreshed_files` counts the files recorded anew.

Excluded from the log: LOCK, the info LOG files (rewritten and rolled by RocksDB) and
rocksdict's own `rocksdict-config.json`. As Gazette's store does, the MANIFEST is capped at
128 KiB (`max_manifest_file_size`), so it is rewritten anew and old ones are deleted, and
WAL files are deleted once flushed: compaction deletes superseded table files, the log's
hints then skip them, and playback reads about the live database, not its history.

Table files use block-based format_version 5, which RocksDB 7.x (Gazette's Go summer on
Debian's librocksdb) reads; rocksdict's RocksDB (9.x) reads what 7.x writes.

A commit that fails (a failed `wait_for`, a fenced or failed log append) fails every later
commit: the database may be ahead of the log, so the store can't be used further, and the
shard recovers anew from its log (as Gazette's does). Without a recorder (`directory=`),
the store is a plain local RocksDB with synced writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import Awaitable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import rocksdict

from pygazette.consumer.memory_store import CommitPipeline, EarlierCommitFailed, copy_checkpoint
from pygazette.consumer.recoverylog import RecorderFenced
from pygazette.consumer.store import CommitFuture, Store, StoreFenced
from pygazette.protocol.pb import consumer_pb2 as cpb

if TYPE_CHECKING:
    from pygazette.consumer.recoverylog.recorder import Recorder
    from pygazette.consumer.shard_api import Shard

__all__ = [
    "CHECKPOINT_KEY",
    "RocksDBStore",
    "decode_varint_ascending",
    "encode_string_ascending",
    "encode_varint_ascending",
    "mark_key",
]

# Files of the directory that are never recorded (see the module docstring).
_UNRECORDED = ("LOCK", "LOG", "rocksdict-config.json")
# Recorded appends are split into writes of at most this many bytes.
MAX_RECORDED_WRITE = 1 << 20
# Gazette's store-rocksdb: Options.SetMaxManifestFileSize(1 << 17).
MAX_MANIFEST_FILE_SIZE = 1 << 17
# Recorded as a property (inline in hints), as Gazette's recorder does: RocksDB writes it once.
_PROPERTY_FILES = ("/IDENTITY",)
# Re-recording of live files that pin the log's old history (see the module docstring).
DEFAULT_REFRESH_RATIO = 1.0
DEFAULT_REFRESH_MIN_BYTES = 4 << 20
# A snapshot raced by a background flush or compaction is taken again, at most this often.
_SNAPSHOT_ATTEMPTS = 50

# Cockroach's order-preserving key encoding, as Gazette's store-rocksdb uses it.
_NULL = b"\x00"
_BYTES_MARKER = b"\x12"
_ESCAPED_TERM = b"\x00\x01"
_INT_ZERO = 136
_INT_SMALL = 109


def encode_string_ascending(value: bytes) -> bytes:
    """cockroach-encoding's EncodeStringAscending (bytes marker, 0x00 escaped, terminator)."""
    return _BYTES_MARKER + value.replace(b"\x00", b"\x00\xff") + _ESCAPED_TERM


def encode_varint_ascending(v: int) -> bytes:
    """cockroach-encoding's EncodeVarintAscending, of a non-negative value (an offset)."""
    if not 0 <= v < 1 << 63:
        raise ValueError(f"offset {v} is not a non-negative int64")
    if v <= _INT_SMALL:
        return bytes([_INT_ZERO + v])
    raw = v.to_bytes(8, "big").lstrip(b"\x00")
    return bytes([_INT_ZERO + _INT_SMALL + len(raw)]) + raw


def decode_varint_ascending(b: bytes) -> int:
    """The inverse of `encode_varint_ascending` for non-negative values."""
    if not b:
        raise ValueError("empty varint")
    length = b[0] - _INT_ZERO
    if 0 <= length <= _INT_SMALL:
        return length
    n = b[0] - _INT_ZERO - _INT_SMALL
    if not 0 < n <= 8 or len(b) < 1 + n:
        raise ValueError(f"not a non-negative ascending varint: {b.hex()}")
    return int.from_bytes(b[1 : 1 + n], "big")


# Gazette's checkpointKey: EncodeStringAscending(EncodeNullAscending(nil), "checkpoint").
CHECKPOINT_KEY = _NULL + encode_string_ascending(b"checkpoint")


def mark_key(journal: str) -> bytes:
    """Gazette's legacy per-journal offset key (appendOffsetKeyEncoding)."""
    return _NULL + encode_string_ascending(b"mark") + encode_string_ascending(journal.encode())


def default_options() -> rocksdict.Options:
    """Options of a recorded RocksDB (see the module docstring); callers may tune others."""
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_max_manifest_file_size(MAX_MANIFEST_FILE_SIZE)
    opts.set_recycle_log_file_num(0)  # Recycled WALs are rewritten in place.
    opts.set_allow_mmap_writes(False)
    opts.set_use_direct_io_for_flush_and_compaction(False)
    opts.set_wal_ttl_seconds(0)  # No WAL archive: flushed WAL files are deleted.
    opts.set_wal_size_limit_mb(0)
    opts.set_keep_log_file_num(2)
    table = rocksdict.BlockBasedOptions()
    table.set_format_version(5)
    opts.set_block_based_table_factory(table)
    return opts


@dataclass(slots=True)
class _Tracked:
    ino: int
    size: int


@dataclass(slots=True)
class _FileOp:
    """One recorded change of the directory, in the order it must be recorded."""

    kind: str  # "create", "link", "unlink", "write", "property"
    path: str
    src: str = ""
    offset: int = 0
    data: bytes = b""


class _SnapshotRaced(Exception):
    """A background flush or compaction installed its result during the snapshot."""


class RocksDBStore(Store):
    """A store whose state is a RocksDB database (see the module docstring).

    `recorder`: the shard's recovery log recorder (its `root` is the database directory);
    or `directory`: a plain local database. `options`: a `rocksdict.Options` in raw mode
    (default `default_options()`); with a recorder, the store sets the options its
    recording relies on.
    """

    def __init__(
        self,
        recorder: Recorder | None = None,
        *,
        directory: str | os.PathLike[str] | None = None,
        options: rocksdict.Options | None = None,
        refresh_ratio: float | None = DEFAULT_REFRESH_RATIO,
        refresh_min_bytes: int = DEFAULT_REFRESH_MIN_BYTES,
    ) -> None:
        opts = self._prepare(recorder, directory, options, refresh_ratio, refresh_min_bytes)
        self._open_database(opts)

    @classmethod
    async def open(
        cls,
        recorder: Recorder | None = None,
        *,
        directory: str | os.PathLike[str] | None = None,
        options: rocksdict.Options | None = None,
        refresh_ratio: float | None = DEFAULT_REFRESH_RATIO,
        refresh_min_bytes: int = DEFAULT_REFRESH_MIN_BYTES,
    ) -> RocksDBStore:
        """The store, as the constructor makes it, but with the database opened (and its
        directory first looked over) on a worker thread: opening a large database takes
        a while, and `new_store` runs on the consumer's event loop, where every other shard
        of the process would wait for it. Return it from `new_store` (an awaitable):

            def new_store(self, shard, recorder):
                return RocksDBStore.open(recorder)
        """
        store = cls.__new__(cls)
        opts = store._prepare(recorder, directory, options, refresh_ratio, refresh_min_bytes)
        # Nothing else holds the store yet; the recorder is only read, before the thread.
        await asyncio.to_thread(store._open_database, opts)
        return store

    def _prepare(
        self,
        recorder: Recorder | None,
        directory: str | os.PathLike[str] | None,
        options: rocksdict.Options | None,
        refresh_ratio: float | None,
        refresh_min_bytes: int,
    ) -> rocksdict.Options:
        """Everything but opening the database; its options."""
        if refresh_ratio is not None and not refresh_ratio > 0:
            raise ValueError(f"RocksDBStore: refresh_ratio must be > 0, not {refresh_ratio}")
        if recorder is not None:
            if directory is not None and Path(directory) != Path(recorder.root):
                raise ValueError("RocksDBStore: `directory` must be the recorder's root")
            root = Path(recorder.root)
        elif directory is not None:
            root = Path(directory)
        else:
            raise ValueError("RocksDBStore needs a recorder or a directory")
        root.mkdir(parents=True, exist_ok=True)
        self.recorder = recorder
        self.directory = root
        self._pipeline = CommitPipeline()
        self._txn: dict[bytes, bytes | None] = {}
        # Writes of transactions started committing and not yet applied; oldest first.
        self._committing: list[dict[bytes, bytes | None]] = []
        self._tracked: dict[str, _Tracked] = {}
        self._destroyed = False
        self.recorded_bytes = 0  # File bytes recorded by this store.
        self.refresh_ratio = refresh_ratio
        self.refresh_min_bytes = refresh_min_bytes
        self.refreshed_files = 0  # Live files recorded anew (see the module docstring).
        if recorder is not None:
            self._track_played_files(recorder)
        opts = options if options is not None else default_options()
        if recorder is not None:
            opts.set_max_manifest_file_size(MAX_MANIFEST_FILE_SIZE)
            opts.set_recycle_log_file_num(0)
            opts.set_allow_mmap_writes(False)
            opts.set_wal_ttl_seconds(0)
            opts.set_wal_size_limit_mb(0)
        self._write_opts = rocksdict.WriteOptions()
        # A property (rocksdict's stubs declare it a method): the WAL is synced per write.
        self._write_opts.sync = True  # type: ignore[method-assign,assignment]
        return opts

    def _open_database(self, opts: rocksdict.Options) -> None:
        """Open the database, and snapshot what opening did to a recorded directory."""
        self.db = rocksdict.Rdict(str(self.directory), opts)
        self.db.set_write_options(self._write_opts)
        # What opening did to the directory (a new MANIFEST, WAL, OPTIONS; deleted files)
        # is recorded with the first commit.
        self._opened_ops: list[_FileOp] | None = None
        if self.recorder is not None:
            try:
                self._opened_ops = self._snapshot()
            except BaseException:
                self.db.close()
                raise

    @property
    def recorded_files(self) -> dict[str, int]:
        """Files of the directory as recorded so far (name -> recorded length)."""
        return {rel.lstrip("/"): t.size for rel, t in self._tracked.items()}

    # The application's side ----------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        """The value of `key` as of the current transaction's writes (None if absent)."""
        self._check_usable()
        for writes in (self._txn, *reversed(self._committing)):
            if key in writes:
                return writes[key]
        value = self.db.get(key)
        return None if value is None else bytes(value)

    def put(self, key: bytes, value: bytes) -> None:
        """Set `key` to `value` within the current transaction."""
        self._check_usable()
        if key == CHECKPOINT_KEY:
            raise ValueError("RocksDBStore: the checkpoint key is the store's own")
        self._txn[bytes(key)] = bytes(value)

    def delete(self, key: bytes) -> None:
        """Delete `key` within the current transaction."""
        self._check_usable()
        self._txn[bytes(key)] = None

    # Store ---------------------------------------------------------------------------------

    async def restore_checkpoint(self, shard: Shard) -> cpb.Checkpoint:
        self._check_usable()
        await self._pipeline.drain()
        if self._pipeline.failure is not None:
            raise EarlierCommitFailed(
                "RocksDBStore: a commit failed and the database may be ahead of its log: "
                f"recover the shard anew ({self._pipeline.failure!r})"
            ) from self._pipeline.failure
        self._txn = {}
        return read_checkpoint(self.db)

    def start_commit(
        self, shard: Shard, checkpoint: cpb.Checkpoint, wait_for: Sequence[Awaitable[object]]
    ) -> CommitFuture:
        self._check_usable()
        if self._pipeline.failure is not None:
            return self._pipeline.failed_commit()
        cp = copy_checkpoint(checkpoint)
        writes, self._txn = self._txn, {}
        self._committing.append(writes)

        async def apply() -> None:
            batch = rocksdict.WriteBatch(raw_mode=True)
            for key, value in writes.items():
                if value is None:
                    batch.delete(key)
                else:
                    batch.put(key, value)
            batch.put(CHECKPOINT_KEY, cp.SerializeToString())
            for journal, source in cp.sources.items():
                batch.put(mark_key(journal), encode_varint_ascending(source.read_through))
            rec = self.recorder
            if rec is None:
                await asyncio.to_thread(self.db.write, batch, self._write_opts)
                return
            ops = await asyncio.to_thread(self._write_and_snapshot, batch)
            for op in ops:
                self._record(rec, op)
            try:
                await rec.commit()
            except RecorderFenced as exc:
                raise StoreFenced(f"recovery log is fenced by a newer primary: {exc}") from exc

        def finished() -> None:
            with contextlib.suppress(ValueError):
                self._committing.remove(writes)

        return self._pipeline.start(wait_for, apply, finished=finished)

    def destroy(self) -> None:
        """Close the database. Files are left in place (a shard's local directory is removed
        by its replica)."""
        if self._destroyed:
            return
        self._destroyed = True
        self._pipeline.cancel()
        with contextlib.suppress(Exception):
            self.db.close()

    # Internals -----------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._destroyed:
            raise RuntimeError("RocksDBStore was destroyed")

    def _write_and_snapshot(self, batch: rocksdict.WriteBatch) -> list[_FileOp]:
        self.db.write(batch, self._write_opts)
        ops = self._snapshot()
        if self._opened_ops is not None:
            ops, self._opened_ops = self._opened_ops + ops, None
        return ops

    def _track_played_files(self, rec: Recorder) -> None:
        """Track the files the log holds, as the player left them in the directory."""
        for rel in [*rec.fsm.links, *(p for p in rec.fsm.properties if p in _PROPERTY_FILES)]:
            path = self.directory / rel.lstrip("/")
            try:
                st = path.stat()
            except FileNotFoundError:
                raise RuntimeError(
                    f"RocksDBStore: {rel} is in the recovery log but not in {self.directory}"
                ) from None
            self._tracked[rel] = _Tracked(st.st_ino, st.st_size)

    def _record(self, rec: Recorder, op: _FileOp) -> None:
        path, src = op.path.lstrip("/"), op.src.lstrip("/")
        if op.kind == "property":
            rec.record_property(path, op.data.decode())
        elif op.kind == "create":
            rec.record_create(path)
        elif op.kind == "link":
            fnode = rec.fnode_of(src)
            assert fnode is not None
            rec.record_link(fnode, path)
        elif op.kind == "unlink":
            rec.record_remove(path)
        else:
            fnode = rec.fnode_of(path)
            assert fnode is not None
            rec.record_write(fnode, op.offset, op.data)
            self.recorded_bytes += len(op.data)

    def _snapshot(self) -> list[_FileOp]:
        """What changed in the directory since the last snapshot (see the module docstring),
        as of one consistent point in time; updates the tracked state."""
        for _ in range(_SNAPSHOT_ATTEMPTS):
            try:
                return self._try_snapshot()
            except _SnapshotRaced:
                continue
        raise RuntimeError(
            f"RocksDBStore: no consistent snapshot of {self.directory} in "
            f"{_SNAPSHOT_ATTEMPTS} attempts (background work kept changing the MANIFEST)"
        )

    def _manifest_state(self) -> tuple[bytes, str, int]:
        current = (self.directory / "CURRENT").read_bytes()
        name = current.decode(errors="replace").strip()
        try:
            size = (self.directory / name).stat().st_size
        except FileNotFoundError:
            raise _SnapshotRaced() from None
        return current, "/" + name, size

    def _try_snapshot(self) -> list[_FileOp]:
        before = self._manifest_state()
        fds: dict[str, tuple[int, os.stat_result]] = {}
        try:
            self._open_all(fds)
            after = self._manifest_state()
            self._open_all(fds)  # Files created since the first listing.
            if after != before or after[1] not in fds:
                raise _SnapshotRaced()
            # The MANIFEST is recorded as far as it was checked: an edit appended since may
            # name a table file this snapshot doesn't hold.
            return self._diff(fds, {after[1]: after[2]})
        finally:
            for fd, _st in fds.values():
                os.close(fd)

    def _open_all(self, fds: dict[str, tuple[int, os.stat_result]]) -> None:
        for name in os.listdir(self.directory):
            rel = "/" + name
            if rel in fds or _unrecorded(name):
                continue
            try:
                fd = os.open(self.directory / name, os.O_RDONLY)
            except FileNotFoundError:
                continue  # Deleted meanwhile.
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                os.close(fd)
                continue
            fds[rel] = (fd, st)

    def _diff(
        self, fds: dict[str, tuple[int, os.stat_result]], caps: dict[str, int]
    ) -> list[_FileOp]:
        ops: list[_FileOp] = []
        tracked = self._tracked
        sizes = {rel: os.fstat(fd).st_size for rel, (fd, _st) in fds.items()}
        for rel, cap in caps.items():
            sizes[rel] = min(sizes[rel], cap)
        gone = [rel for rel in tracked if rel not in fds]
        # Paths whose tracked file is still there, by inode: another path of the same inode
        # is a hard link of it. A vanished path's inode may be reused by any new file, so a
        # rename can't be told apart from a deletion and a creation, and is recorded as such
        # (RocksDB renames only its *.dbtmp files, which are not recorded).
        linked: dict[int, str] = {}
        for rel, (_fd, st) in fds.items():
            old = tracked.get(rel)
            if old is not None and old.ino == st.st_ino and sizes[rel] >= old.size:
                linked.setdefault(st.st_ino, rel)
        for rel, (_fd, st) in sorted(fds.items()):
            old = tracked.get(rel)
            if old is not None and old.ino == st.st_ino and sizes[rel] >= old.size:
                continue
            src = linked.get(st.st_ino)
            if old is None and src is not None:
                ops.append(_FileOp("link", rel, src=src))
                tracked[rel] = _Tracked(st.st_ino, tracked[src].size)
                continue
            if rel in _PROPERTY_FILES:
                fd = fds[rel][0]
                content = os.pread(fd, sizes[rel], 0)
                ops.append(_FileOp("property", rel, data=content))
                tracked[rel] = _Tracked(st.st_ino, sizes[rel])
                continue
            # A new file, or another file (or a truncated one) behind a tracked path.
            ops.append(_FileOp("create", rel))
            tracked[rel] = _Tracked(st.st_ino, 0)
        for rel in gone:
            if rel not in _PROPERTY_FILES:  # A property stays (RocksDB never deletes it).
                ops.append(_FileOp("unlink", rel))
            del tracked[rel]
        # Appends, in path order (links of one file share its recorded size).
        recorded_ino: set[int] = set()
        for rel, (fd, st) in sorted(fds.items()):
            t = tracked[rel]
            if st.st_ino in recorded_ino:
                continue
            recorded_ino.add(st.st_ino)
            size = sizes[rel]
            for offset, data in _read_range(fd, t.size, size):
                ops.append(_FileOp("write", rel, offset=offset, data=data))
            for other in tracked.values():
                if other.ino == st.st_ino:
                    other.size = size
        ops += self._refresh(fds, sizes, {op.path for op in ops if op.kind == "create"})
        return ops

    def _refresh(
        self,
        fds: dict[str, tuple[int, os.stat_result]],
        sizes: dict[str, int],
        created: set[str],
    ) -> list[_FileOp]:
        """Record anew the live files that pin history older than `refresh_ratio` times the
        store's size behind the log's head, once the log holds more than (1 + ratio) times
        the store's size (and `refresh_min_bytes`) of history since its oldest live file."""
        rec = self.recorder
        if rec is None or self.refresh_ratio is None:
            return []
        firsts: dict[str, int] = {}
        for rel in fds:
            if rel in created or rel in _PROPERTY_FILES:
                continue
            fnode = rec.fsm.links.get(rel)
            node = rec.fsm.live_nodes.get(fnode) if fnode is not None else None
            if node is None or not node.segments or node.segments[0].log != rec.journal:
                continue
            firsts[rel] = node.segments[0].first_offset
        if not firsts:
            return []
        store = sum(sizes[rel] for rel in fds if rel not in _PROPERTY_FILES)
        head = rec.write_head
        if head - min(firsts.values()) <= max(
            self.refresh_min_bytes, (1 + self.refresh_ratio) * store
        ):
            return []
        horizon = head - self.refresh_ratio * store
        ops: list[_FileOp] = []
        done: set[int] = set()
        for rel, first in sorted(firsts.items(), key=lambda kv: kv[1]):
            fd, st = fds[rel]
            if first >= horizon or st.st_ino in done:
                continue
            done.add(st.st_ino)
            ops.append(_FileOp("create", rel))
            for offset, data in _read_range(fd, 0, sizes[rel]):
                ops.append(_FileOp("write", rel, offset=offset, data=data))
            self.refreshed_files += 1
        return ops

    def __repr__(self) -> str:
        return f"RocksDBStore({str(self.directory)!r}, recorded={self.recorder is not None})"


def _unrecorded(name: str) -> bool:
    return name in _UNRECORDED or name.startswith("LOG.old") or name.endswith(".dbtmp")


def _read_range(fd: int, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    offset = start
    while offset < end:
        data = os.pread(fd, min(MAX_RECORDED_WRITE, end - offset), offset)
        if not data:
            raise RuntimeError(f"RocksDBStore: file shrank while recording (at {offset})")
        yield offset, data
        offset += len(data)


def read_checkpoint(db: rocksdict.Rdict) -> cpb.Checkpoint:
    """The checkpoint held by a RocksDB database (Gazette's key; legacy marks if absent)."""
    cp = cpb.Checkpoint()
    raw = db.get(CHECKPOINT_KEY)
    if raw is not None:
        cp.ParseFromString(bytes(raw))
        return cp
    prefix = mark_key("")[: -len(encode_string_ascending(b""))]
    it = db.iter()
    it.seek(prefix)
    while it.valid():
        key = bytes(it.key())
        if not key.startswith(prefix):
            break
        name = _decode_string_ascending(key[len(prefix) :])
        cp.sources[name].read_through = decode_varint_ascending(bytes(it.value()))
        it.next()
    return cp


def _decode_string_ascending(b: bytes) -> str:
    if not b.startswith(_BYTES_MARKER) or not b.endswith(_ESCAPED_TERM):
        raise ValueError(f"not an ascending string: {b.hex()}")
    return b[1:-2].replace(b"\x00\xff", b"\x00").decode()
