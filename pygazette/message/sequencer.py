"""`Sequencer`: turns read-uncommitted messages into read-committed ones, as Gazette's does.

Feed every message read from journals, in journal order, to `queue_uncommitted`; then call
`step` until it returns False, taking each committed message from `dequeued`. A message
commits when:

- it is OUTSIDE_TXN and its clock is larger than the producer's last acknowledged clock
  (a smaller or equal clock is a duplicate, e.g. from an append retried after a lost
  response, and is dropped);
- it is CONTINUE_TXN and a later ACK_TXN of its producer has a clock at least as large. An
  ACK_TXN with a smaller clock rolls the producer's pending messages back: they are dropped,
  as are re-sent duplicates of messages already acknowledged.

De-duplication is by (journal, producer, clock). Pending messages wait in a ring buffer of
`buffer` envelopes; messages of other producers keep flowing meanwhile (no head-of-line
blocking). If a transaction outgrows the ring, its acknowledgement asks for a replay:
`queue_uncommitted` returns ACK_COMMIT_REPLAY, `replay_range()` says which bytes of the
journal to read again, and `start_replay` takes an iterator of the envelopes read there.

`checkpoint()` snapshots read-through offsets and producer states, from which a new
Sequencer resumes exactly (that is how consumers recover).

Beyond Gazette: committed OUTSIDE_TXN messages do not occupy the ring (they are emitted at
once), which leaves the whole ring to pending transactions and makes replays rarer.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Iterator, Sequence

from pygazette.message.envelope import Envelope, ProducerState
from pygazette.message.uuid import ACK_TXN, CONTINUE_TXN, OUTSIDE_TXN, flags_name

log = logging.getLogger(__name__)

DEFAULT_RING_SIZE = 4096


class QueueOutcome(enum.IntEnum):
    """What `Sequencer.queue_uncommitted` decided about a message."""

    # An OUTSIDE_TXN message whose clock was already acknowledged: a duplicate, ignored.
    OUTSIDE_ALREADY_ACKED = 1
    # An OUTSIDE_TXN message that commits: dequeue it with `step`.
    OUTSIDE_COMMIT = 2
    # A CONTINUE_TXN message whose clock was already acknowledged: ignored.
    CONTINUE_ALREADY_ACKED = 3
    # A CONTINUE_TXN message not larger than one already pending: ignored.
    CONTINUE_TXN_CLOCK_LARGER = 4
    # A CONTINUE_TXN message that opens a transaction of its producer.
    CONTINUE_BEGIN_SPAN = 5
    # A CONTINUE_TXN message that extends its producer's open transaction.
    CONTINUE_EXTEND_SPAN = 6
    # An ACK_TXN that rolled back its producer's pending messages.
    ACK_ROLLBACK = 7
    # An ACK_TXN that commits without pending messages: dequeue it with `step`.
    ACK_EMPTY = 8
    # An ACK_TXN that commits pending messages all held in the ring: dequeue with `step`.
    ACK_COMMIT_RING = 9
    # An ACK_TXN that commits pending messages partly outside the ring: `start_replay`
    # over `replay_range()` first, then dequeue with `step`.
    ACK_COMMIT_REPLAY = 10


_IGNORED = frozenset(
    {
        QueueOutcome.OUTSIDE_ALREADY_ACKED,
        QueueOutcome.CONTINUE_ALREADY_ACKED,
        QueueOutcome.CONTINUE_TXN_CLOCK_LARGER,
    }
)


_MIXED = (
    "OUTSIDE_TXN follows a pending CONTINUE_TXN (mixed committed and uncommitted "
    "publishing to one journal?)"
)


class ReplayError(RuntimeError):
    """The replay iterator returned envelopes outside of the requested range."""


class _Partial:
    """A producer's partially read transaction in one journal."""

    __slots__ = ("begin", "jp", "max_clock", "min_clock", "ring_start", "ring_stop", "serial")

    def __init__(self, jp: tuple[str, bytes], min_clock: int, max_clock: int, begin: int) -> None:
        self.jp = jp
        self.min_clock = min_clock  # Exclusive minimum clock of the sequence.
        self.max_clock = max_clock  # Inclusive maximum clock of the sequence.
        self.begin = begin  # See ProducerState.begin.
        self.ring_start = -1  # Ring indices (inclusive) of the sequence, or -1.
        self.ring_stop = -1
        self.serial = 0  # Sequencer.begun when its open transaction began.

    def reset(self, clock: int) -> None:
        self.min_clock = self.max_clock = clock
        self.begin = self.ring_start = self.ring_stop = -1

    def copy(self) -> _Partial:
        other = _Partial(self.jp, self.min_clock, self.max_clock, self.begin)
        other.ring_start, other.ring_stop, other.serial = (
            self.ring_start,
            self.ring_stop,
            self.serial,
        )
        return other


class Sequencer:
    """Sequences read-uncommitted envelopes into read-committed ones (see module doc)."""

    def __init__(
        self,
        offsets: dict[str, int] | None = None,
        states: Iterable[ProducerState] = (),
        buffer: int = DEFAULT_RING_SIZE,
    ) -> None:
        size = max(1, buffer)
        # The committed message to process now, between a `step` returning True and the
        # next `step`.
        self.dequeued: Envelope | None = None
        self._dequeued_clock = 0
        self._dequeued_slot = -1
        self._offsets: dict[str, int] = dict(offsets or {})
        self._partials: dict[tuple[str, bytes], _Partial] = {}
        self._pending: set[_Partial] = set()
        # Transactions begun and not yet acknowledged or rolled back (unlike `_pending`, not
        # cleared by checkpoints), and how many transactions were begun so far.
        self._open: set[_Partial] = set()
        self.begun = 0
        # Per journal, the end of the last message queued and dropped (a duplicate, or an ACK
        # that rolled back): what a consumer reports as read through while idle, as Gazette's
        # txnRead does, even with a transaction still open before it.
        self.dropped_through: dict[str, int] = {}
        self._emit: _Partial | None = None
        self._direct: Envelope | None = None  # A sequence of exactly this envelope.
        self._replay: Iterator[Envelope] | None = None
        # Allocated on the first message that may enter the ring (`_make_room`): most
        # sequencers of a consumer with thousands of shards never see one, and two lists
        # of 4,096 slots are 64 KiB of fresh memory each (page faults: ~150 µs a sequencer).
        self._ring: list[Envelope | None] = []
        self._next: list[int] = []
        self._size = size
        self._head = 0
        self._quiet = False  # A copy sequencing envelopes again logs nothing of them.
        for state in states:
            jp = (state.journal, bytes(state.producer))
            self._partials[jp] = _Partial(jp, state.last_ack, state.last_ack, state.begin)

    @property
    def dequeuing(self) -> bool:
        """Whether a committed sequence waits to be dequeued with `step`."""
        return self._emit is not None

    @property
    def offsets(self) -> dict[str, int]:
        """Read-through offset of each journal: where reading resumes after a checkpoint."""
        return self._offsets

    def queue_uncommitted(self, env: Envelope) -> QueueOutcome:
        """Apply the next read-uncommitted envelope of its journal; see QueueOutcome."""
        if self._emit is not None:
            raise RuntimeError("committed messages remain to dequeue (call step() first)")
        journal = env.journal
        clock = env.clock
        flags = env.flags
        if clock and (flags == CONTINUE_TXN or flags == ACK_TXN):
            # Only these may enter the ring: make room first, as the outcome depends on it.
            if not self._ring:
                self._ring = [None] * self._size
                self._next = [-1] * self._size
            self._evict_at_head()
        if clock == 0:
            # A message without a UUID commits at once and is never indexed.
            partial = _Partial((journal, env.producer), 0, 0, -1)
            flags, clock = OUTSIDE_TXN, 1
        else:
            jp = (journal, env.producer)
            partial = self._partials.get(jp)  # type: ignore[assignment]
            if partial is None:
                partial = _Partial(jp, clock - 1, clock - 1, -1)
                self._partials[jp] = partial

        if flags == CONTINUE_TXN:
            if clock <= partial.min_clock:
                outcome = QueueOutcome.CONTINUE_ALREADY_ACKED
            elif clock <= partial.max_clock:
                outcome = QueueOutcome.CONTINUE_TXN_CLOCK_LARGER
            elif partial.begin == -1:
                outcome = QueueOutcome.CONTINUE_BEGIN_SPAN
            else:
                outcome = QueueOutcome.CONTINUE_EXTEND_SPAN
        elif flags == ACK_TXN:
            if clock < partial.min_clock:
                # An upstream producer restored an older checkpoint: exactly-once weakens to
                # at-least-once until it catches up. Accept the reset clock.
                self._log_error(env, partial, "ACK_TXN is less than the last ACK")
                outcome = QueueOutcome.ACK_ROLLBACK
            elif clock == partial.min_clock:
                outcome = QueueOutcome.ACK_ROLLBACK
            elif partial.begin == -1:
                outcome = QueueOutcome.ACK_EMPTY
            elif partial.ring_start == -1:
                outcome = QueueOutcome.ACK_COMMIT_REPLAY  # No part of it is in the ring.
            elif partial.begin != self._ring_env(partial.ring_start).begin:
                outcome = QueueOutcome.ACK_COMMIT_REPLAY  # Only its tail is in the ring.
            else:
                outcome = QueueOutcome.ACK_COMMIT_RING
        else:
            if flags != OUTSIDE_TXN:
                self._log_error(env, partial, "unexpected UUID flags")
            if clock <= partial.min_clock:
                outcome = QueueOutcome.OUTSIDE_ALREADY_ACKED
            else:
                if partial.begin != -1:
                    self._log_error(env, partial, _MIXED)
                outcome = QueueOutcome.OUTSIDE_COMMIT

        if outcome in _IGNORED:
            # A duplicate: ignored, but read through.
            self._offsets[journal] = env.end
            self.dropped_through[journal] = env.end
        elif outcome in (QueueOutcome.CONTINUE_BEGIN_SPAN, QueueOutcome.CONTINUE_EXTEND_SPAN):
            if outcome == QueueOutcome.CONTINUE_BEGIN_SPAN:
                partial.begin = env.begin
                self._pending.add(partial)
                self._open.add(partial)
                self.begun += 1
                partial.serial = self.begun
            self._add_at_head(env, partial)
            partial.max_clock = clock
            self._offsets[journal] = env.end
        elif outcome == QueueOutcome.ACK_ROLLBACK:
            partial.reset(clock)
            self._pending.discard(partial)
            self._open.discard(partial)
            self._offsets[journal] = env.end
            self.dropped_through[journal] = env.end
        elif outcome == QueueOutcome.OUTSIDE_COMMIT:
            # Commits this message alone; a pending CONTINUE_TXN sequence is clobbered (an
            # effective rollback), as Gazette does. Emitted directly, not through the ring.
            partial.begin = env.begin
            partial.ring_start = partial.ring_stop = -1
            partial.max_clock = clock
            self._direct = env
            self._emit = partial
        else:  # ACK_EMPTY, ACK_COMMIT_RING, ACK_COMMIT_REPLAY: commit through `clock`.
            self._add_at_head(env, partial)
            if outcome == QueueOutcome.ACK_EMPTY:
                partial.begin = env.begin
            # Messages of larger clocks than this ACK are dropped.
            partial.max_clock = clock
            self._emit = partial
        return outcome

    def sequence(self, envs: Sequence[Envelope], start: int, out: list[Envelope]) -> int:
        """Queue `envs[start:]` one after the other, appending the messages they commit to
        `out`; the same as `queue_uncommitted` and `step` for each, but faster. Returns
        len(envs), or, when an ACK needs a replay, the index after it: `start_replay`, drain
        with `step`, then continue from there."""
        partials = self._partials
        offsets = self._offsets
        n = len(envs)
        i = start
        # The last producer seen in this call, and its _Partial: a run of one producer's
        # messages (the common case) looks its state up once. (Only within this call:
        # checkpoint() may drop _Partials.)
        last_journal: str | None = None
        last_producer: bytes | None = None
        partial: _Partial | None = None
        while i < n:
            env = envs[i]
            i += 1
            if env.flags == OUTSIDE_TXN and self._emit is None:
                # The common case, inline: a message that commits (or duplicates) alone.
                clock = env.clock
                if clock:
                    if env.producer is not last_producer or env.journal is not last_journal:
                        jp = (env.journal, env.producer)
                        partial = partials.get(jp)
                        if partial is None:
                            partial = partials[jp] = _Partial(jp, clock - 1, clock - 1, -1)
                        last_journal, last_producer = env.journal, env.producer
                    assert partial is not None
                    if clock <= partial.min_clock:
                        offsets[env.journal] = env.end  # A duplicate.
                        self.dropped_through[env.journal] = env.end
                        continue
                    if partial.begin != -1:
                        self._log_error(env, partial, _MIXED)
                        self._pending.discard(partial)
                        self._open.discard(partial)
                    partial.min_clock = partial.max_clock = clock
                    partial.begin = partial.ring_start = partial.ring_stop = -1
                offsets[env.journal] = env.end
                out.append(env)
                continue
            last_producer = None  # queue_uncommitted may create or reset _Partials.
            if self.queue_uncommitted(env) == QueueOutcome.ACK_COMMIT_REPLAY:
                return i
            while self.step():
                out.append(self.dequeued)  # type: ignore[arg-type]
        return n

    def step(self) -> bool:
        """Move to the next committed message: True if `dequeued` now holds one, False when
        the committed sequence is done (or there was none)."""
        emit = self._emit
        if emit is None:
            return False

        if self.dequeued is not None:
            # The previous message was processed: tighten the producer's clock to it.
            emit.min_clock = self._dequeued_clock
            if self._dequeued_slot >= 0:
                self._ring[self._dequeued_slot] = None  # Release it.

        direct = self._direct
        if direct is not None:
            if self.dequeued is None:
                self.dequeued = direct
                self._dequeued_clock = direct.clock
                self._dequeued_slot = -1
                emit.begin = direct.begin
                return True
            return self._finish(emit)

        if (
            self.dequeued is None
            and self._replay is None
            and emit.begin != self._ring_env(emit.ring_start).begin
        ):
            raise RuntimeError("the sequence must be replayed first (see start_replay)")

        while emit.ring_start != -1:
            replay = self._replay
            if replay is None:
                slot = emit.ring_start
                env = self._ring_env(slot)
                self.dequeued = env
                self._dequeued_slot = slot
                emit.ring_start = self._next[slot]
            else:
                try:
                    env = next(replay)
                except StopIteration:
                    self._replay = None  # Replay done: continue from the ring.
                    continue
                journal, producer = emit.jp
                if env.journal != journal:
                    raise ReplayError(
                        f"replay of the wrong journal ({env.journal}; expected {journal})"
                    )
                if env.begin < emit.begin:
                    raise ReplayError(
                        f"replay has wrong begin ({env.begin}; expected >= {emit.begin})"
                    )
                ring_begin = self._ring_env(emit.ring_start).begin
                if env.end > ring_begin:
                    raise ReplayError(f"replay has wrong end ({env.end}; expected <= {ring_begin})")
                if env.producer != producer:
                    continue  # Another producer's message, interleaved with the sequence.
                self.dequeued = env
                self._dequeued_slot = -1

            clock = env.clock
            self._dequeued_clock = clock
            if clock != 0 and clock <= emit.min_clock:
                continue  # A duplicate (replays and checkpoints can overlap the ring).
            if clock > emit.max_clock:
                continue  # The ACK's clock says not to commit it.
            emit.begin = env.begin
            return True

        return self._finish(emit)

    def _finish(self, emit: _Partial) -> bool:
        # The ACK was not recorded as read through when queued, so that a sequencer
        # recovered from a checkpoint taken meanwhile would queue it (and emit) again.
        assert self.dequeued is not None
        self._offsets[emit.jp[0]] = self.dequeued.end
        emit.reset(emit.min_clock)
        self._pending.discard(emit)
        self._open.discard(emit)
        self.dequeued = None
        self._dequeued_clock = 0
        self._dequeued_slot = -1
        self._emit = None
        self._direct = None
        return False

    def replay_range(self) -> tuple[str, int, int]:
        """(journal, begin, end) to read again before the committed sequence can be
        dequeued (after queue_uncommitted returned ACK_COMMIT_REPLAY)."""
        emit = self._emit
        if emit is None or self._direct is not None:
            raise RuntimeError("no committed sequence to replay")
        return emit.jp[0], emit.begin, self._ring_env(emit.ring_start).begin

    def replay_producer(self) -> bytes:
        """The producer whose committed sequence needs the replay."""
        if self._emit is None:
            raise RuntimeError("no committed sequence to replay")
        return self._emit.jp[1]

    def start_replay(self, envelopes: Iterator[Envelope] | Iterable[Envelope]) -> None:
        """Dequeue the committed sequence from `envelopes` (read from `replay_range()`,
        in order), then from the ring."""
        if self._emit is None:
            raise RuntimeError("no committed sequence to replay")
        self._replay = iter(envelopes)

    def has_pending(self) -> bool:
        """Whether a transaction was opened or extended since the last checkpoint (its ACK
        is then probably on its way)."""
        return bool(self._pending)

    def newest_open(self) -> int:
        """The `begun` count at which the newest transaction still awaiting its ACK began
        (0 if none awaits one): a transaction began after `begun` was N awaits its ACK if
        this is larger than N."""
        return max((p.serial for p in self._open), default=0)

    def checkpoint(self, prune_horizon_ns: int = 0) -> tuple[dict[str, int], list[ProducerState]]:
        """Read-through offsets and producer states, to restore a Sequencer from.

        With `prune_horizon_ns`, producers whose clock lags the journal's most recent
        producer by more than that are forgotten.
        """
        horizon: dict[str, int] = {}
        for (journal, _), partial in self._partials.items():
            if partial.min_clock > horizon.get(journal, 0):
                horizon[journal] = partial.min_clock
        for journal, clock in horizon.items():
            horizon[journal] = (
                clock - ((prune_horizon_ns // 100) << 4) if prune_horizon_ns > 0 else 0
            )
        states: list[ProducerState] = []
        for jp, partial in list(self._partials.items()):
            if partial.max_clock >= horizon.get(jp[0], 0):
                states.append(ProducerState(jp[0], jp[1], partial.min_clock, partial.begin))
            else:
                del self._partials[jp]
                self._open.discard(partial)
        self._pending.clear()
        return dict(self._offsets), states

    def copy(self) -> Sequencer:
        """An independent copy, between sequences (nothing dequeuing): it sequences the same
        envelopes as this one would from here, silently (a consumer checkpointing within a
        batch, `source_reader.checkpoint_within`). Costs its producers and its ring (two
        lists of `buffer` slots, once it has one)."""
        if self._emit is not None or self._replay is not None:
            raise RuntimeError("cannot copy a sequencer while it dequeues")
        other = Sequencer.__new__(Sequencer)
        partials = {jp: p.copy() for jp, p in self._partials.items()}

        def mapped(p: _Partial) -> _Partial:
            same = partials.get(p.jp)
            return same if same is not None and self._partials.get(p.jp) is p else p.copy()

        other.dequeued = None
        other._dequeued_clock = 0
        other._dequeued_slot = -1
        other._offsets = dict(self._offsets)
        other._partials = partials
        other._pending = {mapped(p) for p in self._pending}
        other._open = {mapped(p) for p in self._open}
        other.begun = self.begun
        other.dropped_through = dict(self.dropped_through)
        other._emit = None
        other._direct = None
        other._replay = None
        other._ring = list(self._ring)
        other._next = list(self._next)
        other._size = self._size
        other._head = self._head
        other._quiet = True
        return other

    # Ring ---------------------------------------------------------------------------------

    def _ring_env(self, slot: int) -> Envelope:
        env = self._ring[slot] if slot >= 0 else None
        if env is None:
            raise AssertionError(f"sequencer ring slot {slot} is empty")
        return env

    def _evict_at_head(self) -> None:
        head = self._head
        env = self._ring[head]
        if env is None:
            return
        partial = self._partials.get((env.journal, env.producer))
        if partial is not None and partial.ring_start == head:
            nxt = self._next[head]
            if partial.ring_start == partial.ring_stop and nxt == -1:
                partial.ring_start = partial.ring_stop = -1
            elif partial.ring_start != partial.ring_stop and nxt != -1:
                partial.ring_start = nxt
            else:
                raise AssertionError("ring_start == ring_stop iff next[ring_start] == -1")
        self._ring[head] = None
        self._next[head] = -1

    def _add_at_head(self, env: Envelope, partial: _Partial) -> None:
        head = self._head
        self._ring[head] = env
        self._next[head] = -1
        if partial.ring_stop == -1:
            partial.ring_start = head
        else:
            self._next[partial.ring_stop] = head
        partial.ring_stop = head
        self._head = (head + 1) % self._size

    def _log_error(self, env: Envelope, partial: _Partial, msg: str) -> None:
        if self._quiet:
            return
        log.error(
            msg,
            extra={
                "journal": env.journal,
                "begin": env.begin,
                "end": env.end,
                "producer": env.producer.hex(),
                "clock": env.clock,
                "flags": flags_name(env.flags),
                "min_clock": partial.min_clock,
                "max_clock": partial.max_clock,
                "partial_begin": partial.begin,
            },
        )
