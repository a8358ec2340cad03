"""`SourceReaders`: a primary shard's read-committed reading of all its source journals,
merged into one queue of batches.

Each source journal is read by its own task through `ReadCommitted` and its own Sequencer,
restored from the shard's checkpoint (offsets and producer states), so duplicates are
dropped and only committed messages come out. Every queued batch carries the journal's
read-through offset and producer states *as of that batch*: a transaction that consumes the
batch checkpoints exactly that, however far the reader has run ahead. ACKs are included (they
advance the offsets a transaction checkpoints; the transaction does not hand them to the
application). A decode error ends the journal's reading with the error queued, so that the
shard fails on it rather than skip data.

The queue is bounded by messages, as Gazette's read channel is: a reader queues its next
batch only while fewer than `queue_messages` envelopes wait (a batch larger than that is
queued once the queue is empty). Reading ahead further gains nothing — readers and the
transaction loop share one thread — and every message queued is an object that outlives
the young GC generations, which makes the collector's full passes frequent and long.
Take batches with `get` / `get_nowait`, which release their room.

Batches hold at most `batch_messages` messages (a large read is sequenced that many at a
time, each batch with its own exact checkpoint): with the bounded queue this lets a
transaction close (nothing is ready) while the readers still have content to deliver, so
that the next transaction pipelines with its commit, as Gazette's message-at-a-time loop
does. A transaction reaching `max_txn_duration` within a batch closes there, between two
messages, as Gazette's does: each batch keeps a copy of its journal's sequencer as it was
before it (or before the few batches it links to, sharing their copy) and the
read-uncommitted envelopes they sequenced, from which `checkpoint_within` has the
checkpoint as of any of its messages (the rest of the batch goes to the next transaction).

A batch may be empty: a read that committed nothing is queued as such, with its read-through
offset and the sequencer's `begun` and `newest_open`: one that began a producer's
transaction (uncommitted messages), so that a transaction knows it awaits an ACK (Gazette's
wait-for-ACK); one of only duplicates or rolled-back messages, so that the shard's progress
covers them (Gazette's txnRead).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pygazette.client.journal_client import JournalClient
from pygazette.message.envelope import Envelope, ProducerState
from pygazette.message.framing import Framing
from pygazette.message.reader import ReadCommitted
from pygazette.message.sequencer import QueueOutcome, Sequencer
from pygazette.protocol.pb import consumer_pb2 as cpb

log = logging.getLogger(__name__)

__all__ = ["SourceBatch", "SourceReaders"]

# Producers silent this long (by their clocks) are dropped from checkpoints, as Gazette does.
PRUNE_HORIZON_NS = 24 * 3600 * 1_000_000_000


# Inputs sequenced again at most by `checkpoint_within` before a batch's own (a new copy of
# the sequencer is taken once the batches since the last copy sequenced this many).
RESEQUENCE_SPAN = 1024


@dataclass(frozen=True, slots=True)
class _Prior:
    """A batch read since the sequencer's copy (`SourceBatch.before`) and before the batch
    that links to it: its inputs and replays, and the one before it (None: the first)."""

    prev: _Prior | None
    inputs: tuple[list[Envelope], ...]
    replays: tuple[tuple[int, int, bytes, list[Envelope]], ...]


@dataclass(slots=True)
class SourceBatch:
    journal: str
    envelopes: list[Envelope] = field(default_factory=list)
    read_through: int = 0
    states: list[ProducerState] = field(default_factory=list)
    error: BaseException | None = None
    ended: bool = False  # The journal's reading ended.
    # The journal's Sequencer as of the batch: transactions of producers begun so far, and
    # when the newest one still awaiting its ACK began (`Sequencer.newest_open`).
    begun: int = 0
    newest_open: int = 0
    # The end of the last duplicate or rolled-back message read (`Sequencer.dropped_through`).
    dropped_through: int = 0
    # What sequences the batch again, to checkpoint part of it (`checkpoint_within`): a
    # copy of the journal's sequencer as it was before `prior` (the batches read since that
    # copy was taken, sequenced again first) and the batch, the read-uncommitted envelopes it
    # sequenced into the batch (in chunks), and the transactions it read again meanwhile
    # (begin, end, producer, its envelopes); None where unknown. A copy is shared by the
    # batches of `RESEQUENCE_SPAN` inputs: one for each would hold a copy of the ring (two
    # lists of its slots, 64 KiB at 4,096) per queued batch, and a tailing reader's batches
    # are one append each.
    before: Sequencer | None = None
    inputs: tuple[list[Envelope], ...] | None = None
    replays: tuple[tuple[int, int, bytes, list[Envelope]], ...] = ()
    prior: _Prior | None = None
    # Messages of the batch consumed by an earlier transaction (`envelopes` are the rest).
    preceding: int = 0


class SourceReaders:
    def __init__(
        self,
        client: JournalClient,
        sources: Sequence[cpb.ShardSpec.Source],
        offsets: Mapping[str, int],
        states: Mapping[str, list[ProducerState]],
        framings: Mapping[str, Framing | None],
        *,
        ring_size: int = 4096,
        queue_messages: int = 4096,
        batch_messages: int = 1024,
    ) -> None:
        self.client = client
        self.sources = list(sources)
        self.offsets = dict(offsets)
        self.states = {j: list(s) for j, s in states.items()}
        self.framings = dict(framings)
        self.ring_size = ring_size
        self.queue_messages = max(1, queue_messages)
        self.batch_messages = max(1, batch_messages)
        # Unbounded itself: `_put` bounds it by messages.
        self.queue: asyncio.Queue[SourceBatch] = asyncio.Queue()
        self._queued = 0  # Envelopes in queued batches.
        self._room = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def get(self) -> SourceBatch:
        """The next batch, waiting for one."""
        return self._took(await self.queue.get())

    def get_nowait(self) -> SourceBatch:
        """The next batch if one is queued (asyncio.QueueEmpty otherwise)."""
        return self._took(self.queue.get_nowait())

    def _took(self, batch: SourceBatch) -> SourceBatch:
        self._queued -= max(1, len(batch.envelopes))
        self._room.set()
        return batch

    async def _put(self, batch: SourceBatch) -> None:
        weight = max(1, len(batch.envelopes))
        while self._queued and self._queued + weight > self.queue_messages:
            self._room.clear()
            await self._room.wait()
        self._queued += weight
        self.queue.put_nowait(batch)

    def start_offset(self, source: cpb.ShardSpec.Source) -> int:
        """Where reading of a source starts: its checkpoint offset, at least `min_offset`."""
        return max(self.offsets.get(source.journal, 0), source.min_offset)

    def start(self) -> None:
        for source in self.sources:
            self._tasks.append(
                asyncio.create_task(self._read(source), name=f"source:{source.journal}")
            )

    async def _read(self, source: cpb.ShardSpec.Source) -> None:
        journal = source.journal
        offset = self.start_offset(source)
        sequencer = Sequencer(
            {journal: offset}, self.states.get(journal, []), buffer=self.ring_size
        )
        reader = ReadCommitted(
            self.client,
            journal,
            sequencer=sequencer,
            framing=self.framings.get(journal),
            offset=offset,
            block=True,
            include_acks=True,
        )
        before = _copy(sequencer)
        prior: _Prior | None = None
        since = 0  # Inputs of `prior`.
        async with reader:
            while True:
                try:
                    batch = await reader.next_batch(self.batch_messages, wake_on_read=True)
                except StopAsyncIteration:
                    await self._put(SourceBatch(journal, ended=True))
                    return
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    await self._put(SourceBatch(journal, error=exc))
                    return
                offsets, states = sequencer.checkpoint(PRUNE_HORIZON_NS)
                read_through = offsets.get(journal, offset)
                inputs = None if reader.batch_inputs is None else tuple(reader.batch_inputs)
                replays = tuple(reader.batch_replays)
                await self._put(
                    SourceBatch(
                        journal,
                        batch,
                        read_through,
                        states,
                        begun=sequencer.begun,
                        newest_open=sequencer.newest_open(),
                        dropped_through=sequencer.dropped_through.get(journal, 0),
                        before=before,
                        inputs=inputs,
                        replays=replays,
                        prior=prior,
                    )
                )
                if inputs is not None and before is not None:
                    since += sum(len(chunk) for chunk in inputs)
                if inputs is None or before is None or since >= RESEQUENCE_SPAN:
                    before, prior, since = _copy(sequencer), None, 0
                else:
                    prior = _Prior(prior, inputs, replays)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()


def checkpoint_within(batch: SourceBatch, index: int) -> tuple[int, list[ProducerState]] | None:
    """The journal's read-through offset and producer states once the messages of `batch`
    before `envelopes[index]` (ACKs included) are consumed: the checkpoint of a transaction
    closed between two of its messages, as Gazette's closes between any two. A copy of the
    sequencer as it was before the batch (or before its `prior` batches, sequenced again
    first) sequences its inputs again and stops there: between
    two inputs, or between two messages one ACK commits (the producer's clock is then the
    last consumed one's, and the rest are read again on recovery, as Gazette's sequencer
    checkpoints them). None where that cannot be had."""
    if batch.before is None or batch.inputs is None:
        return None
    journal = batch.journal
    seq = batch.before.copy()  # The batch's own stays as it was (its rest may split again).
    rest, preceding = batch.envelopes, batch.preceding
    wanted = preceding + index
    replays = iter(batch.replays)
    done = 0
    priors: list[_Prior] = []
    link = batch.prior
    while link is not None:
        priors.append(link)
        link = link.prev
    try:
        for link in reversed(priors):
            # As the source reader sequenced it (and checkpointed after it).
            if not _sequence_again(seq, link):
                return None
            seq.checkpoint(PRUNE_HORIZON_NS)
        for chunk in batch.inputs:
            for env in chunk:
                if done == wanted:
                    return _checkpoint_of(seq, journal)
                if seq.queue_uncommitted(env) == QueueOutcome.ACK_COMMIT_REPLAY:
                    # The reader read it again at this point: the same envelopes.
                    replay = next(replays, None)
                    if replay is None or replay[:3] != (
                        *seq.replay_range()[1:],
                        seq.replay_producer(),
                    ):
                        return None
                    seq.start_replay(replay[3])
                while seq.step():
                    if done == wanted:
                        return _checkpoint_of(seq, journal)  # Within one commit's messages.
                    at = done - preceding
                    if at >= len(rest) or (at >= 0 and seq.dequeued is not rest[at]):
                        return None  # Not the batch as it was sequenced.
                    done += 1
    except (RuntimeError, AssertionError):  # ReplayError too: not as it was sequenced.
        return None
    return _checkpoint_of(seq, journal) if done == wanted else None


def _sequence_again(seq: Sequencer, link: _Prior) -> bool:
    """Sequence a batch's inputs again on `seq`, as they were sequenced (its replays read
    where they were); False if they don't sequence as they did."""
    replays = iter(link.replays)
    out: list[Envelope] = []
    for chunk in link.inputs:
        i, n = 0, len(chunk)
        while i < n:
            i = seq.sequence(chunk, i, out)
            if seq.dequeuing:
                replay = next(replays, None)
                if replay is None or replay[:3] != (
                    *seq.replay_range()[1:],
                    seq.replay_producer(),
                ):
                    return False
                seq.start_replay(replay[3])
                while seq.step():
                    pass
            out.clear()
    return next(replays, None) is None


def _copy(sequencer: Sequencer) -> Sequencer | None:
    try:
        return sequencer.copy()
    except RuntimeError:  # Dequeuing (a sequence resumed after a failed replay).
        return None


def _checkpoint_of(seq: Sequencer, journal: str) -> tuple[int, list[ProducerState]]:
    offsets, states = seq.checkpoint(PRUNE_HORIZON_NS)
    return offsets[journal], states
