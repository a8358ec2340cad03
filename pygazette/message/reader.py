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
from pathlib import Path
from types import TracebackType

from pygazette.client.errors import OffsetJump
from pygazette.client.journal_client import JournalClient
from pygazette.client.list_apply import get_journal
from pygazette.client.retry_reader import RetryReader
from pygazette.message.envelope import Envelope
from pygazette.message.framing import FrameDesync, Framing, MessageDecodeError, framing_for
from pygazette.message.sequencer import QueueOutcome, Sequencer
from pygazette.message.uuid import ACK_TXN, parse_uuid_text
from pygazette.protocol.errors import OffsetNotYetAvailable, Suspended
from pygazette.protocol.labels import label_value
from pygazette.protocol.validation import CONTENT_TYPE_LABEL

log = logging.getLogger(__name__)

__all__ = [
    "PartialMessage",
    "ReadCommitted",
    "ReadUncommitted",
    "framing_of_journal",
]


class PartialMessage(MessageDecodeError):
    """The journal's content ended within a message."""


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
        self._pending = b""  # Bytes of an incomplete message...
        self._base = offset  # ...which begins at this offset.
        self._ready: deque[Envelope | BaseException] = deque()
        self._done = False

    @property
    def offset(self) -> int:
        """Offset of the next message to be returned (its begin)."""
        for item in self._ready:
            if isinstance(item, Envelope):
                return item.begin
        return self._base

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
        if self.framing is None:
            self.framing = await framing_of_journal(self.client, self.journal)
        rr = self.reader
        while True:
            try:
                chunk = await rr.read()
            except OffsetJump as jump:
                self._discard_partial(f"offset jump to {jump.offset}")
                self._base = jump.offset
                log.warning(
                    "source journal offset jump",
                    extra={"journal": self.journal, "from": jump.requested, "to": jump.offset},
                )
                continue
            except (OffsetNotYetAvailable, Suspended):
                return self._end()
            if not chunk:
                return self._end()
            begin = rr.offset - len(chunk)
            if begin != self._base + len(self._pending):
                self._discard_partial(f"read continued at {begin}")
                self._base = begin
            data = self._pending + chunk if self._pending else chunk
            self._decode(data)
            if self._ready:
                return True

    def _end(self) -> bool:
        self._done = True
        if self._pending:
            size = len(self._pending)
            self._ready.append(
                PartialMessage(
                    f"content ends within a message ({size} bytes)",
                    journal=self.journal,
                    begin=self._base,
                    end=self._base + size,
                )
            )
            self._base += size
            self._pending = b""
            return True
        return False

    def _discard_partial(self, why: str) -> None:
        if self._pending:
            log.warning(
                "discarding an incomplete message",
                extra={"journal": self.journal, "begin": self._base, "why": why},
            )
            self._pending = b""

    def _decode(self, data: bytes) -> None:
        framing = self.framing
        assert framing is not None
        journal = self.journal
        ready = self._ready
        pos = self._base
        view_start = 0
        split = framing.split
        unmarshal = framing.unmarshal
        get_uuid = framing.get_uuid
        overhead = framing.overhead
        while True:
            try:
                frames, consumed = split(data[view_start:] if view_start else data)
            except FrameDesync as exc:
                ready.append(
                    MessageDecodeError(str(exc), journal=journal, begin=pos, end=pos + exc.skip)
                )
                pos += exc.skip
                view_start += exc.skip
                continue
            for payload in frames:
                end = pos + len(payload) + overhead
                try:
                    msg = unmarshal(payload)
                    text = get_uuid(msg)
                    if text is None:
                        ready.append(Envelope(journal, pos, end, msg))
                    else:
                        producer, clock, flags = parse_uuid_text(text)
                        ready.append(Envelope(journal, pos, end, msg, producer, clock, flags))
                except MessageDecodeError as exc:
                    ready.append(
                        MessageDecodeError(exc.detail, journal=journal, begin=pos, end=end)
                    )
                except ValueError as exc:  # A malformed UUID.
                    ready.append(MessageDecodeError(str(exc), journal=journal, begin=pos, end=end))
                pos = end
            view_start += consumed
            if not frames:
                break
        self._pending = data[view_start:]
        self._base = pos

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

    def __aiter__(self) -> ReadCommitted:
        return self

    async def __anext__(self) -> Envelope:
        seq = self.sequencer
        uncommitted = self.uncommitted
        include_acks = self.include_acks
        while True:
            if seq.step():
                env = seq.dequeued
                assert env is not None
                if env.flags != ACK_TXN or include_acks:
                    return env
                continue
            env = await uncommitted.__anext__()
            if seq.queue_uncommitted(env) == QueueOutcome.ACK_COMMIT_REPLAY:
                await self._replay()

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
