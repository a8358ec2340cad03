"""Log segments: contiguous runs of recorded operations written by one author.

A `Segment` names the sequence numbers `[first_seq_no, last_seq_no]` of one author's
operations in one log, the byte offset where the first of them may be found
(`first_offset`: exact if a player produced the segment, a lower bound if a recorder did)
and the offset just past the last (`last_offset`, zero when unknown), plus the FSM checksum
expected by the first operation.

A `SegmentSet` is an ordered, non-overlapping collection of segments: sequence numbers
strictly increase from one segment to the next, offsets of one log never decrease, and only
a suffix of a log's segments may have an unknown (zero) `last_offset`. Adding a segment
merges it with the segments it overlaps or directly continues (same author and log).
Players flatten the segments of hinted file nodes into a set to learn which stretches of
the log they must read; pruning intersects the set with fragments' offset ranges to learn
which fragments are still needed.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import overload

from pygazette.protocol.pb import recoverylog_pb2 as rpb
from pygazette.protocol.shard_validation import validate_segment

__all__ = ["Segment", "SegmentError", "SegmentSet"]


class SegmentError(ValueError):
    """Segments which contradict each other (they cannot describe one consistent log)."""


@dataclass(frozen=True, slots=True)
class Segment:
    """One author's contiguous run of operations in one log (see the module docstring)."""

    author: int
    first_seq_no: int
    first_offset: int
    first_checksum: int
    last_seq_no: int
    last_offset: int
    log: str

    @classmethod
    def from_pb(cls, seg: rpb.Segment, implied_log: str = "") -> Segment:
        """The segment of a protobuf Segment; an empty `log` takes `implied_log`."""
        return cls(
            author=seg.author,
            first_seq_no=seg.first_seq_no,
            first_offset=seg.first_offset,
            first_checksum=seg.first_checksum,
            last_seq_no=seg.last_seq_no,
            last_offset=seg.last_offset,
            log=seg.log or implied_log,
        )

    def to_pb(self, implied_log: str = "") -> rpb.Segment:
        """The protobuf Segment; `log` is left empty where it equals `implied_log`."""
        return rpb.Segment(
            author=self.author,
            first_seq_no=self.first_seq_no,
            first_offset=self.first_offset,
            first_checksum=self.first_checksum,
            last_seq_no=self.last_seq_no,
            last_offset=self.last_offset,
            log="" if self.log == implied_log else self.log,
        )

    def validate(self) -> None:
        """Raise `ValidationError` if the segment is inconsistent in itself (Gazette's
        Segment.Validate)."""
        validate_segment(self.to_pb())


class _NotReducible(Exception):
    """Two segments are consistent, but cannot be merged into one."""


def _nonzero_and_less(a: int, b: int) -> bool:
    return a != 0 and a < b


def _reduce(a: Segment, b: Segment) -> Segment:
    """The single segment covering both `a` and `b`.

    Raises `_NotReducible` if they are disjoint (or adjacent, but of different authors or
    logs), and `SegmentError` if they contradict each other.
    """
    # Order so that a starts first, and of two equal starts, a is the longer.
    if a.first_seq_no > b.first_seq_no or (
        a.first_seq_no == b.first_seq_no and a.last_seq_no < b.last_seq_no
    ):
        a, b = b, a
    same_log = a.log == b.log

    # Offsets of one log must be ordered like sequence numbers.
    if a.first_seq_no < b.first_seq_no and same_log and a.first_offset > b.first_offset:
        raise SegmentError(f"expected monotonic FirstOffset: {a} vs {b}")
    if a.first_seq_no < b.first_seq_no and a.last_offset == 0 and b.last_offset != 0:
        raise SegmentError(f"expected preceding Segment to also include LastOffset: {a} vs {b}")
    if a.last_offset == 0 and not same_log:
        raise SegmentError(
            f"Segment cannot use a different log where preceding Segment.LastOffset is zero: "
            f"{a} vs {b}"
        )
    if same_log and (
        (a.last_seq_no <= b.last_seq_no and _nonzero_and_less(b.last_offset, a.last_offset))
        or (a.last_seq_no >= b.last_seq_no and _nonzero_and_less(a.last_offset, b.last_offset))
    ):
        raise SegmentError(f"expected monotonic LastOffset: {a} vs {b}")
    if a.first_seq_no == b.first_seq_no and a.first_checksum != b.first_checksum:
        raise SegmentError(f"expected FirstChecksum equality: {a} vs {b}")

    # Disjoint, or adjacent but not continuing one another.
    if a.last_seq_no + 1 < b.first_seq_no:
        raise _NotReducible
    if a.last_seq_no + 1 == b.first_seq_no and (a.author != b.author or not same_log):
        raise _NotReducible

    # What remains overlaps or is adjacent, and must be of one author and log.
    if a.author != b.author:
        raise SegmentError(f"expected Segment Author equality: {a} vs {b}")
    if not same_log:
        raise SegmentError(f"expected Segment Log equality: {a} vs {b}")

    first_offset, last_seq_no, last_offset = a.first_offset, a.last_seq_no, a.last_offset
    # FirstOffset is a lower bound: prefer the tighter (larger) one.
    if a.first_seq_no == b.first_seq_no and a.first_offset < b.first_offset:
        first_offset = b.first_offset
    # LastOffset is optional: prefer a known one (monotonicity was checked above).
    if a.last_seq_no == b.last_seq_no and a.last_offset == 0:
        last_offset = b.last_offset
    # Overlapping or adjacent: extend through b.
    if a.last_seq_no < b.last_seq_no:
        last_seq_no, last_offset = b.last_seq_no, b.last_offset
    return replace(a, first_offset=first_offset, last_seq_no=last_seq_no, last_offset=last_offset)


def _first_seq_no(segment: Segment) -> int:
    return segment.first_seq_no


class SegmentSet(Sequence[Segment]):
    """Ordered, non-overlapping segments (see the module docstring)."""

    __slots__ = ("_segments",)

    def __init__(self, segments: Sequence[Segment] = ()) -> None:
        self._segments: list[Segment] = []
        for segment in segments:
            self.add(segment)

    def add(self, segment: Segment) -> None:
        """Add `segment`, merging it with segments it overlaps or continues.

        Raises `ValidationError` for an invalid segment, and `SegmentError` if it contradicts
        the set; the set is unchanged then.
        """
        segment.validate()
        segs = self._segments
        # Searched by key, not through a list of every segment's key: hints add each of
        # their segments in turn, so that list made parsing hints quadratic in their files.
        begin = bisect.bisect_left(segs, segment.first_seq_no, key=_first_seq_no)

        # At most one preceding segment can reduce with `segment` (starts strictly increase).
        if begin > 0:
            try:
                segment = _reduce(segs[begin - 1], segment)
                begin -= 1
            except _NotReducible:
                pass
        # Then any number of following ones (starting over with a merged predecessor, which
        # reduces with its own merge trivially).
        end = begin
        while end < len(segs):
            try:
                merged = _reduce(segs[end], segment)
            except _NotReducible:
                break
            segment = merged
            end += 1
        segs[begin:end] = [segment]

    def intersect(self, log: str, first_offset: int, last_offset: int) -> SegmentSet:
        """The segments overlapping the byte range `[first_offset, last_offset)` of `log`.

        Every segment of the set must be of `log`.
        """
        if last_offset < first_offset:
            raise ValueError(f"invalid range [{first_offset}, {last_offset})")
        segs = self._segments
        for s in segs:
            if s.log != log:
                raise ValueError(f"segment of log {s.log!r} is not of {log!r}")
        # The first segment starting at or after `last_offset` ends the range.
        j = bisect.bisect_left([s.first_offset for s in segs], last_offset)
        # Walk back to the first segment which ends at or before `first_offset`. Last offsets
        # never decrease, and only a suffix may be zero (unbounded), so none before it overlaps.
        i = j
        while i > 0 and (segs[i - 1].last_offset == 0 or segs[i - 1].last_offset > first_offset):
            i -= 1
        out = SegmentSet()
        out._segments = segs[i:j]
        return out

    @overload
    def __getitem__(self, index: int) -> Segment: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Segment]: ...
    def __getitem__(self, index: int | slice) -> Segment | Sequence[Segment]:
        return self._segments[index]

    def __len__(self) -> int:
        return len(self._segments)

    def __iter__(self) -> Iterator[Segment]:
        return iter(self._segments)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SegmentSet):
            return self._segments == other._segments
        if isinstance(other, list):
            return self._segments == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SegmentSet({self._segments!r})"
