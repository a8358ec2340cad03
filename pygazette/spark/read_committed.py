"""Read-committed reads (option `readCommitted`): the rows of committed messages only.

Journals written exactly once (Gazette's and pygazette's transactional publishers, consumers'
outputs) hold messages of transactions that may still be open or were rolled back, and ACK
messages that commit them. A reader that wants what was committed decides each message by its
UUID as Gazette's sequencer does (`pygazette.message.sequencer`, whose rules this module applies
to one journal's records in order):

- a record without a UUID commits at once;
- an OUTSIDE_TXN message commits at once, unless its clock is not above its producer's last
  acknowledged clock (a duplicate); it ends any open transaction of its producer;
- a CONTINUE_TXN message waits for its producer's next ACK_TXN (a clock not above the largest
  its producer has pending is a duplicate, dropped);
- an ACK_TXN commits its producer's waiting messages of clocks up to its own and drops those
  above; one whose clock is not above the last acknowledged one rolls them all back. ACKs are
  never rows.

A Spark partition owns the records that begin in its ranges. A message it owns is decided by
a later record, possibly one owned by the next partition or appended after the micro-batch was
planned: the partition reads ahead past its ranges (those records feed the decisions; they
are not its rows) until every message it owns is decided. A batch read reads ahead up to the
write head it was planned at (`GazettePartition.decide_through`: all its partitions decide
alike) and leaves out what is still undecided there (not committed when it was planned). A
stream waits for the decision, up to `readCommittedWaitSeconds`, as a read-committed consumer
waits for a transaction's ACK: a message cannot be left to a later micro-batch, which begins
after it.

A partition resumes from the producers' states where its range begins, as a consumer's
sequencer resumes from the producer states of its checkpoint (`ProducerStates`: each
producer's last acknowledged clock, the largest clock it has pending, and the offset of its
open transaction's first message), so that a duplicate whose first copy lies before the range
is recognised as one, and a transaction open across the range's start commits in it only what
it owns. The driver finds them (`pygazette.spark.producer_states`): a stream's offsets carry
each journal's states at the micro-batch's end (pruned as Gazette prunes a checkpoint's), and
a range split into several partitions has its states at each cut resolved when it is planned.
A read's first range starts from no history: a duplicate of a message before its starting
offset is not recognised.
"""

from __future__ import annotations

import csv
import io
import logging
from dataclasses import dataclass, field

import orjson

from pygazette.message.csv_framing import CSVFraming
from pygazette.message.framing import Framing as MessageFraming
from pygazette.message.framing import MessageDecodeError
from pygazette.message.json_framing import JSONFraming
from pygazette.message.uuid import ACK_TXN, CONTINUE_TXN, parse_uuid_text

log = logging.getLogger(__name__)

DEFAULT_WAIT_SECONDS = 60.0
_NO_UUID = (b"", 0, 0)


def uuid_parts(framing: MessageFraming, payload: bytes) -> tuple[bytes, int, int]:
    """(producer, clock, flags) of a record's message; clock 0 when it has no UUID, or when it
    does not decode (the row's own parsing reports that, as without readCommitted)."""
    try:
        if type(framing) is JSONFraming and framing.decode is None:
            # JSONFraming's own reading, inline (as its `envelopes`): one call per record.
            try:
                msg = orjson.loads(payload)
            except orjson.JSONDecodeError:
                # Maybe one Go reads (invalid UTF-8 in a string): as the framing reads it.
                msg = framing.unmarshal(payload)
            text = msg.get(framing.uuid_field) if type(msg) is dict else None
            if type(text) is not str or not text:
                text = framing.get_uuid(msg)  # Another case of the name; or refused.
        elif isinstance(framing, CSVFraming):
            try:
                text = framing.get_uuid(framing.unmarshal(payload))
            except MessageDecodeError:
                text = _lenient_csv_uuid(payload)
        else:
            text = framing.get_uuid(framing.unmarshal(payload))
        if text is None:
            return _NO_UUID
        return parse_uuid_text(text)
    except (MessageDecodeError, ValueError):  # orjson's decode error is a ValueError.
        return _NO_UUID


def _lenient_csv_uuid(payload: bytes) -> str | None:
    """The first field of a CSV record that Go's rules refuse (a quote within an unquoted
    field, text after a quoted field's closing quote), read leniently: Spark's CSV parser
    (pyarrow) still reads such a record, and makes it a row, which its UUID then decides as
    any other row's."""
    text = payload.decode("utf-8", "surrogateescape")
    if not text.startswith('"'):
        return text.split(",", 1)[0].rstrip("\r") or None
    try:
        row = next(csv.reader(io.StringIO(text, newline="")), [])  # Not strict.
    except csv.Error:
        return None
    return row[0] if row and row[0] else None


# A journal's producers at an offset: producer ID -> (last acknowledged clock, largest clock
# pending (the last acknowledged one if none), offset of the open transaction's first message
# (-1 if none)): Gazette's ProducerState, with the pending clock a reader that has already
# emitted the open transaction's earlier messages needs to drop their re-sent copies.
ProducerStates = dict[bytes, tuple[int, int, int]]

# Pruning of states carried from one micro-batch to the next, as Gazette's consumers prune
# their checkpoints (Sequencer.Checkpoint with a 24 h horizon): a producer whose largest clock
# is more than PRUNE_HORIZON_NS older than the journal's newest acknowledged clock is
# forgotten. At most MAX_PRODUCERS per journal are kept (the most recent), so that offsets
# stay small even when many producers come and go within the horizon.
PRUNE_HORIZON_NS = 24 * 3600 * 1_000_000_000
MAX_PRODUCERS = 1000


def prune_states(
    states: ProducerStates,
    horizon_ns: int = PRUNE_HORIZON_NS,
    max_producers: int = MAX_PRODUCERS,
    *,
    journal: str = "",
) -> ProducerStates:
    """`states` without the producers idle past the horizon (Gazette's rule: clocks are 100 ns
    units with 4 bits of sequence), and the oldest beyond `max_producers`."""
    if not states:
        return states
    newest = max(last_ack for last_ack, _max, _begin in states.values())
    floor = newest - ((horizon_ns // 100) << 4) if horizon_ns > 0 else 0
    kept = {p: s for p, s in states.items() if s[1] >= floor}
    if len(kept) > max_producers:
        order = sorted(kept, key=lambda p: (kept[p][1], p), reverse=True)
        log.warning(
            "%s: %d producers within the prune horizon; keeping the %d most recent (a "
            "duplicate of a message of the others is no longer recognised)",
            journal,
            len(kept),
            max_producers,
        )
        kept = {p: kept[p] for p in order[:max_producers]}
    return kept


def encode_states(states: ProducerStates) -> dict[str, list[int]]:
    """States as JSON (keys sorted: equal states encode alike)."""
    return {p.hex(): list(states[p]) for p in sorted(states)}


def decode_states(data: object) -> ProducerStates:
    if not isinstance(data, dict):
        return {}
    return {
        bytes.fromhex(p): (int(v[0]), int(v[1]), int(v[2]))
        for p, v in data.items()
        if isinstance(v, list) and len(v) == 3
    }


@dataclass(slots=True)
class _Producer:
    min_clock: int  # Its last acknowledged clock: smaller or equal clocks are duplicates.
    max_clock: int  # The largest clock of its pending messages (min_clock if none).
    pending: list[tuple[int, bytes, int]] = field(default_factory=list)  # Owned ones only.
    owned: int = 0  # Pending messages that are rows of this partition.
    begin: int = -1  # Offset of its open transaction's first message (-1: none open).


class TransactionResolver:
    """Decides one journal's messages, fed in journal order (see the module docstring)."""

    def __init__(self, journal: str, states: ProducerStates | None = None) -> None:
        self.journal = journal
        self.committed: list[tuple[int, bytes]] = []  # (offset, payload) rows, to take.
        self.pending_owned = 0  # Owned messages not yet decided.
        self.rolled_back = 0  # Owned messages dropped by a rollback (or left undecided).
        self._producers: dict[bytes, _Producer] = {
            producer: _Producer(last_ack, max_clock, begin=begin)
            for producer, (last_ack, max_clock, begin) in (states or {}).items()
        }

    def states(self) -> ProducerStates:
        """The producers' states after the records fed so far."""
        return {p: (s.min_clock, s.max_clock, s.begin) for p, s in self._producers.items()}

    def add(
        self, offset: int, payload: bytes | None, producer: bytes, clock: int, flags: int
    ) -> None:
        """Feed the next record of the journal: an owned one with its `payload`, or one read
        ahead (payload None) that only decides earlier ones."""
        if clock == 0:
            if payload is not None:
                self.committed.append((offset, payload))
            return
        p = self._producers.get(producer)
        if p is None:
            p = self._producers[producer] = _Producer(clock - 1, clock - 1)
        if flags == CONTINUE_TXN:
            if clock <= p.max_clock:
                return  # Acknowledged already, or not above what is pending: a duplicate.
            if p.max_clock == p.min_clock:
                p.begin = offset  # It opens a transaction.
            p.max_clock = clock
            if payload is not None:
                # Only owned ones are kept: a read-ahead may pass any number of other
                # messages (of other partitions, or appended since) before their ACKs.
                p.pending.append((offset, payload, clock))
                p.owned += 1
                self.pending_owned += 1
        elif flags == ACK_TXN:
            if clock <= p.min_clock:
                self._drop(p)  # A rollback.
            else:
                self._commit(p, clock)
            p.min_clock = p.max_clock = clock
            p.begin = -1
        else:  # OUTSIDE_TXN (and unknown flags, as the sequencer takes them).
            if clock <= p.min_clock:
                return  # A duplicate.
            if p.max_clock > p.min_clock:  # Pending messages, owned or not.
                log.warning(
                    "OUTSIDE_TXN message follows a pending CONTINUE_TXN in %s at %d: the "
                    "pending messages are dropped",
                    self.journal,
                    offset,
                )
                self._drop(p)
            if payload is not None:
                self.committed.append((offset, payload))
            p.min_clock = p.max_clock = clock
            p.begin = -1

    def take(self) -> list[tuple[int, bytes]]:
        """The owned rows committed since the last take, in the order they committed."""
        out, self.committed = self.committed, []
        return out

    def abandon(self) -> int:
        """Leave out every owned message still undecided; returns how many."""
        left = self.pending_owned
        for p in self._producers.values():
            self._drop(p)
        self.rolled_back -= left  # Not rolled back: undecided.
        return left

    def oldest_pending(self) -> tuple[int, bytes] | None:
        """(offset, producer) of the earliest owned message still undecided."""
        best: tuple[int, bytes] | None = None
        for producer, p in self._producers.items():
            if p.pending:
                offset = p.pending[0][0]
                if best is None or offset < best[0]:
                    best = (offset, producer)
        return best

    def _commit(self, p: _Producer, clock: int) -> None:
        for offset, payload, c in p.pending:
            if c <= clock:
                self.committed.append((offset, payload))
            else:
                self.rolled_back += 1
        self.pending_owned -= p.owned
        p.pending.clear()
        p.owned = 0

    def _drop(self, p: _Producer) -> None:
        self.rolled_back += p.owned
        self.pending_owned -= p.owned
        p.pending.clear()
        p.owned = 0


@dataclass(frozen=True, slots=True)
class CommittedReads:
    """How a partition reads committed messages: the message framing whose UUIDs decide them,
    and whether it waits for undecided ones (streams) or leaves them out at the write head
    (batch reads)."""

    framing: MessageFraming
    wait: bool
    wait_seconds: float = DEFAULT_WAIT_SECONDS
    # A stream's task whose wait runs out: False fails the query; True leaves the messages
    # of the transactions still open out (never rows, even if their ACK comes later) and
    # goes on (readCommittedOnTimeout=skip).
    skip_open: bool = False
