"""`Recorder`: records the file operations of a local directory into a recovery log.

A store tells the recorder what it did to its files (create, write, link, unlink,
property); each call sequences one or more `RecordedOp`s through the FSM and buffers their
frames (a Write op is followed by its data, as Gazette lays it out). Nothing reaches the log
until `commit()`, which appends everything buffered as one journal append, so that a store
transaction is atomic in the log. Commits are appended one at a time, in the order they were
called. Recorded data is held in memory until its commit.

Every append checks the journal register fence of the recorder's author (`Author.fence`).
The author's fence is put in place by the player which handed the log off to it
(`Player.inject_handoff`); when a later player hands the log off to another author, the
fence is replaced, the deposed recorder's next commit is refused by the broker
(REGISTER_MISMATCH), and it raises `RecorderFenced`. A recorder whose commit failed for any
reason is unusable afterwards: its FSM has moved past operations the log doesn't hold.

Offsets: recorded ops cannot know where their append will land, so, as in Gazette, an op's
`first_offset` is a lower bound, the end offset of the last append this recorder saw commit
(initially the FSM's `read_through`, as left by the player), and its `last_offset` is
unknown (zero). Hints built from a recorder therefore name lower-bound offsets, which
players read from and skip what precedes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import posixpath
from collections import deque
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pygazette.client.journal_client import JournalClient
from pygazette.consumer.recoverylog.fsm import FSM, Author, FnodeNotTracked, HintsSnapshot
from pygazette.consumer.recoverylog.log_append import append_to_log
from pygazette.message.fixed_framing import encode_fixed_frame
from pygazette.protocol.errors import GazetteError, RegisterMismatch
from pygazette.protocol.pb import recoverylog_pb2 as rpb

log = logging.getLogger(__name__)

__all__ = [
    "Recorder",
    "RecorderError",
    "RecorderFailed",
    "RecorderFenced",
    "normalize_path",
]

BytesLike = bytes | bytearray | memoryview


class RecorderError(GazetteError):
    """The recorder can record no more (see `RecorderFenced`, `RecorderFailed`)."""


class RecorderFenced(RecorderError):
    """Another author took over the recovery log: this recorder may append nothing more."""


class RecorderFailed(RecorderError):
    """A commit failed (or was cancelled) and its operations may not be in the log; the
    recorder's FSM no longer matches the log, so it can record no more."""


def normalize_path(root: str, path: str | os.PathLike[str]) -> str:
    """`path` (relative to `root`, or absolute under it) as recorded: clean, '/'-rooted.

    Raises `ValueError` for the root itself or a path outside it.
    """
    text = os.fspath(path).replace(os.sep, "/")
    if posixpath.isabs(text):
        rel = posixpath.relpath(posixpath.normpath(text), root)
    else:
        rel = posixpath.normpath(text)
    if rel in (".", "") or rel == ".." or rel.startswith("../"):
        raise ValueError(f"path {os.fspath(path)!r} is not a file under {root!r}")
    return "/" + rel


@dataclass(slots=True)
class _Txn:
    """Buffered operations on their way into the log as one append."""

    data: bytes
    # Hints of the FSM just after this transaction's operations, taken only if later
    # operations were recorded before it committed.
    after: HintsSnapshot | None = None


class Recorder:
    """Records file operations under `root_dir` into the recovery log `journal`.

    `fsm` is the state of the log as the recorder takes it over (usually `Player.fsm`
    after `Player.inject_handoff(author)`); the recorder advances it with every operation.
    `journal` defaults to `fsm.last_log`. If it names another log, the recorder first
    records a no-op and its first commit places its fence (rather than checking it), as
    Gazette's recorder does when a log is forked.

    Methods are not thread-safe: call them from the event loop which runs `commit`.
    """

    def __init__(
        self,
        client: JournalClient,
        fsm: FSM,
        author: int,
        root_dir: str | os.PathLike[str],
        *,
        journal: str | None = None,
    ) -> None:
        if fsm.has_remaining_hints():
            raise ValueError("the FSM still has hints to play: finish playback first")
        if not 0 < author <= 0xFFFFFFFF:
            raise ValueError(f"author must be a nonzero uint32, not {author}")
        self.client = client
        self.fsm = fsm
        self.author = Author(author)
        self.root = Path(root_dir).absolute()
        self.journal = journal or fsm.last_log
        self._root_text = posixpath.normpath(os.fspath(self.root).replace(os.sep, "/"))

        self._check_registers = self.author.fence_selector()
        self._union_first = False
        # Lower bound of the offset of everything recorded from now on.
        self._write_head = fsm.read_through if fsm.last_log == self.journal else 0

        self._buf = bytearray()
        self._pending: deque[_Txn] = deque()
        # Hints of the last committed state, whenever the FSM is ahead of it.
        self._committed: HintsSnapshot | None = None
        self._last_commit: asyncio.Future[None] | None = None
        self._failure: RecorderError | None = None

        if fsm.last_log != self.journal:
            # Recording into another log than the FSM was recovered from: sequence a no-op
            # in the new log, whose append also fences the log to this author.
            self._process(rpb.RecordedOp())
            self._union_first = True

    # Inspection. --------------------------------------------------------------------------

    @property
    def write_head(self) -> int:
        """End offset of the last commit this recorder saw (a lower bound of the head)."""
        return self._write_head

    @property
    def buffered_bytes(self) -> int:
        """Bytes recorded and not yet handed to a commit."""
        return len(self._buf)

    @property
    def failed(self) -> RecorderError | None:
        """Why the recorder can record no more, if it can't."""
        return self._failure

    def fnode_of(self, path: str | os.PathLike[str]) -> int | None:
        """The fnode linked at `path`, if any."""
        return self.fsm.links.get(self._normalize(path))

    # Recording. ---------------------------------------------------------------------------

    def record_create(self, path: str | os.PathLike[str]) -> int:
        """Record the creation (or truncation) of the file at `path`; returns its new fnode.

        A file already linked at `path` is unlinked first, as opening with O_TRUNC would.
        """
        self._check_usable()
        rel = self._normalize(path)
        existing = self.fsm.links.get(rel)
        if existing is not None:
            self._process(rpb.RecordedOp(unlink=rpb.RecordedOp.Link(fnode=existing, path=rel)))
        self._process(rpb.RecordedOp(create=rpb.RecordedOp.Create(path=rel)))
        return self.fsm.links[rel]

    def record_write(self, fnode: int, offset: int, data: BytesLike) -> None:
        """Record `data` written at `offset` of `fnode` (the bytes are copied)."""
        self._check_usable()
        self._require_live(fnode)
        if offset < 0:
            raise ValueError(f"invalid file offset {offset}")
        view = memoryview(data).cast("B")
        self._process(
            rpb.RecordedOp(write=rpb.RecordedOp.Write(fnode=fnode, offset=offset, length=len(view)))
        )
        self._buf += view

    def record_link(self, fnode: int, path: str | os.PathLike[str]) -> None:
        """Record a new link (hard link) of `fnode` at `path`, which must not exist."""
        self._check_usable()
        self._require_live(fnode)
        rel = self._normalize(path)
        self._process(rpb.RecordedOp(link=rpb.RecordedOp.Link(fnode=fnode, path=rel)))

    def record_unlink(self, fnode: int, path: str | os.PathLike[str]) -> None:
        """Record the removal of `fnode`'s link at `path` (the last link deletes the file)."""
        self._check_usable()
        self._require_live(fnode)
        rel = self._normalize(path)
        self._process(rpb.RecordedOp(unlink=rpb.RecordedOp.Link(fnode=fnode, path=rel)))

    def record_remove(self, path: str | os.PathLike[str]) -> None:
        """Record the removal of the file linked at `path`."""
        fnode = self.fnode_of(path)
        if fnode is None:
            raise FnodeNotTracked(f"no file at {os.fspath(path)!r}")
        self.record_unlink(fnode, path)

    def record_rename(self, src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        """Record the rename of the file at `src` to `dst`, replacing any file at `dst`.

        As rename(2), nothing changes if both paths are links of the same file.
        """
        self._check_usable()
        src_rel, dst_rel = self._normalize(src), self._normalize(dst)
        fnode = self.fsm.links.get(src_rel)
        if fnode is None:
            raise FnodeNotTracked(f"no file at {os.fspath(src)!r}")
        if self.fsm.links.get(dst_rel) == fnode:
            return  # Links of the same file (or one path): rename(2) does nothing.
        replaced = self.fsm.links.get(dst_rel)
        if replaced is not None:
            self._process(rpb.RecordedOp(unlink=rpb.RecordedOp.Link(fnode=replaced, path=dst_rel)))
        self._process(rpb.RecordedOp(link=rpb.RecordedOp.Link(fnode=fnode, path=dst_rel)))
        self._process(rpb.RecordedOp(unlink=rpb.RecordedOp.Link(fnode=fnode, path=src_rel)))

    def record_property(self, path: str | os.PathLike[str], content: str) -> None:
        """Record the content of the property file `path` (a small file kept inline).

        Meant for a file written once (like RocksDB's IDENTITY): Gazette deprecates property
        ops, and its Player, playing from hints, may resurrect an older content of a property
        which was updated. Keep changing state (checkpoints) in regular files.
        """
        self._check_usable()
        rel = self._normalize(path)
        self._process(rpb.RecordedOp(property=rpb.Property(path=rel, content=content)))

    # Committing. --------------------------------------------------------------------------

    async def commit(self, wait_for: Sequence[Awaitable[object]] = ()) -> int:
        """Append everything recorded so far as one append, once every `wait_for` resolved.

        Returns the append's end offset (with nothing recorded, nothing is appended and the
        end offset of the last commit is returned). Commits append in call order. Raises
        `RecorderFenced` if another author took over the log; any failure (including
        cancellation) with operations pending leaves the recorder failed, and every later
        call raises.
        """
        self._check_usable()
        txn: _Txn | None = None
        if self._buf:
            txn = _Txn(bytes(self._buf))
            self._buf.clear()
            self._pending.append(txn)
        previous = self._last_commit
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._last_commit = done
        try:
            await _await_all(wait_for)
            if previous is not None and not previous.done():
                await asyncio.wait({previous})
            self._check_usable()
            if txn is None:
                return self._write_head
            union = self.author.fence() if self._union_first else None
            check = None if self._union_first else self._check_registers
            resp = await append_to_log(
                self.client,
                self.journal,
                txn.data,
                check_registers=check,
                union_registers=union,
            )
        except RegisterMismatch as exc:
            fenced = RecorderFenced(
                f"recovery log {self.journal} was handed off from author {int(self.author)}: {exc}"
            )
            self._fail(fenced)
            raise fenced from exc
        except BaseException as exc:
            if txn is not None and self._failure is None:
                self._fail(RecorderFailed(f"commit to {self.journal} failed: {exc!r}"))
            raise
        finally:
            done.set_result(None)

        commit = resp.commit
        if commit.begin < self._write_head:
            err = RecorderFailed(
                f"append to {self.journal} committed at [{commit.begin}, {commit.end}), "
                f"before the write head {self._write_head} seen earlier (broker data loss?)"
            )
            self._fail(err)
            raise err
        self._union_first = False
        self._write_head = commit.end
        if self.fsm.last_log == self.journal:
            self.fsm.read_through = max(self.fsm.read_through, commit.end)

        committed = self._pending.popleft()
        assert committed is txn, "commits complete in order"
        if not self._pending and not self._buf:
            self._committed = None  # The FSM is all committed.
        else:
            assert txn.after is not None, "recording after a drain snapshots the boundary"
            self._committed = txn.after
        return commit.end

    def build_hints(self) -> rpb.FSMHints:
        """Hints of everything committed so far (operations still buffered or being appended
        are not described)."""
        self._check_usable()
        if not self._buf and not self._pending:
            return self.fsm.build_hints(self.journal)
        assert self._committed is not None
        return self._committed.to_hints(self.journal)

    # Internals. ---------------------------------------------------------------------------

    def _normalize(self, path: str | os.PathLike[str]) -> str:
        return normalize_path(self._root_text, path)

    def _require_live(self, fnode: int) -> None:
        if fnode not in self.fsm.live_nodes:
            raise FnodeNotTracked(str(fnode))

    def _check_usable(self) -> None:
        failure = self._failure
        if failure is not None:
            raise type(failure)(str(failure)) from failure

    def _fail(self, err: RecorderError) -> None:
        if self._failure is None:
            self._failure = err
            log.warning(
                "recorder failed", extra={"journal": self.journal, "author": int(self.author)}
            )

    def _before_mutation(self) -> None:
        """Snapshot the committed state before the FSM first moves past it."""
        if self._buf:
            return  # Already past the last commit boundary.
        if not self._pending:
            self._committed = self.fsm.snapshot()
        elif self._pending[-1].after is None:
            self._pending[-1].after = self.fsm.snapshot()

    def _process(self, op: rpb.RecordedOp) -> None:
        """Sequence `op` through the FSM and buffer its frame. On error nothing changes."""
        fsm = self.fsm
        op.author = self.author
        op.seq_no = fsm.next_seq_no
        op.checksum = fsm.next_checksum
        payload = op.SerializeToString()
        # Meta fields, never written: where the op lands (a lower bound), and in which log.
        op.first_offset = self._write_head
        op.log = self.journal
        self._before_mutation()
        tracked = fsm.apply(op, payload)
        assert tracked, "recorded ops name live fnodes"
        self._buf += encode_fixed_frame(payload)

    def __repr__(self) -> str:
        return (
            f"Recorder({self.journal!r}, author={int(self.author)}, "
            f"next_seq_no={self.fsm.next_seq_no}, write_head={self._write_head})"
        )


async def _await_all(awaitables: Sequence[Awaitable[object]]) -> None:
    """Wait for every awaitable, raising the first failure; cancelling the wait leaves
    futures owned by others alone."""
    if not awaitables:
        return
    futures = [asyncio.ensure_future(a) for a in awaitables]
    owned = [f for f, a in zip(futures, awaitables, strict=True) if f is not a]
    try:
        await asyncio.wait(futures)
    except BaseException:
        for f in owned:
            f.cancel()
        raise
    for f in futures:
        f.result()
