"""`checkpoint_within`: the checkpoint of a transaction closed between two messages of a
source batch (at max_txn_duration, as Gazette's closes between any two). Property: for any
journal of producers that commit, abort, retry and interleave, read in batches as the source
readers read it (sequencer rings small enough to need replays), a checkpoint taken before
any message of any batch resumes exactly: the messages consumed before it and those a
sequencer restored from it reads are every committed message, once, in order."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from pygazette.consumer.source_reader import PRUNE_HORIZON_NS, SourceBatch, checkpoint_within
from pygazette.message import ACK_TXN, Envelope, Sequencer
from tests.message.test_sequencer import J, _events, _read_committed, _simulate


def _batches(journal: list[Envelope], ring: int, size: int) -> list[SourceBatch]:
    """The journal read as `SourceReaders` reads it: inputs `size` at a time, each batch
    with a copy of the sequencer before it, its inputs and the replays read for it, and the
    sequencer checkpointed after it."""
    seq = Sequencer({J: 0}, buffer=ring)  # As a source reader's, from offset 0.
    batches = []
    for at in range(0, len(journal), size):
        chunk = journal[at : at + size]
        before = seq.copy()
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
            )
        )
    return batches


def _messages(envs: list[Envelope]) -> list[str]:
    return [e.message for e in envs if e.flags != ACK_TXN]


@settings(max_examples=300, deadline=None)
@given(
    events=_events,
    ring=st.integers(0, 8),
    size=st.integers(1, 12),
    data=st.data(),
)
def test_a_checkpoint_within_a_batch_resumes_exactly(
    events: list[tuple[int, str, int]], ring: int, size: int, data: st.DataObject
) -> None:
    journal, _ = _simulate(events, ring)
    expect = _read_committed(journal, Sequencer(buffer=ring))
    batches = _batches(journal, ring, size)
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
