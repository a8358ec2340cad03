"""The recovery-log state machine: which recorded operations apply, and in what order.

A recovery log is a journal of `RecordedOp`s, each a fixed frame (see
`pygazette.message.fixed_framing`). Every operation carries a sequence number and the FSM
checksum it expects: the CRC-32C (Castagnoli) of the framed payloads (the marshaled
`RecordedOp`, without its 8-byte frame header) of every operation applied before it,
chained by extending the running checksum with each payload in turn. An operation applies
only if both match the FSM's `next_seq_no` and `next_checksum`, which makes the log
self-validating: interleaved writes of competing recorders, duplicates and garbage all fail
to sequence and are skipped by players.

File nodes ("fnodes") play the role of inodes: a file created by the operation with
sequence number N is fnode N for the rest of its life, across any links and unlinks of
paths. Paths are relative to the recorded directory, written with a leading slash
("/a/b"), as Gazette writes them. Properties are small files kept inline (content in the
op itself, and in hints) rather than as fnodes.

`FSMHints` describe an FSM compactly: for every live fnode, the log segments holding its
operations, plus properties. An FSM built from hints (`FSM.from_hints`) replays exactly
the hinted history: it expects the hinted segments' authors in order, jumps over sequence
numbers between segments, and tracks only fnodes that are still live when the hints were
built.

`Author` identifies a recorder; its `fence()` is the journal register (label
``author=<id in base 32>``) by which a player hands the log off: every append of a
recorder checks its own fence, so once a new author's fence replaces it, a deposed
recorder can append nothing.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import google_crc32c

from pygazette.consumer.recoverylog.segments import Segment, SegmentSet
from pygazette.protocol.errors import ValidationError
from pygazette.protocol.pb import protocol_pb2 as pb
from pygazette.protocol.pb import recoverylog_pb2 as rpb

__all__ = [
    "FENCE_LABEL",
    "FSM",
    "Author",
    "ChecksumMismatch",
    "ExpectedHintedFnode",
    "FSMError",
    "FnodeNotTracked",
    "FnodeState",
    "HintsSnapshot",
    "LinkExists",
    "NoSuchLink",
    "NotHintedAuthor",
    "PropertyExists",
    "WrongSeqNo",
    "live_log_segments",
    "validate_hints",
]

# Name of the journal register label which fences a recovery log to one author.
FENCE_LABEL = "author"

_MAX_AUTHOR = 0xFFFFFFFF
_B32_DIGITS = "0123456789abcdefghijklmnopqrstuv"


def _format_base32(value: int) -> str:
    """`value` in base 32 with digits 0-9a-v (as Go's strconv.FormatUint(v, 32))."""
    if value == 0:
        return "0"
    digits: list[str] = []
    while value:  # At most 7 iterations for a uint32.
        value, rem = divmod(value, 32)
        digits.append(_B32_DIGITS[rem])
    return "".join(reversed(digits))


class Author(int):
    """The random, nonzero 32-bit ID of a recorder, stamped on every op it writes."""

    __slots__ = ()

    def __new__(cls, value: int) -> Author:
        if not 0 <= value <= _MAX_AUTHOR:
            raise ValueError(f"author {value} is not a uint32")
        return super().__new__(cls, value)

    @classmethod
    def random(cls) -> Author:
        """A new random author in [1, 2**32 - 1)."""
        return cls(secrets.randbelow(_MAX_AUTHOR - 1) + 1)

    def fence(self) -> pb.LabelSet:
        """The journal register that fences the log to this author."""
        return pb.LabelSet(labels=[pb.Label(name=FENCE_LABEL, value=_format_base32(int(self)))])

    def fence_selector(self) -> pb.LabelSelector:
        """The register check of this author's appends: its fence must be in place."""
        return pb.LabelSelector(include=self.fence())

    def __repr__(self) -> str:
        return f"Author({int(self)})"


# Why an operation did not apply. ------------------------------------------------------------


class FSMError(ValueError):
    """An operation which does not apply to the FSM (the FSM is unchanged)."""

    message = "operation does not apply"

    def __init__(self, detail: str = "") -> None:
        super().__init__(f"{self.message}: {detail}" if detail else self.message)


class ChecksumMismatch(FSMError):
    message = "checksum mismatch"


class ExpectedHintedFnode(FSMError):
    message = "op is not create, and an Fnode was hinted"


class FnodeNotTracked(FSMError):
    """Not raised by `FSM.apply`, which sequences such ops and returns False (see there)."""

    message = "fnode not tracked"


class LinkExists(FSMError):
    message = "link exists"


class NoSuchLink(FSMError):
    message = "fnode has no such link"


class NotHintedAuthor(FSMError):
    message = "op author does not match the next hinted author"


class PropertyExists(FSMError):
    message = "property exists"


class WrongSeqNo(FSMError):
    message = "wrong sequence number"


# State. -------------------------------------------------------------------------------------


@dataclass(slots=True)
class FnodeState:
    """A live fnode: its current paths, and the log segments holding its operations."""

    links: set[str]
    # Immutable, so that snapshots (HintsSnapshot) may share them.
    segments: tuple[Segment, ...] = ()


@dataclass(frozen=True, slots=True)
class HintsSnapshot:
    """The hinted state of an FSM at one point in time, cheap to take (see `FSM.snapshot`)."""

    nodes: tuple[tuple[int, tuple[Segment, ...]], ...]
    properties: tuple[tuple[str, str], ...]

    def to_hints(self, log: str) -> rpb.FSMHints:
        """FSMHints of the snapshot, with `log` as the implied log of segments."""
        hints = rpb.FSMHints(log=log)
        for fnode, segments in sorted(self.nodes, key=lambda n: n[0]):
            hints.live_nodes.add(fnode=fnode, segments=[s.to_pb(log) for s in segments])
        for path, content in self.properties:
            hints.properties.add(path=path, content=content)
        return hints


def live_log_segments(hints: rpb.FSMHints) -> tuple[list[int], SegmentSet]:
    """The hinted live fnodes in order, and the set of log segments holding all of them.

    Raises `ValueError` (`ValidationError`, `SegmentError`) if the hints are inconsistent.
    """
    fnodes: list[int] = []
    segments = SegmentSet()
    for node in hints.live_nodes:
        if not node.segments or node.segments[0].first_seq_no != node.fnode:
            raise ValidationError(f"expected Fnode to match Segment FirstSeqNo: {node}")
        if fnodes and fnodes[-1] >= node.fnode:
            raise ValidationError(
                f"expected monotonic Fnode ordering: {fnodes[-1]} vs {node.fnode}"
            )
        fnodes.append(node.fnode)
        for seg in node.segments:
            segments.add(Segment.from_pb(seg, hints.log))
    if segments and segments[-1].log != hints.log:
        raise ValidationError(
            f"expected hints.Log {hints.log} to equal the last Segment Log {segments[-1].log}"
        )
    return fnodes, segments


def validate_hints(hints: rpb.FSMHints) -> None:
    """Raise `ValidationError` unless every segment is valid and none repeats `hints.log`."""
    for node in hints.live_nodes:
        for seg in node.segments:
            if seg.log and seg.log == hints.log:
                raise ValidationError("contained segment.Log duplicates FSMHints.Log")
            try:
                Segment.from_pb(seg, hints.log).validate()
            except ValidationError as err:
                raise err.extend("Segment") from None


class FSM:
    """Applies `RecordedOp`s in sequence (see the module docstring).

    Public state, to be read (not modified) by recorders and players:

    - `next_seq_no`, `next_checksum`: what the next operation must carry;
    - `last_log`: the log of the last applied operation (initially the hinted log);
    - `properties`: path → content;
    - `live_nodes`: fnode → `FnodeState`; `links`: path → fnode of every live path;
    - `read_through`: an offset of `last_log` known to be at or below its write head and
      past every applied operation (0 if unknown); players and recorders maintain it so that
      a recorder taking over an FSM knows a lower bound of the offsets it will write at.
    """

    def __init__(self, log: str) -> None:
        if not log:
            raise ValidationError("hinted log not provided")
        self.next_seq_no = 1
        self.next_checksum = 0
        self.last_log = log
        self.properties: dict[str, str] = {}
        self.live_nodes: dict[int, FnodeState] = {}
        self.links: dict[str, int] = {}
        self.read_through = 0
        # Remaining hinted segments and fnodes, consumed from the front.
        self._hinted_segments: list[Segment] = []
        self._segment_index = 0
        self._hinted_fnodes: list[int] = []
        self._fnode_index = 0

    @classmethod
    def from_hints(cls, hints: rpb.FSMHints) -> FSM:
        """An FSM prepared to replay the history `hints` describe."""
        fsm = cls(hints.log)
        fnodes, segments = live_log_segments(hints)
        fsm._hinted_fnodes = fnodes
        fsm._hinted_segments = list(segments)
        if segments:
            fsm.next_seq_no = segments[0].first_seq_no
            fsm.next_checksum = segments[0].first_checksum
        for prop in hints.properties:
            fsm.properties[prop.path] = prop.content
        return fsm

    # Hints. -------------------------------------------------------------------------------

    @property
    def hinted_segments(self) -> list[Segment]:
        """The hinted segments not yet fully applied, in order."""
        return self._hinted_segments[self._segment_index :]

    def next_hinted_segment(self) -> Segment | None:
        """The hinted segment holding the next op to apply, if hints remain."""
        if self._segment_index < len(self._hinted_segments):
            return self._hinted_segments[self._segment_index]
        return None

    def has_remaining_hints(self) -> bool:
        return self._segment_index < len(self._hinted_segments) or self._fnode_index < len(
            self._hinted_fnodes
        )

    def snapshot(self) -> HintsSnapshot:
        """The current live fnodes' segments and properties, for building hints later."""
        return HintsSnapshot(
            nodes=tuple((fnode, node.segments) for fnode, node in self.live_nodes.items()),
            properties=tuple(self.properties.items()),
        )

    def build_hints(self, log: str) -> rpb.FSMHints:
        """Hints from which a new FSM replays this one's state, with `log` implied."""
        return self.snapshot().to_hints(log)

    # Applying operations. -----------------------------------------------------------------

    def apply(self, op: rpb.RecordedOp, payload: bytes) -> bool:
        """Apply `op`, whose marshaled form (the frame payload) is `payload`.

        `op.first_offset`, `op.last_offset` and `op.log` must be set: they locate the op in
        the log (see `Segment`). Returns True if the op applied; False if it was sequenced
        (the FSM moved on past it) but its fnode is not tracked, because the fnode was deleted
        before the hints were built (or never existed): local effects are skipped then.
        Raises an `FSMError` (and nothing changes) if the op does not apply.
        """
        segments = self._hinted_segments
        index = self._segment_index
        if index < len(segments) and segments[index].author != op.author:
            # Possibly well sequenced, but by an author outside the hinted history: a dead
            # branch of the log.
            raise NotHintedAuthor
        if op.seq_no != self.next_seq_no:
            raise WrongSeqNo(f"{op.seq_no} (expected {self.next_seq_no})")
        if op.checksum != self.next_checksum:
            raise ChecksumMismatch(f"{op.checksum:#010x} (expected {self.next_checksum:#010x})")

        tracked = True
        if op.HasField("create"):
            tracked = self._apply_create(op)
        elif (
            self._fnode_index < len(self._hinted_fnodes)
            and self._hinted_fnodes[self._fnode_index] == op.seq_no
        ):
            raise ExpectedHintedFnode
        elif op.HasField("link"):
            tracked = self._apply_link(op)
        elif op.HasField("unlink"):
            tracked = self._apply_unlink(op)
        elif op.HasField("write"):
            tracked = self._apply_write(op)
        elif op.HasField("property"):
            self._apply_property(op.property)
        # Else a no-op, which only sequences (hand-offs).

        self.next_seq_no += 1
        self.next_checksum = google_crc32c.extend(self.next_checksum, payload)
        self.last_log = op.log

        # Done with the current hinted segment? Jump to the next one.
        if index < len(segments) and segments[index].last_seq_no < self.next_seq_no:
            index += 1
            self._segment_index = index
            if index < len(segments):
                self.next_seq_no = segments[index].first_seq_no
                self.next_checksum = segments[index].first_checksum
        return tracked

    def _apply_create(self, op: rpb.RecordedOp) -> bool:
        path = op.create.path
        if path in self.links:
            raise LinkExists(path)
        if path in self.properties:
            raise PropertyExists(path)
        fnode = op.seq_no
        fnodes, at = self._hinted_fnodes, self._fnode_index
        if at < len(fnodes) or self._segment_index < len(self._hinted_segments):
            # Replaying hinted history: only hinted fnodes were live when the hints were
            # built. Another one was deleted before, maybe by ops of a stretch that replay
            # jumps over: tracked, it would come back, and its later ops fail to apply
            # (stalling the FSM). So too after the last hinted fnode's creation, while hinted
            # segments remain (Gazette's FSM tracks those: its player resurrects them).
            if at >= len(fnodes) or fnodes[at] != fnode:
                return False
            self._fnode_index = at + 1
        node = FnodeState(links={path})
        node.segments = self._extend(node.segments, op)
        self.live_nodes[fnode] = node
        self.links[path] = fnode
        return True

    def _apply_link(self, op: rpb.RecordedOp) -> bool:
        fnode, path = op.link.fnode, op.link.path
        if path in self.links:
            raise LinkExists(path)
        if path in self.properties:
            raise PropertyExists(path)
        node = self.live_nodes.get(fnode)
        if node is None:
            return False
        node.links.add(path)
        self.links[path] = fnode
        node.segments = self._extend(node.segments, op)
        return True

    def _apply_unlink(self, op: rpb.RecordedOp) -> bool:
        fnode, path = op.unlink.fnode, op.unlink.path
        node = self.live_nodes.get(fnode)
        if node is None:
            return False
        if path not in node.links:
            raise NoSuchLink(path)
        del self.links[path]
        node.links.discard(path)
        node.segments = self._extend(node.segments, op)
        if not node.links:
            del self.live_nodes[fnode]  # No paths remain: the fnode is gone.
        return True

    def _apply_write(self, op: rpb.RecordedOp) -> bool:
        node = self.live_nodes.get(op.write.fnode)
        if node is None:
            return False
        node.segments = self._extend(node.segments, op)
        return True

    def _apply_property(self, prop: rpb.Property) -> None:
        if prop.path in self.links:
            raise LinkExists(prop.path)
        if self._segment_index < len(self._hinted_segments):
            # Replaying hinted history, which is older than the hints: their properties are
            # the newest. (Replay jumps over ops between hinted segments, so applying this
            # one could leave an update which was jumped over undone.)
            return
        self.properties[prop.path] = prop.content

    @staticmethod
    def _extend(segments: tuple[Segment, ...], op: rpb.RecordedOp) -> tuple[Segment, ...]:
        """`segments` with `op` added: extending the last segment if it is of the same author
        and log, else starting a new one."""
        if segments:
            last = segments[-1]
            if last.author == op.author and last.log == op.log:
                return (
                    *segments[:-1],
                    Segment(
                        author=last.author,
                        first_seq_no=last.first_seq_no,
                        first_offset=last.first_offset,
                        first_checksum=last.first_checksum,
                        last_seq_no=op.seq_no,
                        last_offset=op.last_offset,
                        log=last.log,
                    ),
                )
        return (
            *segments,
            Segment(
                author=op.author,
                first_seq_no=op.seq_no,
                first_offset=op.first_offset,
                first_checksum=op.checksum,
                last_seq_no=op.seq_no,
                last_offset=op.last_offset,
                log=op.log,
            ),
        )

    def __repr__(self) -> str:
        return (
            f"FSM(log={self.last_log!r}, next_seq_no={self.next_seq_no}, "
            f"next_checksum={self.next_checksum:#010x}, live_nodes={len(self.live_nodes)}, "
            f"properties={len(self.properties)})"
        )
