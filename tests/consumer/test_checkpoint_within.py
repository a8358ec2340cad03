"""`checkpoint_within`: the checkpoint of a transaction closed between two messages of a
source batch (at max_txn_duration, as Gazette's closes between any two). Property: for any
journal of producers that commit, abort, retry and interleave, read in batches as the source
readers read it (sequencer rings small enough to need replays), a checkpoint taken before
any message of any batch resumes exactly: the messages consumed before it and those a
sequencer restored from it reads are every committed message, once, in order."""

from __future__ import annotations

import asyncio
import dataclasses
import tracemalloc
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pygazette.consumer import source_reader
from pygazette.consumer.source_reader import (
    PRUNE_HORIZON_NS,
    SourceBatch,
    SourceReaders,
    _Prior,
    checkpoint_within,
)
from pygazette.message import ACK_TXN, Envelope, Sequencer
from pygazette.message.uuid import CONTINUE_TXN
from pygazette.protocol.pb import consumer_pb2 as cpb
from tests.message.test_sequencer import J, _events, _read_committed, _simulate


def _batches(journal: list[Envelope], ring: int, size: int, span: int = 1) -> list[SourceBatch]:
    """The journal read as `SourceReaders` reads it: inputs `size` at a time, each batch
    with a copy of the sequencer taken before it or before the batches linked as its prior
    (a new one once they hold `span` inputs), its inputs and the replays read for it, and
    the sequencer checkpointed after it."""
    seq = Sequencer({J: 0}, buffer=ring)  # As a source reader's, from offset 0.
    batches = []
    before, prior, since = seq.copy(), None, 0
    for at in range(0, len(journal), size):
        chunk = journal[at : at + size]
        out: list[Envelope] = []
        replays = []
        i = 0
        while i < len(chunk):
            i = seq.sequence(chunk, i, out)
            if seq.dequeuing:
                _, begin, end = seq.replay_range()
                producer = seq.replay_producer()
                envs = [
                    e
                    for e in journal
                    if begin <= e.begin and e.end <= end and e.producer == producer
                ]
                replays.append((begin, end, producer, envs))
                seq.start_replay(envs)
                while seq.step():
                    assert seq.dequeued is not None
                    out.append(seq.dequeued)
        offsets, states = seq.checkpoint(PRUNE_HORIZON_NS)
        batches.append(
            SourceBatch(
                J,
                out,
                offsets.get(J, 0),
                states,
                before=before,
                inputs=(chunk,),
                replays=tuple(replays),
                prior=prior,
            )
        )
        since += len(chunk)
        if since >= span:
            before, prior, since = seq.copy(), None, 0
        else:
            prior = _Prior(prior, (chunk,), tuple(replays))
    return batches


def _messages(envs: list[Envelope]) -> list[str]:
    return [e.message for e in envs if e.flags != ACK_TXN]


@settings(max_examples=300, deadline=None)
@given(
    events=_events,
    ring=st.integers(0, 8),
    size=st.integers(1, 12),
    span=st.integers(1, 40),
    data=st.data(),
)
def test_a_checkpoint_within_a_batch_resumes_exactly(
    events: list[tuple[int, str, int]], ring: int, size: int, span: int, data: st.DataObject
) -> None:
    journal, _ = _simulate(events, ring)
    expect = _read_committed(journal, Sequencer(buffer=ring))
    batches = _batches(journal, ring, size, span)
    if not batches:
        return
    b = data.draw(st.integers(0, len(batches) - 1))
    batch = batches[b]
    index = data.draw(st.integers(0, len(batch.envelopes)))
    within = checkpoint_within(batch, index)
    assert within is not None
    offset, states = within

    consumed = [e for earlier in batches[:b] for e in earlier.envelopes] + batch.envelopes[:index]
    start = next((i for i, e in enumerate(journal) if e.begin >= offset), len(journal))
    rest = _read_committed(journal, Sequencer({J: offset}, states, ring), start)
    assert _messages(consumed) + rest == expect

    # The rest of the batch, carried to the next transaction, splits the same way again.
    more = data.draw(st.integers(0, len(batch.envelopes) - index))
    carried = dataclasses.replace(batch, envelopes=batch.envelopes[index:], preceding=index)
    assert checkpoint_within(carried, more) == checkpoint_within(batch, index + more)


class _OneAtATime:
    """A source's ReadCommitted tailing a journal appended one transactional message at a
    time (a CONTINUE_TXN, then its ACK): each read, so each batch, is one envelope."""

    def __init__(self, _client: Any, journal: str, *, sequencer: Sequencer, **_: Any) -> None:
        self.sequencer = sequencer
        self.batch_inputs: list[list[Envelope]] | None = []
        self.batch_replays: list[tuple[int, int, bytes, list[Envelope]]] = []
        producer = b"\x01\x02\x03\x04\x05\x06"
        self._envs = iter(
            Envelope(journal, at * 10, at * 10 + 10, str(at), producer, 16 * (at + 1), flag)
            for at in range(_TAILED)
            for flag in [CONTINUE_TXN if at % 2 == 0 else ACK_TXN]
        )

    async def __aenter__(self) -> _OneAtATime:
        return self

    async def __aexit__(self, *_: Any) -> None:
        pass

    async def next_batch(self, limit: int = 0, *, wake_on_read: bool = False) -> list[Envelope]:
        env = next(self._envs, None)
        if env is None:
            await asyncio.Event().wait()  # Tailing: nothing more is appended.
        assert env is not None
        out: list[Envelope] = []
        self.sequencer.sequence([env], 0, out)
        self.batch_inputs, self.batch_replays = [[env]], []
        return out


_TAILED = 2_000


async def test_batches_read_ahead_cost_memory_of_their_messages_not_of_the_ring(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A shard's read-ahead queue of batches (a tailing reader's are one append each) holds
    what re-sequences them for `checkpoint_within`, but not a copy of the sequencer's ring
    for each: 2,000 one-message batches of a transactional producer held 2,000 copies of a
    4,096-slot ring (64 KiB each, 128 MiB) before."""
    monkeypatch.setattr(source_reader, "ReadCommitted", _OneAtATime)
    filled = asyncio.Event()

    class _Readers(SourceReaders):
        async def _put(self, batch: SourceBatch) -> None:
            await super()._put(batch)
            if self.queue.qsize() >= _TAILED:
                filled.set()

    readers = _Readers(
        None,  # type: ignore[arg-type]
        [cpb.ShardSpec.Source(journal=J)],
        {},
        {},
        {J: None},
        queue_messages=100_000,
    )
    tracemalloc.start()
    try:
        readers.start()
        await asyncio.wait_for(filled.wait(), 60)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await readers.close()
    assert held / _TAILED < 4096, f"{held / _TAILED:.0f} bytes a batch"
    # And the batches still checkpoint within themselves: as of all of a batch's messages,
    # as the source reader checkpointed it.
    batches = [readers.queue.get_nowait() for _ in range(_TAILED)]
    for batch in batches[-4:]:
        if batch.envelopes:  # An ACK's: its transaction's messages, and the ACK.
            assert checkpoint_within(batch, len(batch.envelopes)) == (
                batch.read_through,
                batch.states,
            )
