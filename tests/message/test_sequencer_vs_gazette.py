"""The Sequencer against a line-by-line port of Gazette's message/sequencer.go: on generated
journals (several journals and producers; transactions, commits, rollbacks, ACK intents
appended again after a restart, retried appends, messages without UUIDs or with unknown
flags), both commit the same messages in the same order, checkpoint the same offsets and
producer states, and resume the same from a checkpoint. pygazette departs from Gazette in
how it gets there (committed OUTSIDE_TXN messages skip the ring, a batched fast path, a
lazily allocated ring); this holds it to Gazette's results."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator

import pytest

from pygazette.message import (
    ACK_TXN,
    CONTINUE_TXN,
    OUTSIDE_TXN,
    Envelope,
    ProducerState,
    QueueOutcome,
    Sequencer,
)

Read = list[tuple[str, int, str]]
States = list[tuple[str, bytes, int, int]]


class _GoPartial:
    def __init__(self, jp: tuple[str, bytes], clock: int, begin: int) -> None:
        self.jp = jp
        self.min_clock = self.max_clock = clock
        self.begin = begin
        self.ring_start = self.ring_stop = -1


class GoSequencer:
    """Gazette's Sequencer (sequencer.go, v0.103.0), ported as it is written."""

    def __init__(
        self, offsets: dict[str, int], states: Iterable[ProducerState], buffer: int
    ) -> None:
        self.dequeued: Envelope | None = None
        self.dequeued_clock = 0
        self.dequeued_slot = -1
        self.offsets = dict(offsets)
        self.partials: dict[tuple[str, bytes], _GoPartial] = {}
        self.emit: _GoPartial | None = None
        self.replay_it: Iterator[Envelope] | None = None
        self.cap = max(1, buffer)
        # A ring entry whose Message is nil (never written, dequeued, or evicted) is None.
        self.ring: list[Envelope | None] = []
        self.next: list[int] = []
        self.head = 0
        for s in states:
            jp = (s.journal, s.producer)
            self.partials[jp] = _GoPartial(jp, s.last_ack, s.begin)

    def queue_uncommitted(self, env: Envelope) -> bool:
        """QueueUncommitted; True for QueueAckCommitReplay."""
        assert self.emit is None
        self._evict_at_head()
        jp = (env.journal, env.producer)
        clock, flags = env.clock, env.flags
        partial = self.partials.get(jp)
        if clock == 0:
            partial, flags, clock = _GoPartial(jp, 0, -1), OUTSIDE_TXN, 1
        elif partial is None:
            partial = self.partials[jp] = _GoPartial(jp, clock - 1, -1)

        if flags == CONTINUE_TXN:
            ignore = clock <= partial.max_clock  # Already acked, or a larger clock pending.
            if not ignore:
                if partial.begin == -1:
                    partial.begin = env.begin
                self._add_at_head(env, partial)
                partial.max_clock = clock
            self.offsets[env.journal] = env.end
            return False
        if flags == ACK_TXN:
            if clock <= partial.min_clock:  # Rollback.
                partial.min_clock = partial.max_clock = clock
                partial.begin = partial.ring_start = partial.ring_stop = -1
                self.offsets[env.journal] = env.end
                return False
            if partial.begin == -1:
                replay = False
            elif partial.ring_start == -1:
                replay = True
            else:
                ring_env = self.ring[partial.ring_start]
                assert ring_env is not None
                replay = partial.begin != ring_env.begin
            self._add_at_head(env, partial)
            if partial.begin == -1:
                partial.begin = env.begin
            partial.max_clock = clock
            self.emit = partial
            return replay
        # OUTSIDE_TXN, or unknown flags handled as it.
        if clock <= partial.min_clock:
            self.offsets[env.journal] = env.end
            return False
        self._add_at_head(env, partial)
        partial.begin = env.begin
        partial.ring_start = partial.ring_stop
        partial.max_clock = clock
        self.emit = partial
        return False

    def step(self) -> bool:
        emit = self.emit
        if emit is None:
            return False
        if self.dequeued is not None:
            emit.min_clock = self.dequeued_clock
            if self.dequeued_slot >= 0:
                self.ring[self.dequeued_slot] = None  # Dequeued.Message = nil
        while emit.ring_start != -1:
            if self.replay_it is None:
                self.dequeued_slot = emit.ring_start
                self.dequeued = self.ring[emit.ring_start]
                emit.ring_start = self.next[emit.ring_start]
            else:
                env = next(self.replay_it, None)
                if env is None:
                    self.replay_it = None
                    continue
                if env.producer != emit.jp[1]:
                    continue
                self.dequeued, self.dequeued_slot = env, -1
            assert self.dequeued is not None
            self.dequeued_clock = self.dequeued.clock
            if self.dequeued_clock != 0 and self.dequeued_clock <= emit.min_clock:
                continue
            if self.dequeued_clock > emit.max_clock:
                continue
            emit.begin = self.dequeued.begin
            return True
        assert self.dequeued is not None
        self.offsets[emit.jp[0]] = self.dequeued.end
        emit.max_clock = emit.min_clock
        emit.begin = emit.ring_start = emit.ring_stop = -1
        self.dequeued, self.emit, self.dequeued_clock = None, None, 0
        return False

    def replay_range(self) -> tuple[str, int, int]:
        assert self.emit is not None
        ring_env = self.ring[self.emit.ring_start]
        assert ring_env is not None
        return self.emit.jp[0], self.emit.begin, ring_env.begin

    def start_replay(self, envs: Iterable[Envelope]) -> None:
        self.replay_it = iter(envs)

    def checkpoint(self, horizon_ns: int) -> tuple[dict[str, int], States]:
        prune: dict[str, int] = {}
        for (journal, _), p in self.partials.items():
            prune[journal] = max(prune.get(journal, 0), p.min_clock)
        for journal, clock in prune.items():
            prune[journal] = clock - ((horizon_ns // 100) << 4) if horizon_ns > 0 else 0
        states = []
        for jp, p in list(self.partials.items()):
            if p.max_clock >= prune.get(jp[0], 0):
                states.append((jp[0], jp[1], p.min_clock, p.begin))
            else:
                del self.partials[jp]
        return dict(self.offsets), sorted(states)

    def _evict_at_head(self) -> None:
        if len(self.ring) != self.cap:
            if len(self.ring) <= self.head:  # Still filling the ring.
                self.ring.append(None)
                self.next.append(-1)
            return
        env = self.ring[self.head]
        if env is None:
            return
        p = self.partials.get((env.journal, env.producer))
        if p is not None and p.ring_start == self.head:
            nxt = self.next[self.head]
            if p.ring_start == p.ring_stop and nxt == -1:
                p.ring_start = p.ring_stop = -1
            elif p.ring_start != p.ring_stop and nxt != -1:
                p.ring_start = nxt
            else:
                raise AssertionError("invariant violated")
        self.ring[self.head], self.next[self.head] = None, -1

    def _add_at_head(self, env: Envelope, p: _GoPartial) -> None:
        self.ring[self.head], self.next[self.head] = env, -1
        if p.ring_stop == -1:
            p.ring_start = self.head
        else:
            self.next[p.ring_stop] = self.head
        p.ring_stop = self.head
        self.head = (self.head + 1) % self.cap


def _journal(rng: random.Random) -> list[Envelope]:
    """Two journals written by three producers whose clocks only grow (each producer is one
    process's publisher, as Gazette's are)."""
    producers = [bytes([1, 0, 0, 0, 0, p]) for p in range(3)]
    clocks = {p: rng.choice([16, 1 << 40]) for p in producers}
    offsets = {"a": 0, "b": 0}
    acks: list[Envelope] = []
    out: list[Envelope] = []
    last: list[Envelope] = []

    def make(journal: str, producer: bytes, clock: int, flags: int, body: str) -> Envelope:
        begin = offsets[journal]
        offsets[journal] += 10
        return Envelope(journal, begin, begin + 10, body, producer, clock, flags)

    def tick(p: bytes) -> int:
        clocks[p] += 160
        return clocks[p]

    for n in range(rng.randint(0, 60)):
        j, p, kind = rng.choice("ab"), rng.choice(producers), rng.random()
        if kind < 0.15:
            last = [make(j, p, tick(p), OUTSIDE_TXN, f"o{n}")]
        elif kind < 0.45:
            last = [
                make(j, p, tick(p), CONTINUE_TXN, f"c{n}.{i}") for i in range(rng.randint(1, 5))
            ]
        elif kind < 0.6:
            last = [make(j, p, tick(p), ACK_TXN, f"ack{n}")]
            acks.append(last[0])
        elif kind < 0.67 and acks:
            # An ACK intent appended again (a recovered checkpoint's), or a stale one.
            ack = rng.choice(acks)
            last = [make(ack.journal, ack.producer, ack.clock, ACK_TXN, f"again{n}")]
        elif kind < 0.72:
            last = [make(j, bytes(6), 0, 0, f"no-uuid{n}")]
        elif kind < 0.75:
            last = [make(j, p, tick(p), rng.choice([3, 0x3FF]), f"flags{n}")]
        elif kind < 0.9 and last:  # A retried append: the same messages again.
            last = [make(e.journal, e.producer, e.clock, e.flags, e.message + "'") for e in last]
        else:
            continue
        out.extend(last)
    return out


def _replay(journal: list[Envelope], rng: tuple[str, int, int]) -> list[Envelope]:
    name, begin, end = rng
    return [e for e in journal if e.journal == name and begin <= e.begin and e.end <= end]


def _read_go(seq: GoSequencer, envs: list[Envelope], journal: list[Envelope]) -> Read:
    out: Read = []
    for env in envs:
        if seq.queue_uncommitted(env):
            seq.start_replay(_replay(journal, seq.replay_range()))
        while seq.step():
            assert seq.dequeued is not None
            out.append((seq.dequeued.journal, seq.dequeued.begin, seq.dequeued.message))
    return out


def _read_ours(
    seq: Sequencer, envs: list[Envelope], journal: list[Envelope], batched: bool
) -> Read:
    got: list[Envelope] = []
    if batched:
        i = 0
        while i < len(envs):
            i = seq.sequence(envs, i, got)
            if seq.dequeuing:
                seq.start_replay(_replay(journal, seq.replay_range()))
                while seq.step():
                    assert seq.dequeued is not None
                    got.append(seq.dequeued)
    else:
        for env in envs:
            if seq.queue_uncommitted(env) == QueueOutcome.ACK_COMMIT_REPLAY:
                seq.start_replay(_replay(journal, seq.replay_range()))
            while seq.step():
                assert seq.dequeued is not None
                got.append(seq.dequeued)
    return [(e.journal, e.begin, e.message) for e in got]


def _checkpoint(seq: Sequencer, horizon_ns: int) -> tuple[dict[str, int], States]:
    offsets, states = seq.checkpoint(horizon_ns)
    return offsets, sorted((s.journal, s.producer, s.last_ack, s.begin) for s in states)


@pytest.mark.parametrize("batched", [False, True], ids=["queue_and_step", "batched"])
@pytest.mark.parametrize("seeds", [range(i, i + 500) for i in range(0, 2000, 500)])
def test_the_sequencer_commits_what_gazettes_commits(seeds: range, batched: bool) -> None:
    for seed in seeds:
        rng = random.Random(seed)
        journal = _journal(rng)
        ring = rng.randint(1, 8)
        horizon_ns = rng.choice([0, 0, 10_000, 1_000_000])
        cut = rng.randint(0, len(journal))
        go, ours = GoSequencer({}, [], ring), Sequencer(buffer=ring)
        context = f"seed {seed}"
        assert _read_ours(ours, journal[:cut], journal, batched) == _read_go(
            go, journal[:cut], journal
        ), context
        offsets, states = go.checkpoint(horizon_ns)
        assert _checkpoint(ours, horizon_ns) == (offsets, states), context
        # A sequencer restored from the checkpoint, reading each journal from its offset.
        resume = [e for e in journal if e.begin >= offsets.get(e.journal, 0)]
        restored = [ProducerState(j, p, last_ack, begin) for j, p, last_ack, begin in states]
        assert _read_ours(Sequencer(offsets, restored, ring), resume, journal, batched) == _read_go(
            GoSequencer(offsets, restored, ring), resume, journal
        ), context
        # And the first ones, reading on.
        rest = journal[cut:]
        assert _read_ours(ours, rest, journal, batched) == _read_go(go, rest, journal), context
        assert _checkpoint(ours, 0) == go.checkpoint(0), context
