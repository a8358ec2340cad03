"""The Sequencer against the cases of Gazette's own sequencer tests (outcomes, dequeued
sequences, replay ranges, checkpoints), plus properties: duplicates never surface, and a
restored checkpoint resumes exactly."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pygazette.message import (
    ACK_TXN,
    CONTINUE_TXN,
    OUTSIDE_TXN,
    Envelope,
    ProducerState,
    QueueOutcome,
    ReplayError,
    Sequencer,
    new_producer_id,
)

Q = QueueOutcome
J = "test/journal"


class Gen:
    """Envelopes 100 bytes long, 2 bytes apart (the sequencer must not assume contiguity)."""

    def __init__(self) -> None:
        self.offset = 0

    def __call__(self, producer: bytes, clock: int, flags: int) -> Envelope:
        env = Envelope(J, self.offset, self.offset + 100, f"{clock}", producer, clock, flags)
        self.offset += 102
        return env


def queue(seq: Sequencer, *envs: Envelope) -> list[QueueOutcome]:
    return [seq.queue_uncommitted(e) for e in envs]


def expect_deque(seq: Sequencer, *expect: Envelope) -> None:
    for i, env in enumerate(expect):
        assert seq.step()
        assert seq.dequeued is env
        emit = seq._emit
        assert emit is not None and emit.begin == env.begin
        if i > 0:
            assert emit.min_clock == expect[i - 1].clock
    assert not seq.step()
    assert seq.dequeued is None
    last = expect[-1]
    if last.clock:
        p = seq._partials[(last.journal, last.producer)]
        assert (p.min_clock, p.max_clock, p.begin, p.ring_start, p.ring_stop) == (
            last.clock,
            last.clock,
            -1,
            -1,
            -1,
        )
    assert seq.offsets[last.journal] == last.end


def expect_replay(seq: Sequencer, begin: int, end: int, *envs: Envelope) -> None:
    assert seq.replay_range() == (envs[0].journal, begin, end)
    seq.start_replay(iter(envs))


def partial(seq: Sequencer, producer: bytes) -> tuple[int, int, int, int, int]:
    p = seq._partials[(J, producer)]
    return p.begin, p.ring_start, p.ring_stop, p.min_clock, p.max_clock


def test_ring_is_allocated_by_the_first_transactional_message() -> None:
    # Thousands of shards each hold a Sequencer: one that sees only OUTSIDE_TXN messages
    # (or none) keeps no ring.
    seq, gen = Sequencer(buffer=5), Gen()
    a, b = new_producer_id(), new_producer_id()
    assert seq._ring == [] and seq._next == []
    out = gen(a, 1, OUTSIDE_TXN)
    assert queue(seq, out) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, out)
    assert seq._ring == []
    e1 = gen(b, 100, CONTINUE_TXN)
    assert queue(seq, e1) == [Q.CONTINUE_BEGIN_SPAN]
    assert seq._ring == [e1, None, None, None, None]
    assert seq._next == [-1] * 5
    ack = gen(b, 101, ACK_TXN)
    assert queue(seq, ack) == [Q.ACK_COMMIT_RING]
    expect_deque(seq, e1, ack)


def test_ring_add_and_evict() -> None:
    seq, gen = Sequencer(buffer=5), Gen()
    a, b = new_producer_id(), new_producer_id()
    e1 = gen(a, 100, CONTINUE_TXN)
    e2 = gen(b, 200, CONTINUE_TXN)
    e3 = gen(a, 300, CONTINUE_TXN)
    e4 = gen(a, 400, CONTINUE_TXN)
    e5, e6, e7, e8, e9, e10, e11 = (gen(b, c, CONTINUE_TXN) for c in range(500, 1200, 100))
    assert not seq.has_pending()

    assert queue(seq, e1) == [Q.CONTINUE_BEGIN_SPAN]
    assert partial(seq, a) == (e1.begin, 0, 0, 99, 100)
    assert seq.has_pending()
    assert seq.offsets == {J: e1.end}  # Continuations always update read-through offsets.

    assert queue(seq, e2) == [Q.CONTINUE_BEGIN_SPAN]
    assert partial(seq, b) == (e2.begin, 1, 1, 199, 200)
    assert len(seq._pending) == 2

    assert queue(seq, e3, e4, e5) == [Q.CONTINUE_EXTEND_SPAN] * 3
    assert seq._ring == [e1, e2, e3, e4, e5]
    assert seq._next == [2, 4, 3, -1, -1]
    assert partial(seq, a) == (e1.begin, 0, 3, 99, 400)
    assert partial(seq, b) == (e2.begin, 1, 4, 199, 500)

    assert queue(seq, e6) == [Q.CONTINUE_EXTEND_SPAN]  # Evicts e1.
    assert seq._ring == [e6, e2, e3, e4, e5]
    assert seq._next == [-1, 4, 3, -1, 0]
    assert partial(seq, a) == (e1.begin, 2, 3, 99, 400)
    assert partial(seq, b) == (e2.begin, 1, 0, 199, 600)

    assert queue(seq, e7, e8) == [Q.CONTINUE_EXTEND_SPAN] * 2
    assert seq._ring == [e6, e7, e8, e4, e5]
    assert partial(seq, a) == (e1.begin, 3, 3, 99, 400)
    assert partial(seq, b) == (e2.begin, 4, 2, 199, 800)

    assert queue(seq, e9) == [Q.CONTINUE_EXTEND_SPAN]  # Evicts A's last entry.
    assert partial(seq, a) == (e1.begin, -1, -1, 99, 400)  # Begin is still tracked.
    assert partial(seq, b) == (e2.begin, 4, 3, 199, 900)

    assert queue(seq, e10, e11) == [Q.CONTINUE_EXTEND_SPAN] * 2
    assert seq._ring == [e11, e7, e8, e9, e10]
    assert seq._next == [-1, 2, 3, 4, 0]
    assert partial(seq, b) == (e2.begin, 1, 0, 199, 1100)
    assert seq.offsets == {J: e11.end}


def test_transaction_sequence_cases() -> None:
    seq, gen = Sequencer(buffer=3), Gen()
    a, b = new_producer_id(), new_producer_id()

    # A sequence with internal duplicates, served from the ring.
    a1, a2 = gen(a, 1, CONTINUE_TXN), gen(a, 2, CONTINUE_TXN)
    a1d, a2d = gen(a, 1, CONTINUE_TXN), gen(a, 2, CONTINUE_TXN)
    a3ack = gen(a, 3, ACK_TXN)
    assert queue(seq, a1, a2, a1d, a2d, a3ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.ACK_COMMIT_RING,
    ]
    expect_deque(seq, a1, a2, a3ack)
    assert not seq.has_pending()

    # An ACK without preceding CONTINUE_TXN: unusual, but allowed.
    a4ack = gen(a, 4, ACK_TXN)
    assert queue(seq, a4ack) == [Q.ACK_EMPTY]
    expect_deque(seq, a4ack)

    # A partial ACK of the preceding messages.
    a5, a7_no_ack, a6ack = gen(a, 5, CONTINUE_TXN), gen(a, 7, CONTINUE_TXN), gen(a, 6, ACK_TXN)
    assert queue(seq, a5, a7_no_ack, a6ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    expect_deque(seq, a5, a6ack)
    assert not seq.has_pending()

    # A rollback, with producer B interleaved.
    b1 = gen(b, 1, CONTINUE_TXN)
    a7rb = gen(a, 7, CONTINUE_TXN)
    a8rb = gen(a, 8, CONTINUE_TXN)
    b2 = gen(b, 2, CONTINUE_TXN)
    a6abort = gen(a, 6, ACK_TXN)
    assert queue(seq, a7rb, b1, a7rb, a8rb, b2, a6abort) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_ROLLBACK,
    ]
    assert seq._emit is None
    assert seq.has_pending()  # B is still pending.
    assert partial(seq, a) == (-1, -1, -1, 6, 6)
    assert partial(seq, b) == (b1.begin, 1, 1, 0, 2)

    # Interleaved ACKs of producers: a replay is needed after eviction.
    b3ack = gen(b, 3, ACK_TXN)
    assert queue(seq, b3ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq, b1.begin, b2.begin, b1, a7rb, a8rb)
    expect_deque(seq, b1, b2, b3ack)
    assert not seq.has_pending()

    # A replayed sequence with duplicates within it and from before it, in both the ring
    # and the replay.
    b4 = gen(b, 4, CONTINUE_TXN)
    b1d = gen(b, 1, CONTINUE_TXN)
    b4d = gen(b, 4, CONTINUE_TXN)
    b5 = gen(b, 5, CONTINUE_TXN)
    b6 = gen(b, 6, CONTINUE_TXN)
    b2d = gen(b, 2, CONTINUE_TXN)
    b7 = gen(b, 7, CONTINUE_TXN)
    b8ack = gen(b, 8, ACK_TXN)
    assert queue(seq, b4, b1d, b4d, b5, b6, b2d, b7, b8ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_ALREADY_ACKED,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_ALREADY_ACKED,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, b4.begin, b6.begin, b4, b1d, b4d, b5)
    expect_deque(seq, b4, b5, b6, b7, b8ack)
    assert not seq.has_pending()

    # A partial rollback where every ring entry is skipped.
    b9 = gen(b, 9, CONTINUE_TXN)
    b11n, b12n, b13n = (gen(b, c, CONTINUE_TXN) for c in (11, 12, 13))
    b10ack = gen(b, 10, ACK_TXN)
    assert queue(seq, b9, b11n, b12n, b13n, b10ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, b9.begin, b12n.begin, b9, b11n)
    expect_deque(seq, b9, b10ack)

    # Interleaved committed sequences needing two replays.
    b11 = gen(b, 11, CONTINUE_TXN)
    a7 = gen(a, 7, CONTINUE_TXN)
    a8 = gen(a, 8, CONTINUE_TXN)
    b12 = gen(b, 12, CONTINUE_TXN)
    a9ack = gen(a, 9, ACK_TXN)
    b13ack = gen(b, 13, ACK_TXN)
    assert queue(seq, b11, a7, a8, b12, a9ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, a7.begin, a8.begin, a7)
    expect_deque(seq, a7, a8, a9ack)
    assert seq.has_pending()
    assert queue(seq, b13ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq, b11.begin, b12.begin, b11, a7, a8)
    expect_deque(seq, b11, b12, b13ack)
    assert not seq.has_pending()

    # A reset to an earlier ACK, then re-used clocks.
    b8reset = gen(b, 8, ACK_TXN)
    b9reuse = gen(b, 9, CONTINUE_TXN)
    b10reuse = gen(b, 10, ACK_TXN)
    assert queue(seq, b8reset, b9reuse, b10reuse) == [
        Q.ACK_ROLLBACK,
        Q.CONTINUE_BEGIN_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    expect_deque(seq, b9reuse, b10reuse)


def test_transactions_without_a_buffer() -> None:
    seq, gen = Sequencer(buffer=0), Gen()
    a, b = new_producer_id(), new_producer_id()
    a1, a2, b1 = gen(a, 1, CONTINUE_TXN), gen(a, 2, CONTINUE_TXN), gen(b, 1, CONTINUE_TXN)
    a1d, a2d, a3ack = gen(a, 1, CONTINUE_TXN), gen(a, 2, CONTINUE_TXN), gen(a, 3, ACK_TXN)
    b2, b3ack = gen(b, 2, CONTINUE_TXN), gen(b, 3, ACK_TXN)
    assert queue(seq, a1, a2, b1, a1d, a2d, a3ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.CONTINUE_TXN_CLOCK_LARGER,
        Q.ACK_COMMIT_REPLAY,
    ]
    expect_replay(seq, a1.begin, a3ack.begin, a1, a2, b1, a1d, a2d)
    expect_deque(seq, a1, a2, a3ack)
    assert seq.has_pending()
    assert queue(seq, b2, b3ack) == [Q.CONTINUE_EXTEND_SPAN, Q.ACK_COMMIT_REPLAY]
    expect_replay(seq, b1.begin, b3ack.begin, b1, a1d, a2d, a3ack, b2)
    expect_deque(seq, b1, b2, b3ack)
    assert not seq.has_pending()


def test_outside_transaction_cases() -> None:
    seq, gen = Sequencer(buffer=0), Gen()
    a = new_producer_id()

    a1, a2 = gen(a, 1, OUTSIDE_TXN), gen(a, 2, OUTSIDE_TXN)
    assert queue(seq, a1) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, a1)
    assert queue(seq, a2) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, a2)
    assert seq.offsets == {J: a2.end}

    # Duplicates are ignored.
    a1d, a2d = gen(a, 1, OUTSIDE_TXN), gen(a, 2, OUTSIDE_TXN)
    assert queue(seq, a1d, a2d) == [Q.OUTSIDE_ALREADY_ACKED] * 2
    assert seq._emit is None
    assert seq.offsets == {J: a2d.end}

    # Preceding CONTINUE_TXN messages are aborted.
    a3, a4, a5 = gen(a, 3, CONTINUE_TXN), gen(a, 4, CONTINUE_TXN), gen(a, 5, OUTSIDE_TXN)
    assert queue(seq, a3, a4, a5) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.OUTSIDE_COMMIT,
    ]
    expect_deque(seq, a5)
    assert not seq.has_pending()

    # Unknown flags are treated as OUTSIDE_TXN.
    a6, a7bad, a7bad_dup = gen(a, 6, CONTINUE_TXN), gen(a, 7, 0x100), gen(a, 7, 0x100)
    assert queue(seq, a6, a7bad) == [Q.CONTINUE_BEGIN_SPAN, Q.OUTSIDE_COMMIT]
    expect_deque(seq, a7bad)
    assert queue(seq, a7bad_dup) == [Q.OUTSIDE_ALREADY_ACKED]

    # Messages without a UUID always dequeue, and are not tracked.
    z1, z2 = gen(bytes(6), 0, 0), gen(bytes(6), 0, 0)
    assert queue(seq, z1) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, z1)
    assert queue(seq, z2) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq, z2)
    assert list(seq._partials) == [(J, a)]
    assert partial(seq, a) == (-1, -1, -1, 7, 7)
    assert seq.offsets == {J: z2.end}


def _sorted(states: list[ProducerState]) -> list[ProducerState]:
    return sorted(states, key=lambda s: s.producer)


def test_producer_states_round_trip() -> None:
    seq1, gen = Sequencer(buffer=12), Gen()
    a, b, c = new_producer_id(), new_producer_id(), new_producer_id()
    a1, a2 = gen(a, 1, CONTINUE_TXN), gen(a, 2, CONTINUE_TXN)
    b1, b2 = gen(b, 1, CONTINUE_TXN), gen(b, 2, CONTINUE_TXN)
    c1ack, b3ack = gen(c, 1, ACK_TXN), gen(b, 3, ACK_TXN)
    c2, c1rollback, a3ack = gen(c, 2, CONTINUE_TXN), gen(c, 1, ACK_TXN), gen(a, 3, ACK_TXN)
    z1 = gen(bytes(6), 0, 0)

    assert queue(seq1, a1, a2, b1, b2, c1ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_EMPTY,
    ]
    expect_deque(seq1, c1ack)
    assert queue(seq1, z1) == [Q.OUTSIDE_COMMIT]
    expect_deque(seq1, z1)

    # Taking a checkpoint clears "pending": sequences must be extended after it to count.
    assert seq1.has_pending()
    offsets, states = seq1.checkpoint()
    assert not seq1.has_pending()

    seq2 = Sequencer(offsets, states, 12)
    _, states2 = seq2.checkpoint()
    assert not seq2.has_pending()
    expect = _sorted(
        [ProducerState(J, a, 0, a1.begin), ProducerState(J, b, 0, b1.begin), ProducerState(J, c, 1)]
    )
    assert _sorted(states) == expect == _sorted(states2)
    assert offsets == {J: z1.end}

    # Both produce the same output from here, though seq2 needs replays.
    assert queue(seq1, b3ack) == [Q.ACK_COMMIT_RING]
    assert queue(seq2, b3ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, b1.begin, b3ack.begin, b1, b2, c1ack)
    expect_deque(seq1, b1, b2, b3ack)
    expect_deque(seq2, b1, b2, b3ack)

    for seq in (seq1, seq2):
        assert queue(seq, c2, c1rollback) == [Q.CONTINUE_BEGIN_SPAN, Q.ACK_ROLLBACK]
        assert seq._emit is None

    assert queue(seq1, a3ack) == [Q.ACK_COMMIT_RING]
    assert queue(seq2, a3ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, a1.begin, a3ack.begin, a1, a2, b1, b2, c1ack)
    expect_deque(seq1, a1, a2, a3ack)
    expect_deque(seq2, a1, a2, a3ack)


def test_producer_states_round_trip_during_dequeue() -> None:
    seq1, gen = Sequencer(buffer=12), Gen()
    a = new_producer_id()
    a1, a2, a3ack = gen(a, 1, CONTINUE_TXN), gen(a, 2, CONTINUE_TXN), gen(a, 3, ACK_TXN)
    a4, a5, a6ack = gen(a, 4, CONTINUE_TXN), gen(a, 5, CONTINUE_TXN), gen(a, 6, ACK_TXN)

    assert queue(seq1, a1, a2, a3ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    assert seq1.step()  # At a1: suppose the process crashes before processing it.
    offsets, states = seq1.checkpoint()
    seq2 = Sequencer(offsets, states, 12)
    seq2 = Sequencer(*seq2.checkpoint(), buffer=12)  # Round-trips unchanged.
    for seq in (seq1, seq2):
        assert seq.checkpoint() == ({J: a2.end}, [ProducerState(J, a, 0, a1.begin)])

    # seq2 reads a3ack again.
    assert queue(seq2, a3ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, a1.begin, a3ack.begin, a1, a2)
    assert seq1.step() and seq1.dequeued is a2
    assert seq1.step() and seq1.dequeued is a3ack
    assert not seq1.step()
    expect_deque(seq2, a1, a2, a3ack)

    # A checkpoint part-way through dequeuing the next sequence.
    assert queue(seq1, a4, a5, a6ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    assert seq1.step() and seq1.dequeued is a4
    assert seq1.step() and seq1.dequeued is a5  # Crash: a4 was processed, a5 was not.
    seq2 = Sequencer(*seq1.checkpoint(), buffer=12)
    seq2 = Sequencer(*seq2.checkpoint(), buffer=12)
    for seq in (seq1, seq2):
        # Tightened to a4's consumption.
        assert seq.checkpoint() == ({J: a5.end}, [ProducerState(J, a, 4, a5.begin)])
    assert queue(seq2, a6ack) == [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, a5.begin, a6ack.begin, a5)  # From a5, not a4.
    expect_deque(seq2, a5, a6ack)


def test_producer_states_straddling_a_duplicate() -> None:
    seq1, gen = Sequencer(buffer=12), Gen()
    a = new_producer_id()
    a1, a2, a3 = (gen(a, c, CONTINUE_TXN) for c in (1, 2, 3))
    a1d, a2d, a3d = (gen(a, c, CONTINUE_TXN) for c in (1, 2, 3))
    a4ack = gen(a, 4, ACK_TXN)
    assert queue(seq1, a1, a2, a3) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
        Q.CONTINUE_EXTEND_SPAN,
    ]
    seq2 = Sequencer(*seq1.checkpoint(), buffer=12)
    assert queue(seq1, a1d, a2d, a3d, a4ack) == [Q.CONTINUE_TXN_CLOCK_LARGER] * 3 + [
        Q.ACK_COMMIT_RING
    ]
    assert queue(seq2, a1d, a2d, a3d, a4ack) == [Q.CONTINUE_EXTEND_SPAN] * 3 + [Q.ACK_COMMIT_REPLAY]
    expect_replay(seq2, a1.begin, a1d.begin, a1, a2, a3)
    expect_deque(seq1, a1, a2, a3, a4ack)
    expect_deque(seq2, a1, a2, a3, a4ack)


def test_producer_pruning() -> None:
    seq, gen = Sequencer(buffer=12), Gen()
    a, b, c = new_producer_id(), new_producer_id(), new_producer_id()
    a_cont = gen(a, 10 << 4, CONTINUE_TXN)
    b_cont = gen(b, 19 << 4, CONTINUE_TXN)
    b_ack = gen(b, 20 << 4, ACK_TXN)
    c_cont = gen(c, 30 << 4, CONTINUE_TXN)
    assert queue(seq, a_cont, b_cont, b_ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.ACK_COMMIT_RING,
    ]
    expect_deque(seq, b_cont, b_ack)
    assert queue(seq, c_cont) == [Q.CONTINUE_BEGIN_SPAN]

    sa = ProducerState(J, a, (10 << 4) - 1, a_cont.begin)
    sb = ProducerState(J, b, 20 << 4, -1)
    sc = ProducerState(J, c, (30 << 4) - 1, c_cont.begin)
    # Clock units are 100 ns (above 4 counter bits); horizons are in nanoseconds.
    assert _sorted(seq.checkpoint(20 * 100)[1]) == _sorted([sa, sb, sc])
    assert _sorted(seq.checkpoint(19 * 100)[1]) == _sorted([sb, sc])  # A is pruned.
    assert _sorted(seq.checkpoint(1)[1]) == [sc]  # B is pruned.
    assert len(seq._partials) == 1


def _replay_setup() -> tuple[Sequencer, list[Envelope]]:
    seq, gen = Sequencer(buffer=0), Gen()
    a, b = new_producer_id(), new_producer_id()
    gen.offset = 0
    b1, a2, a3ack = gen(b, 1, CONTINUE_TXN), gen(a, 2, CONTINUE_TXN), gen(a, 3, ACK_TXN)
    assert queue(seq, b1, a2, a3ack) == [
        Q.CONTINUE_BEGIN_SPAN,
        Q.CONTINUE_BEGIN_SPAN,
        Q.ACK_COMMIT_REPLAY,
    ]
    assert seq.replay_range() == (J, a2.begin, a3ack.begin)
    return seq, [a2]


def _broken(envs: list[Envelope], how: str) -> Iterator[Envelope]:
    for env in envs:
        if how == "journal":
            yield Envelope(
                "wrong/journal", env.begin, env.end, env.message, env.producer, env.clock, env.flags
            )
        elif how == "begin":
            yield Envelope(
                J, env.begin - 1, env.end, env.message, env.producer, env.clock, env.flags
            )
        elif how == "end":
            yield Envelope(
                J, env.begin, env.end + 100, env.message, env.producer, env.clock, env.flags
            )
        else:
            raise EOFError("unexpected EOF")


@pytest.mark.parametrize(
    ("how", "error"),
    [
        ("journal", "replay of the wrong journal (wrong/journal; expected test/journal)"),
        ("begin", "replay has wrong begin (101; expected >= 102)"),
        ("end", "replay has wrong end (302; expected <= 204)"),
    ],
)
def test_replay_reader_errors(how: str, error: str) -> None:
    seq, envs = _replay_setup()
    seq.start_replay(_broken(envs, how))
    with pytest.raises(ReplayError) as info:
        seq.step()
    assert str(info.value) == error


def test_replay_reader_failures_pass_through_and_a_good_replay_works() -> None:
    seq, envs = _replay_setup()
    seq.start_replay(_broken(envs, "fail"))
    with pytest.raises(EOFError):
        seq.step()
    seq, envs = _replay_setup()
    seq.start_replay(envs)
    assert seq.step() and seq.dequeued is envs[0]


def test_misuse_is_refused() -> None:
    seq, gen = Sequencer(buffer=4), Gen()
    a = new_producer_id()
    assert queue(seq, gen(a, 1, OUTSIDE_TXN)) == [Q.OUTSIDE_COMMIT]
    with pytest.raises(RuntimeError, match="remain to dequeue"):
        seq.queue_uncommitted(gen(a, 2, OUTSIDE_TXN))
    seq, _ = _replay_setup()
    with pytest.raises(RuntimeError, match="replayed first"):
        seq.step()


# Properties -------------------------------------------------------------------------------

_events = st.lists(
    st.tuples(
        st.integers(0, 2),  # Producer.
        st.sampled_from(["outside", "txn", "commit", "abort", "dup"]),
        st.integers(1, 4),  # Messages in a transaction.
    ),
    max_size=40,
)


def _simulate(events: list[tuple[int, str, int]], ring: int) -> tuple[list[Envelope], set[str]]:
    """A journal written by producers that publish, commit, abort and retry (duplicate)
    appends; returns its envelopes and the messages a reader must see, each once."""
    producers = [bytes([1, 0, 0, 0, 0, p]) for p in range(3)]
    clocks = [10, 10, 10]  # (Clock zero means "no UUID".)
    acked: list[int | None] = [None, None, None]  # Clock of the last commit.
    pending: list[list[Envelope]] = [[], [], []]
    journal: list[Envelope] = []
    committed: set[str] = set()
    offset = itertools.count(0, 10)
    last_append: list[Envelope] = []

    def envelope(p: int, clock: int, flags: int, body: str) -> Envelope:
        begin = next(offset)
        return Envelope(J, begin, begin + 10, body, producers[p], clock, flags)

    def emit(p: int, flags: int, body: str) -> Envelope:
        clocks[p] += 1
        return envelope(p, clocks[p], flags, body)

    for p, kind, n in events:
        if kind == "outside":
            env = emit(p, OUTSIDE_TXN, f"o{p}-{clocks[p]}")
            committed.add(env.message)
            pending[p] = []  # An OUTSIDE_TXN message rolls back a pending transaction.
            acked[p] = env.clock
            last_append = [env]
        elif kind == "txn":
            last_append = [emit(p, CONTINUE_TXN, f"t{p}-{clocks[p] + 1}") for _ in range(n)]
            pending[p].extend(last_append)
        elif kind == "commit":
            committed.update(e.message for e in pending[p])
            pending[p] = []
            last_append = [emit(p, ACK_TXN, f"ack{p}-{clocks[p] + 1}")]
            acked[p] = last_append[0].clock
        elif kind == "abort":
            # An ACK of the last committed clock rolls the pending messages back.
            if not pending[p]:
                continue
            clock = acked[p] if acked[p] is not None else pending[p][0].clock - 1
            pending[p] = []
            last_append = [envelope(p, clock, ACK_TXN, f"rollback{p}")]
        else:  # A retried append: the same content, once more.
            dup = [
                envelope(producers.index(e.producer), e.clock, e.flags, e.message)
                for e in last_append
            ]
            journal.extend(dup)
            continue
        journal.extend(last_append)
    return journal, committed


def _read_committed(journal: list[Envelope], seq: Sequencer, start: int = 0) -> list[str]:
    out: list[str] = []
    for i in range(start, len(journal)):
        env = journal[i]
        if seq.queue_uncommitted(env) == Q.ACK_COMMIT_REPLAY:
            _, begin, end = seq.replay_range()
            seq.start_replay([e for e in journal if begin <= e.begin and e.end <= end])
        while seq.step():
            assert seq.dequeued is not None
            if seq.dequeued.flags != ACK_TXN:
                out.append(seq.dequeued.message)
    return out


@settings(max_examples=300, deadline=None)
@given(events=_events, ring=st.integers(0, 8))
def test_committed_messages_are_read_exactly_once(
    events: list[tuple[int, str, int]], ring: int
) -> None:
    journal, committed = _simulate(events, ring)
    seen = _read_committed(journal, Sequencer(buffer=ring))
    assert len(seen) == len(set(seen)), "a message was read twice"
    assert set(seen) == committed


@settings(max_examples=200, deadline=None)
@given(events=_events, ring=st.integers(0, 8), data=st.data())
def test_a_restored_checkpoint_resumes_exactly(
    events: list[tuple[int, str, int]], ring: int, data: st.DataObject
) -> None:
    journal, _ = _simulate(events, ring)
    expect = _read_committed(journal, Sequencer(buffer=ring))
    # Read a prefix, checkpoint, and resume a new Sequencer from the checkpoint's offset.
    cut = data.draw(st.integers(0, len(journal)))
    seq = Sequencer(buffer=ring)
    first = _read_committed(journal[:cut], seq)
    offsets, states = seq.checkpoint()
    resume_at = offsets.get(J, 0)
    start = next((i for i, e in enumerate(journal) if e.begin >= resume_at), len(journal))
    rest = _read_committed(journal, Sequencer(offsets, states, ring), start)
    assert first + rest == expect


def _read_committed_batched(journal: list[Envelope], seq: Sequencer) -> list[str]:
    out: list[Envelope] = []
    i = 0
    while i < len(journal):
        i = seq.sequence(journal, i, out)
        if seq.dequeuing:
            _, begin, end = seq.replay_range()
            seq.start_replay([e for e in journal if begin <= e.begin and e.end <= end])
            while seq.step():
                assert seq.dequeued is not None
                out.append(seq.dequeued)
    return [e.message for e in out if e.flags != ACK_TXN]


@settings(max_examples=300, deadline=None)
@given(events=_events, ring=st.integers(0, 8), mixed=st.booleans())
def test_batched_sequencing_equals_queue_and_step(
    events: list[tuple[int, str, int]], ring: int, mixed: bool
) -> None:
    journal, _ = _simulate(events, ring)
    if mixed:  # Messages without UUIDs, and unknown flags, among them.
        journal = [
            Envelope(J, e.begin, e.end, e.message, bytes(6), 0, 0) if i % 7 == 3 else e
            for i, e in enumerate(journal)
        ]
    a, b = Sequencer(buffer=ring), Sequencer(buffer=ring)
    assert _read_committed_batched(journal, a) == _read_committed(journal, b)
    assert a.checkpoint() == b.checkpoint()


def test_open_transactions_outlive_checkpoints_until_acked_or_rolled_back() -> None:
    """`begun` and `newest_open` (the consumer's wait-for-ACK): a transaction is open from
    its first message until its ACK commits or rolls it back, across checkpoints."""
    seq, gen = Sequencer(), Gen()
    p1, p2 = new_producer_id(), new_producer_id()
    assert (seq.begun, seq.newest_open()) == (0, 0)
    queue(seq, gen(p1, 1, CONTINUE_TXN), gen(p1, 2, CONTINUE_TXN))
    assert (seq.begun, seq.newest_open()) == (1, 1)  # Extending it begins nothing new.
    seq.checkpoint()
    assert not seq.has_pending() and seq.newest_open() == 1
    queue(seq, gen(p2, 5, CONTINUE_TXN))
    assert (seq.begun, seq.newest_open()) == (2, 2)
    assert queue(seq, gen(p2, 4, ACK_TXN)) == [Q.ACK_ROLLBACK]
    assert seq.newest_open() == 1
    assert queue(seq, gen(p1, 2, ACK_TXN)) == [Q.ACK_COMMIT_RING]
    while seq.step():
        pass
    assert (seq.begun, seq.newest_open()) == (2, 0)
