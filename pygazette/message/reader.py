"""Reading messages: `ReadUncommitted` (every message as it was appended) and
`ReadCommitted` (only committed messages, each once), over a RetryReader.

Messages are unpacked from the journal's byte stream with the journal's framing (from its
`content-type` label, unless given), each with its exact [begin, end) offsets; a message
split across two reads is put back together. Errors are raised where they occur and do not
end the iteration, which continues after the bad content:

- `MessageDecodeError` for a frame that does not decode (bad JSON, a malformed UUID) or, in
  fixed framing, bytes that are not a frame (de-synchronization);
- `PartialMessage` when the content ends (write head, `end_offset`) within a message.

Offset jumps (content removed by retention) are logged and read past, as Gazette does.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import AsyncGenerator
from pathlib import Path
from types import TracebackType
from typing import Any

from pygazette.client.errors import OffsetJump
from pygazette.client.journal_client import JournalClient
from pygazette.client.list_apply import get_journal
from pygazette.client.retry_reader import RetryReader
from pygazette.message.envelope import Envelope
from pygazette.message.framing import Framing, MessageDecodeError, framing_for
from pygazette.message.sequencer import Sequencer
from pygazette.message.unpacker import Unpacker
from pygazette.message.uuid import ACK_TXN
from pygazette.protocol.errors import OffsetNotYetAvailable, Suspended
from pygazette.protocol.labels import label_value
from pygazette.protocol.validation import CONTENT_TYPE_LABEL

log = logging.getLogger(__name__)

__all__ = [
    "ReadCommitted",
    "ReadUncommitted",
    "framing_of_journal",
    "read_committed",
    "read_uncommitted",
]


async def framing_of_journal(client: JournalClient, journal: str) -> Framing:
    """The framing registered for the journal's content-type label."""
    spec = await get_journal(client, journal.split(";", 1)[0])
    return framing_for(label_value(spec.labels, CONTENT_TYPE_LABEL))


class ReadUncommitted:
    """Every message of a journal from `offset`, as appended: duplicates, and messages of
    transactions that never commit, included.

    Iterate with `async for env in it`, or take whole batches with `next_batch()`. Without
    `block`, iteration ends at the write head; with `end_offset`, there.
    """

    def __init__(
        self,
        client: JournalClient,
        journal: str,
        *,
        framing: Framing | None = None,
        offset: int = 0,
        end_offset: int = 0,
        block: bool = False,
        do_not_proxy: bool = False,
        file_root: str | Path | None = None,
    ) -> None:
        self.client = client
        self.journal = journal
        self.framing = framing
        self.reader = RetryReader(
            client,
            journal,
            offset=offset,
            end_offset=end_offset,
            block=block,
            do_not_proxy=do_not_proxy,
            file_root=file_root,
        )
        self._offset = offset
        self._unpacker: Unpacker | None = None
        self._ready: deque[Envelope | BaseException] = deque()
        self._done = False

    @property
    def offset(self) -> int:
        """Offset of the next message to be returned (its begin)."""
        for item in self._ready:
            if isinstance(item, Envelope):
                return item.begin
        return self._unpacker.begin if self._unpacker is not None else self._offset

    async def __anext__(self) -> Envelope:
        ready = self._ready
        while not ready:
            if not await self._fill():
                raise StopAsyncIteration
        item = ready.popleft()
        if isinstance(item, Envelope):
            return item
        raise item

    def __aiter__(self) -> ReadUncommitted:
        return self

    async def next_batch(self) -> list[Envelope]:
        """The messages decoded from the next read (at least one); raises a pending error
        first, and StopAsyncIteration at the end."""
        ready = self._ready
        while not ready:
            if not await self._fill():
                raise StopAsyncIteration
        batch: list[Envelope] = []
        while ready:
            item = ready[0]
            if not isinstance(item, Envelope):
                if batch:
                    break
                ready.popleft()
                raise item
            batch.append(item)
            ready.popleft()
        return batch

    async def _fill(self) -> bool:
        """Read and decode more content; False at the end of the content."""
        if self._done:
            return False
        unpacker = self._unpacker
        if unpacker is None:
            if self.framing is None:
                self.framing = await framing_of_journal(self.client, self.journal)
            unpacker = self._unpacker = Unpacker(self.framing, self.journal, self._offset)
        rr = self.reader
        ready = self._ready
        while True:
            try:
                chunk = await rr.read()
            except OffsetJump as jump:
                self._restart(unpacker, jump.offset, f"offset jump to {jump.offset}")
                log.warning(
                    "source journal offset jump",
                    extra={"journal": self.journal, "from": jump.requested, "to": jump.offset},
                )
                continue
            except (OffsetNotYetAvailable, Suspended):
                return self._end(unpacker)
            if not chunk:
                return self._end(unpacker)
            begin = rr.offset - len(chunk)
            if begin != unpacker.offset:
                self._restart(unpacker, begin, f"read continued at {begin}")
            unpacker.feed(chunk, ready)
            if ready:
                return True

    def _end(self, unpacker: Unpacker) -> bool:
        self._done = True
        partial = unpacker.finish()
        if partial is None:
            return False
        self._ready.append(partial)
        return True

    def _restart(self, unpacker: Unpacker, offset: int, why: str) -> None:
        dropped = unpacker.restart(offset)
        if dropped:
            log.warning(
                "discarding an incomplete message",
                extra={"journal": self.journal, "bytes": dropped, "why": why},
            )

    async def aclose(self) -> None:
        await self.reader.aclose()

    async def __aenter__(self) -> ReadUncommitted:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class ReadCommitted:
    """The committed messages of a journal, each once, in commit order (see `Sequencer`).

    Reading starts at the sequencer's read-through offset of the journal (or `offset`), so a
    Sequencer restored from a checkpoint resumes exactly. ACK_TXN messages are sequenced but
    not returned unless `include_acks`.
    """

    def __init__(
        self,
        client: JournalClient,
        journal: str,
        *,
        sequencer: Sequencer | None = None,
        framing: Framing | None = None,
        offset: int | None = None,
        end_offset: int = 0,
        block: bool = False,
        include_acks: bool = False,
        do_not_proxy: bool = False,
        file_root: str | Path | None = None,
    ) -> None:
        self.client = client
        self.journal = journal
        self.sequencer = sequencer if sequencer is not None else Sequencer()
        if offset is None:
            offset = self.sequencer.offsets.get(journal, 0)
        self.include_acks = include_acks
        self._do_not_proxy = do_not_proxy
        self._file_root = file_root
        self.uncommitted = ReadUncommitted(
            client,
            journal,
            framing=framing,
            offset=offset,
            end_offset=end_offset,
            block=block,
            do_not_proxy=do_not_proxy,
            file_root=file_root,
        )
        self.replays = 0
        self._ready: deque[Envelope] = deque()
        # Read-uncommitted envelopes not yet sequenced (`next_batch(limit)` sequences a
        # read's envelopes `limit` at a time), and the index of the next one.
        self._pending: list[Envelope] = []
        self._pending_at = 0
        # The envelopes being sequenced, the index of the next, and the committed messages
        # so far: kept while a replay is awaited, so that a call failed or cancelled there
        # (its envelopes already taken from `_pending`, some sequenced) is resumed by the next.
        self._sequencing: tuple[list[Envelope], int, list[Envelope]] | None = None
        # The read-uncommitted envelopes the last `next_batch` sequenced, in chunks (None if
        # it resumed a sequencing begun by an earlier call): with a copy of the sequencer
        # before that call, what sequences its batch again (`SourceBatch.inputs`).
        self.batch_inputs: list[list[Envelope]] | None = []
        # And the replays it read: (begin, end, producer, the producer's envelopes).
        self.batch_replays: list[tuple[int, int, bytes, list[Envelope]]] = []

    def __aiter__(self) -> ReadCommitted:
        return self

    async def __anext__(self) -> Envelope:
        ready = self._ready
        while not ready:
            await self._fill()
        return ready.popleft()

    async def next_batch(self, limit: int = 0, *, wake_on_read: bool = False) -> list[Envelope]:
        """The committed messages sequenced from the next read (at least one). With
        `limit`, at most `limit` of the read's messages are sequenced per call (the rest wait
        for the next calls), so that the sequencer's `checkpoint()` after each call is
        exactly as of the batch returned, however large the reads. With `wake_on_read`, a
        read that commits nothing yet is read through returns an empty batch: it begins or
        extends a producer's transaction (the reader can then know it awaits an ACK), or
        holds only duplicates or rolled-back messages (the reader can then know it read
        through them)."""
        ready = self._ready
        seq, journal = self.sequencer, self.journal
        self.batch_inputs = [] if self._sequencing is None and not ready else None
        self.batch_replays = []
        while not ready:
            read_through = seq.offsets.get(journal)
            await self._fill(limit)
            if wake_on_read and not ready and seq.offsets.get(journal) != read_through:
                return []
        batch = list(ready)
        ready.clear()
        return batch

    async def _fill(self, limit: int = 0) -> None:
        """Sequence read-uncommitted messages: the rest of the last read, or the next read
        (StopAsyncIteration at the end; decode errors pass through); at most `limit` of
        them, if set."""
        seq = self.sequencer
        if self._sequencing is None:
            if self._pending_at >= len(self._pending):
                self._pending = await self.uncommitted.next_batch()
                self._pending_at = 0
            batch, start = self._pending, self._pending_at
            if limit > 0 and len(batch) - start > limit:
                batch = batch[start : start + limit]
                self._pending_at += limit
            elif start:
                batch = batch[start:]
                self._pending_at = len(self._pending)
            else:
                self._pending_at = len(batch)
            self._sequencing = (batch, 0, [])
            if self.batch_inputs is not None:
                self.batch_inputs.append(batch)
        batch, i, out = self._sequencing
        n = len(batch)
        while True:
            if seq.dequeuing:  # An ACK whose transaction must be replayed.
                await self._replay()
                while seq.step():
                    out.append(seq.dequeued)  # type: ignore[arg-type]
            if i >= n:
                break
            i = seq.sequence(batch, i, out)
            self._sequencing = (batch, i, out)
        self._sequencing = None
        if self.include_acks:
            self._ready.extend(out)
        else:
            self._ready.extend(e for e in out if e.flags != ACK_TXN)

    async def _replay(self) -> None:
        journal, begin, end = self.sequencer.replay_range()
        producer = self.sequencer.replay_producer()
        self.replays += 1
        log.info(
            "replaying a transaction larger than the sequencer's ring",
            extra={"journal": journal, "begin": begin, "end": end},
        )
        envelopes: list[Envelope] = []
        replay = ReadUncommitted(
            self.client,
            journal,
            framing=self.uncommitted.framing,
            offset=begin,
            end_offset=end,
            do_not_proxy=self._do_not_proxy,
            file_root=self._file_root,
        )
        async with replay:
            while True:
                try:
                    env = await replay.__anext__()
                except StopAsyncIteration:
                    break
                except MessageDecodeError:
                    continue  # Raised once already, when first read.
                if env.producer == producer:
                    envelopes.append(env)
        self.batch_replays.append((begin, end, producer, envelopes))
        self.sequencer.start_replay(envelopes)

    async def aclose(self) -> None:
        await self.uncommitted.aclose()

    async def __aenter__(self) -> ReadCommitted:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


async def read_committed(
    client: JournalClient, journal: str, **options: Any
) -> AsyncGenerator[Envelope, None]:
    """The committed messages of a journal (see `ReadCommitted` for the options). For
    synchronous code: `sync_client.iterate(read_committed(sync_client.client, journal))`."""
    async with ReadCommitted(client, journal, **options) as it:
        async for env in it:
            yield env


async def read_uncommitted(
    client: JournalClient, journal: str, **options: Any
) -> AsyncGenerator[Envelope, None]:
    """Every message of a journal as appended (see `ReadUncommitted` for the options)."""
    async with ReadUncommitted(client, journal, **options) as it:
        async for env in it:
            yield env
