"""`Player`: plays a recovery log into a local directory.

Playback starts from `FSMHints`: an FSM built from them (`FSM.from_hints`) knows which log
segments hold the live files, so the player seeks straight to the first hinted segment
(skipping dead stretches between segments too), and applies each operation the FSM accepts:
creating files, writing the data which follows a Write op in the log, dropping files whose
last link goes. Operations the FSM rejects — of deposed authors, duplicated, out of the
hinted history — are skipped, as are bytes which are not frames at all. Without hints,
every operation from the log's first (sequence number 1) on must be read: one read beyond
the next sequence number, first in the log or first after an offset jump (fragments
removed), fails playback with a `PlayerError` rather than leaving the store as of before the
gap (Gazette's Player goes on, and recovers an empty or stale store). Files are staged
under `<directory>/.fnodes/<fnode>` and linked into their paths (and properties written)
only once playback completes.

Before reading, the player learns the write head of every log it must read with an empty
append (a write barrier). Once it has read through the head, `tailing` is set, and it keeps
reading as the log grows (a hot standby) until asked to finish:

- `finish_at_write_head()`: complete at the write head (as of the request, or later);
- `inject_handoff(author)`: at the write head, append a no-op sequenced after everything
  read, by `author`, whose append also replaces the log's fence register with `author`'s
  (`Author.fence`). If the no-op is read back as applied, playback completes right after it
  and `author` owns the log: a recorder of the previous author can append nothing more. If
  another writer raced it and the no-op does not sequence, the player reads on and tries
  again.

On completion `play()` returns the resolved FSM (also `Player.fsm`), from which a
`Recorder` continues. On error or cancellation `play()` raises and removes `directory`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import posixpath
import shutil
from collections.abc import Callable
from pathlib import Path

from google.protobuf.message import DecodeError

from pygazette.client.errors import OffsetJump
from pygazette.client.journal_client import JournalClient
from pygazette.client.retry_reader import RetryReader
from pygazette.consumer.metrics import RECOVERED_BYTES
from pygazette.consumer.recoverylog.fsm import (
    FSM,
    Author,
    FSMError,
    NotHintedAuthor,
    WrongSeqNo,
)
from pygazette.consumer.recoverylog.log_append import append_to_log
from pygazette.message.fixed_framing import (
    FIXED_FRAME_HEADER,
    FIXED_FRAME_HEADER_LENGTH,
    FIXED_FRAME_WORD,
    MAX_FRAME_LENGTH,
    encode_fixed_frame,
)
from pygazette.protocol.errors import GazetteError, OffsetNotYetAvailable
from pygazette.protocol.pb import recoverylog_pb2 as rpb

log = logging.getLogger(__name__)

__all__ = ["FNODE_STAGING_DIR", "Player", "PlayerError"]

# Subdirectory of the playback directory where files are staged, named by fnode.
FNODE_STAGING_DIR = ".fnodes"


class PlayerError(GazetteError):
    """Playback cannot continue (the log does not hold what the hints promise, say)."""


class _State(enum.Enum):
    BACKFILL = "backfill"  # Reading historical content.
    TAIL = "tail"  # At the write head, waiting for more.
    EXIT_AT_HEAD = "exit-at-head"  # Complete on reaching the write head.
    INJECT_HANDOFF = "inject-handoff"  # Append a hand-off no-op on reaching the write head.
    READ_HANDOFF = "read-handoff"  # Read until our hand-off no-op, to learn if it applied.


class _LogReader:
    """A buffered, seekable reader of one log at a time, in blocking or non-blocking mode.

    `offset` is the log offset of the first buffered (unconsumed) byte.
    """

    def __init__(self, client: JournalClient) -> None:
        self.client = client
        self.journal = ""
        self.offset = 0
        self.block = False
        self._buf = b""
        self._pos = 0
        self._rr: RetryReader | None = None

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos

    def seek(self, journal: str, offset: int) -> None:
        """Continue at `offset` of `journal` (within the buffer if it can)."""
        if journal == self.journal and self.offset <= offset <= self.offset + self.buffered:
            self.skip(offset - self.offset)
            return
        self._drop()
        self.journal, self.offset = journal, offset
        self._buf, self._pos = b"", 0

    def set_blocking(self, block: bool) -> None:
        if block != self.block:
            self.block = block
            self._drop()  # The next read starts an RPC of the new mode.

    async def fill(self, n: int) -> None:
        """Buffer at least `n` bytes. Raises `OffsetNotYetAvailable` (non-blocking, at the
        write head) and `OffsetJump` (the buffer is dropped; reading continues at the jump)."""
        while self.buffered < n:
            rr = self._rr
            if rr is None:
                rr = self._rr = RetryReader(
                    self.client,
                    self.journal,
                    offset=self.offset + self.buffered,
                    block=self.block,
                )
            try:
                chunk = await rr.read()
            except OffsetJump as jump:
                self._buf, self._pos = b"", 0
                self.offset = jump.offset
                raise
            except BaseException:
                self._drop()  # A reader which failed (or was cancelled) is not reused.
                raise
            if not chunk:
                continue  # The RetryReader restarts the stream itself.
            RECOVERED_BYTES.inc(len(chunk))
            if self._pos == len(self._buf):
                self._buf, self._pos = chunk, 0
            else:
                self._buf, self._pos = self._buf[self._pos :] + chunk, 0

    def peek(self, n: int) -> memoryview:
        return memoryview(self._buf)[self._pos : self._pos + n]

    def find(self, needle: bytes, start: int) -> int:
        """Position (relative to the buffer start) of `needle` at or after `start`, or -1."""
        at = self._buf.find(needle, self._pos + start)
        return -1 if at == -1 else at - self._pos

    def take(self, n: int) -> bytes:
        out = self._buf[self._pos : self._pos + n]
        self.skip(n)
        return out

    def skip(self, n: int) -> None:
        self._pos += n
        self.offset += n

    async def copy(self, length: int, sink: Callable[[memoryview, int], None] | None) -> None:
        """Pass the next `length` bytes to `sink(view, position)`, chunk by chunk (or discard
        them without a sink)."""
        done = 0
        while done < length:
            if not self.buffered:
                await self.fill(1)
            n = min(self.buffered, length - done)
            if sink is not None:
                sink(self.peek(n), done)
            self.skip(n)
            done += n

    def _drop(self) -> None:
        rr, self._rr = self._rr, None
        if rr is not None:
            rr.cancel()

    async def aclose(self) -> None:
        rr, self._rr = self._rr, None
        if rr is not None:
            rr.cancel()
            await rr.aclose()


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while len(view):
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _local_path(directory: Path, path: str) -> Path:
    """Where recorded `path` ("/a/b") lives under `directory`; refuses escapes."""
    rel = posixpath.normpath(path.lstrip("/"))
    if rel in (".", "") or rel == ".." or rel.startswith("../") or posixpath.isabs(rel):
        raise PlayerError(f"recorded path {path!r} is not under the recovered directory")
    return directory.joinpath(*rel.split("/"))


def _staged_path(directory: Path, fnode: int) -> Path:
    return directory / FNODE_STAGING_DIR / str(fnode)


def _prepare_playback(directory: Path) -> None:
    """Remove anything under `directory`, and create its staging directory."""
    shutil.rmtree(directory, ignore_errors=True)
    (directory / FNODE_STAGING_DIR).mkdir(parents=True)


def _make_live(directory: Path, fsm: FSM, files: dict[int, int]) -> None:
    """Link staged files into their paths, drop the staging directory, write properties."""
    if fsm.has_remaining_hints():
        raise PlayerError("playback completed, but the FSM has hints it never reached")
    for fnode, node in fsm.live_nodes.items():
        fd = files.pop(fnode)
        staged = _staged_path(directory, fnode)
        for link in node.links:
            target = _local_path(directory, link)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(staged, target)
        os.close(fd)
        staged.unlink()
    if files:
        raise PlayerError(f"staged files of fnodes {sorted(files)} are not live in the FSM")
    (directory / FNODE_STAGING_DIR).rmdir()
    for path, content in fsm.properties.items():
        target = _local_path(directory, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "x", encoding="utf-8", newline="") as f:
            f.write(content)


async def _in_thread_to_the_end(fn: Callable[..., None], *args: object) -> None:
    """`fn(*args)` in a thread. Cancelled, it still waits for the thread to finish before
    raising: the thread works on the playback's directory and staged files, which the
    cleanup after a cancellation closes and removes (a file closed under the thread is
    closed twice, maybe a descriptor the process reused; one it still held leaks)."""
    work = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        await asyncio.shield(work)
    except asyncio.CancelledError:
        await asyncio.wait({work})
        if not work.cancelled():
            work.exception()  # Retrieved: the cancellation is what the caller gets.
        raise


def _cleanup_on_abort(directory: Path, files: dict[int, int]) -> None:
    for fd in files.values():
        with contextlib.suppress(OSError):
            os.close(fd)
    files.clear()
    shutil.rmtree(directory, ignore_errors=True)


class Player:
    """Plays the recovery log `hints.log` into `directory` (see the module docstring).

    `directory` is emptied first. `play()` may be awaited once; `finish_at_write_head` or
    `inject_handoff` may be called once, before or while it runs, from the same event loop.
    """

    def __init__(
        self, client: JournalClient, hints: rpb.FSMHints, directory: str | os.PathLike[str]
    ) -> None:
        self.client = client
        self.hints = rpb.FSMHints()
        self.hints.CopyFrom(hints)
        self.directory = Path(directory).absolute()
        # Set once playback has read through the log's write head (it is then tailing).
        self.tailing = asyncio.Event()
        # The resolved FSM, once `play()` completed.
        self.fsm: FSM | None = None
        self._request: int | None = None  # 0: finish at the head; else hand off to an author.
        self._requested = asyncio.Event()
        self._started = False
        # Without hints, the range of log an offset jump skipped, until an op applies after it.
        self._gap: tuple[int, int] | None = None

    @property
    def log(self) -> str:
        return self.hints.log

    def finish_at_write_head(self) -> None:
        """Complete playback once it reaches the write head (as of now, or later)."""
        self._set_request(0)

    def inject_handoff(self, author: int) -> None:
        """Complete playback by handing the log off to `author` (nonzero) at its write head."""
        if not 0 < author <= 0xFFFFFFFF:
            raise ValueError(f"author must be a nonzero uint32, not {author}")
        self._set_request(author)

    def _set_request(self, request: int) -> None:
        if self._request is not None:
            raise RuntimeError("finish_at_write_head or inject_handoff was already called")
        self._request = request
        self._requested.set()

    async def play(self) -> FSM:
        """Play the log until completion (see `finish_at_write_head`, `inject_handoff`);
        returns the resolved FSM."""
        if self._started:
            raise RuntimeError("Player.play may be called only once")
        self._started = True
        files: dict[int, int] = {}  # Staged files of live fnodes: fnode -> fd.
        reader = _LogReader(self.client)
        try:
            fsm = await self._play(reader, files)
        except BaseException:
            _cleanup_on_abort(self.directory, files)
            raise
        finally:
            with contextlib.suppress(Exception):
                await reader.aclose()
        self.fsm = fsm
        return fsm

    async def _play(self, reader: _LogReader, files: dict[int, int]) -> FSM:
        hints = self.hints
        fsm = FSM.from_hints(hints)
        directory = self.directory
        await _in_thread_to_the_end(_prepare_playback, directory)

        # The write head of every log to read, by write barrier: everything appended before
        # the barrier is readable below it.
        heads: dict[str, int] = {}
        for name in [hints.log, *(s.log for s in fsm.hinted_segments)]:
            if name not in heads:
                heads[name] = (await append_to_log(self.client, name, b"")).commit.end
        for hinted in fsm.hinted_segments:
            head = heads[hinted.log]
            if hinted.first_offset >= head or hinted.last_offset > head:
                raise PlayerError(
                    f"max write-head of {hinted.log} is {head}, vs hinted segment {hinted}; "
                    f"possible data loss"
                )

        state = _State.BACKFILL
        handoff = 0  # The author we hand off to, once requested.
        taken = False  # Whether the finish / hand-off request was taken.
        read_through = 0  # Write head of the log being read, as last learned.

        while True:
            seg = fsm.next_hinted_segment()
            if seg is not None:
                if reader.journal != seg.log or reader.offset < seg.first_offset:
                    # Skip ahead to the next hinted segment (past a dead stretch of the log).
                    reader.seek(seg.log, seg.first_offset)
                    read_through = heads[seg.log]
                elif reader.offset >= read_through:
                    raise PlayerError(
                        f"offset {reader.journal}:{reader.offset} >= read-through "
                        f"{read_through}, but the FSM has unused hints; possible data loss"
                    )
            elif not reader.journal:
                reader.seek(hints.log, 0)  # No hints: read the log from its beginning.
                read_through = heads[hints.log]
            elif reader.journal != hints.log:
                raise PlayerError(
                    f"reading {reader.journal}, but expected {hints.log} after all hints"
                )

            if not taken and self._request is not None:
                taken = True
                handoff = self._request
                state = _State.EXIT_AT_HEAD if handoff == 0 else _State.INJECT_HANDOFF

            if state in (_State.TAIL, _State.READ_HANDOFF):
                reader.set_blocking(True)
            else:
                # Non-blocking near the head, so that reaching it is noticed. (Fewer than a
                # header's bytes before the head can only be bytes which are not a frame.)
                reader.set_blocking(reader.offset + FIXED_FRAME_HEADER_LENGTH <= read_through)

            try:
                if state is _State.TAIL and reader.buffered < FIXED_FRAME_HEADER_LENGTH:
                    if not await self._fill_unless_requested(reader):
                        continue  # A request arrived: take it.
                else:
                    await reader.fill(FIXED_FRAME_HEADER_LENGTH)
            except OffsetNotYetAvailable:
                if reader.buffered:
                    # Whole appends become readable at once, so a partial frame header at
                    # the write head is not a recorded op: skip it.
                    self._skip_garbage(reader, reader.buffered)
                if reader.offset < read_through:
                    raise PlayerError(
                        f"{reader.journal}:{reader.offset} is not yet available, but the "
                        f"write head was {read_through}"
                    ) from None
                if reader.journal != hints.log:
                    raise PlayerError(
                        f"read through {reader.journal} without reaching hinted segments"
                    ) from None
                if not self.tailing.is_set():
                    log.info(
                        "recovery log playback reached the write head",
                        extra={"log": reader.journal, "offset": reader.offset},
                    )
                    self.tailing.set()

                if state is _State.BACKFILL:
                    state = _State.TAIL
                elif state is _State.EXIT_AT_HEAD:
                    return await self._complete(fsm, files, reader.offset)
                elif state is _State.INJECT_HANDOFF:
                    read_through = await self._inject_noop(fsm, handoff)
                    state = _State.READ_HANDOFF
                else:
                    raise PlayerError(f"unexpected write head in state {state}") from None
                continue
            except OffsetJump as jump:
                seg = fsm.next_hinted_segment()
                if seg is not None and seg.last_offset != 0 and seg.last_offset < jump.offset:
                    raise PlayerError(
                        f"offset jumps over hinted segment of {reader.journal} (from "
                        f"{jump.requested} to {jump.offset}, hinted range "
                        f"{seg.first_offset}-{seg.last_offset}); possible data loss"
                    ) from None
                log.warning(
                    "recovery log offset jump",
                    extra={"log": reader.journal, "from": jump.requested, "to": jump.offset},
                )
                if not self.hints.live_nodes:
                    self._gap = (jump.requested, jump.offset)
                continue

            try:
                op, applied = await self._play_operation(reader, fsm, files)
            except OffsetJump as jump:
                raise PlayerError(
                    f"offset jump within the operation at {reader.journal}:{jump.requested} "
                    f"(to {jump.offset}); possible data loss"
                ) from None

            if handoff and op is not None and op.author == handoff:
                # Read back after injecting it; or, reading on to try again, a copy of a no-op
                # that lost the race, appended twice by a retry whose first attempt committed.
                if state not in (_State.READ_HANDOFF, _State.INJECT_HANDOFF):
                    raise PlayerError(f"read an op of hand-off author {handoff} in {state}")
                if applied:
                    # Our no-op sequenced: the log is ours from here on.
                    return await self._complete(fsm, files, reader.offset)
                state = _State.INJECT_HANDOFF  # Lost a race to another writer: again.

    async def _fill_unless_requested(self, reader: _LogReader) -> bool:
        """Blocking read of the next frame header, unless a request comes first (False)."""
        if self._requested.is_set():
            return False
        fill = asyncio.ensure_future(reader.fill(FIXED_FRAME_HEADER_LENGTH))
        requested = asyncio.ensure_future(self._requested.wait())
        try:
            await asyncio.wait({fill, requested}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            requested.cancel()
            if not fill.done():
                fill.cancel()
            # Let a cancelled read unwind (and drop its RPC) before going on.
            await asyncio.wait({fill})
        if fill.cancelled():
            return False
        fill.result()  # Raises what the read raised.
        return True

    async def _inject_noop(self, fsm: FSM, author: int) -> int:
        """Append the hand-off no-op and fence; returns the append's end offset."""
        noop = rpb.RecordedOp(seq_no=fsm.next_seq_no, checksum=fsm.next_checksum, author=author)
        resp = await append_to_log(
            self.client,
            self.hints.log,
            encode_fixed_frame(noop.SerializeToString()),
            union_registers=Author(author).fence(),
        )
        log.info(
            "injected recovery log hand-off",
            extra={"log": self.hints.log, "author": author, "end": resp.commit.end},
        )
        return resp.commit.end

    async def _complete(self, fsm: FSM, files: dict[int, int], offset: int) -> FSM:
        await _in_thread_to_the_end(_make_live, self.directory, fsm, files)
        fsm.read_through = offset
        log.info(
            "completed recovery log playback",
            extra={
                "dir": str(self.directory),
                "log": fsm.last_log,
                "next_seq_no": fsm.next_seq_no,
                "files": len(fsm.live_nodes),
            },
        )
        return fsm

    @staticmethod
    def _desync_length(reader: _LogReader) -> int:
        """How many buffered bytes to skip at a position which is not a frame: up to the next
        magic word, else all but a suffix which may begin one."""
        at = reader.find(FIXED_FRAME_WORD, 1)
        if at != -1:
            return at
        n = reader.buffered
        tail = bytes(reader.peek(n)[max(1, n - len(FIXED_FRAME_WORD) + 1) :])
        keep = next(
            (len(tail) - i for i in range(len(tail)) if FIXED_FRAME_WORD.startswith(tail[i:])),
            0,
        )
        return n - keep

    @staticmethod
    def _skip_garbage(reader: _LogReader, n: int) -> None:
        log.warning(
            "recovery log de-synchronization: skipping bytes which are not a frame",
            extra={"log": reader.journal, "offset": reader.offset, "skipped": n},
        )
        reader.skip(n)

    async def _play_operation(
        self, reader: _LogReader, fsm: FSM, files: dict[int, int]
    ) -> tuple[rpb.RecordedOp | None, bool]:
        """Decode the op at the reader, apply it, and reenact it locally if it applied.

        Returns the op (None for bytes which are not a frame, which are skipped) and
        whether it applied.
        """
        first_offset = reader.offset
        word, size = FIXED_FRAME_HEADER.unpack_from(reader.peek(FIXED_FRAME_HEADER_LENGTH))
        if word != FIXED_FRAME_WORD or size > MAX_FRAME_LENGTH:
            self._skip_garbage(reader, self._desync_length(reader))
            return None, False
        try:
            await reader.fill(FIXED_FRAME_HEADER_LENGTH + size)
        except OffsetNotYetAvailable:
            # A header whose frame runs past the write head: appends are readable whole,
            # so this is not a recorded op either.
            self._skip_garbage(reader, self._desync_length(reader))
            return None, False
        reader.skip(FIXED_FRAME_HEADER_LENGTH)
        payload = reader.take(size)
        try:
            op = rpb.RecordedOp.FromString(payload)
        except DecodeError as exc:
            raise PlayerError(
                f"{reader.journal}:{first_offset}: frame is not a RecordedOp: {exc}"
            ) from None
        length = op.write.length if op.HasField("write") else 0
        if length < 0:
            raise PlayerError(f"{reader.journal}:{first_offset}: negative write length")
        op.first_offset = first_offset
        op.last_offset = reader.offset + length
        op.log = reader.journal

        try:
            applied = fsm.apply(op, payload)
        except FSMError as err:
            applied = False
            if (
                isinstance(err, WrongSeqNo)
                and op.seq_no > fsm.next_seq_no
                and not self.hints.live_nodes
                and (fsm.next_seq_no == 1 or self._gap is not None)
            ):
                # Without hints, every operation from the log's first (sequence number 1)
                # on must be read, in order. One beyond the next, read first in the log or
                # first after an offset jump, means the log's beginning or the skipped range
                # held operations that are gone: nothing after them could apply, and the
                # store would come back empty, or as of before the gap.
                gap = self._gap
                where = (
                    "the log's beginning"
                    if fsm.next_seq_no == 1 or gap is None
                    else f"offsets [{gap[0]}, {gap[1]})"
                )
                raise PlayerError(
                    f"{reader.journal}:{first_offset}: read an operation of sequence number "
                    f"{op.seq_no} where {fsm.next_seq_no} was expected, and there are no "
                    f"hints to start from: {where} was removed (pruned, or by retention), "
                    f"or the log continues another; possible data loss"
                ) from None
            if isinstance(err, NotHintedAuthor) or (
                isinstance(err, WrongSeqNo) and op.seq_no < fsm.next_seq_no
            ):
                pass  # Dead branches, duplicates, or ops before a lower-bound offset.
            else:
                log.info(
                    "did not apply recovery log operation",
                    extra={"log": op.log, "offset": first_offset, "error": str(err)},
                )

        if applied:
            self._gap = None
        # Local effects follow the FSM's reading of the op: create, link, unlink, write.
        directory = self.directory
        is_create = op.HasField("create")
        is_unlink = not is_create and not op.HasField("link") and op.HasField("unlink")
        is_write = (
            not is_create
            and not op.HasField("link")
            and not op.HasField("unlink")
            and op.HasField("write")
        )
        if applied and is_create:
            fd = os.open(
                _staged_path(directory, op.seq_no), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666
            )
            files[op.seq_no] = fd
        elif applied and is_unlink:
            fnode = op.unlink.fnode
            if fnode not in fsm.live_nodes:  # Its last link is gone.
                os.close(files.pop(fnode))
                _staged_path(directory, fnode).unlink()
        if length:
            if applied and is_write:
                fd = files[op.write.fnode]
                base = op.write.offset
                await reader.copy(length, lambda view, at: _pwrite_all(fd, view, base + at))
            else:
                await reader.copy(length, None)  # Keep the byte stream in step.
        return op, applied
