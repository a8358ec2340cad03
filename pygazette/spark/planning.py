"""Planning reads: journal offset ranges and fragment listings into Spark input partitions.

A journal range [begin, end) is walked through its fragment listing into segments, each read
from one fragment (directly from its store when the executor can reach it, else through a
broker) or, past the last listed fragment, through a broker. A listing that leaves a hole
with fragments after it means bytes were removed (retention, a deleted file): a data loss.

Each journal range is cut into chunks of at most the partition target size, at offsets
that depend only on the ranges and the options (never on the listing), and chunks are packed
in (journal, offset) order into partitions of up to the target size. So a micro-batch
replanned after a restart gets partitions owning the same offsets, even though its listing
has changed meanwhile (spools persisted, fragments removed): the sink's exactly-once fence,
kept per Spark partition, relies on it. Raw chunks are whole journal ranges for streams, as
raw rows are append-aligned and only fragment ends are known append boundaries inside a
range (a batch read, planned once, cuts raw ranges at its segments).

A chunk's part within a segment is a piece. A piece owns the records that *begin* in its
[own_begin, own_end) and reads past own_end to finish its last one, never past its
segment's end (a fragment never splits an append, so fragment ends are record boundaries).
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from pygazette.spark.framing import Framing
from pygazette.spark.journals import FragmentInfo
from pygazette.spark.read_committed import ProducerStates

MAX_PARTITION_BYTES = 128 << 20  # As Spark's spark.sql.files.maxPartitionBytes.
MIN_PARTITION_BYTES = 4 << 20  # As Spark's spark.sql.files.openCostInBytes.


@dataclass(frozen=True, slots=True)
class Piece:
    """Records of `journal` that begin in [own_begin, own_end).

    Reading starts at `scan_from` — a record boundary, or for newline framings (`resync`)
    the byte before `own_begin`, so that the first newline found marks the first owned
    record — and never goes past `read_end`, a record boundary. `fragment` is the one
    fragment that covers [scan_from, read_end), or None to read through a broker.
    """

    journal: str
    own_begin: int
    own_end: int
    scan_from: int
    read_end: int
    resync: bool
    fragment: FragmentInfo | None

    @property
    def size(self) -> int:
        return self.own_end - self.own_begin

    @property
    def mod_time(self) -> int:
        return self.fragment.mod_time if self.fragment is not None else 0


@dataclass(frozen=True, slots=True)
class DataLoss:
    """Bytes [begin, end) of a journal that no fragment holds any longer."""

    journal: str
    begin: int
    end: int

    def __str__(self) -> str:
        return (
            f"data loss in journal {self.journal}: offsets [{self.begin}, {self.end}) are no "
            f"longer in any fragment ({self.end - self.begin} bytes removed, e.g. by retention)"
        )


class JournalDeleted(DataLoss):
    """Bytes [begin, end) of a journal that no longer exists."""

    def __str__(self) -> str:
        return (
            f"data loss in journal {self.journal}: offsets [{self.begin}, {self.end}) cannot be "
            f"read, the journal no longer exists (it was deleted)"
        )


class GazettePartition(InputPartition):  # type: ignore[misc]
    """One Spark input partition: pieces read in order by one task.

    `decide_through` (read-committed batch reads): the write head of each journal when the
    read was planned. A partition reads ahead no further to decide the messages it owns, so
    every partition (and a retried task) decides them against the same journal content.

    `start_states` (read-committed reads): the producers' states where each of its journal
    ranges begins, by (journal, offset); a range not in it starts without history.
    """

    def __init__(self, pieces: list[Piece]) -> None:
        self.pieces = pieces
        self.decide_through: dict[str, int] = {}
        self.start_states: dict[tuple[str, int], ProducerStates] = {}

    def range_starts(self) -> Iterator[tuple[str, int]]:
        """(journal, offset) where each of its journal ranges (contiguous pieces) begins: where
        a reader starts a new `TransactionResolver`."""
        prev: Piece | None = None
        for piece in self.pieces:
            if prev is None or piece.journal != prev.journal or piece.own_begin != prev.own_end:
                yield piece.journal, piece.own_begin
            prev = piece

    @property
    def size(self) -> int:
        return sum(p.size for p in self.pieces)


@dataclass(frozen=True, slots=True)
class _Segment:
    begin: int
    end: int
    fragment: FragmentInfo | None


def segments(
    journal: str, begin: int, end: int, listing: list[FragmentInfo]
) -> tuple[list[_Segment], list[DataLoss]]:
    """Walk [begin, end) through the listing; holes followed by a fragment are data loss."""
    out: list[_Segment] = []
    losses: list[DataLoss] = []
    frags = sorted((f for f in listing if f.end > f.begin), key=lambda f: (f.begin, -f.end))
    cursor = begin
    best: FragmentInfo | None = None  # Reaching furthest of the fragments beginning <= cursor.
    i = 0
    while cursor < end:
        while i < len(frags) and frags[i].begin <= cursor:
            if best is None or _better(frags[i], best):
                best = frags[i]
            i += 1
        if best is not None and best.end > cursor:
            stop = min(best.end, end)
            out.append(_Segment(cursor, stop, best))
            cursor = stop
            continue
        if i < len(frags):
            stop = min(frags[i].begin, end)
            losses.append(DataLoss(journal, cursor, stop))
            cursor = stop
            continue
        # Past the last listed fragment: content committed since the listing; a broker has it.
        out.append(_Segment(cursor, end, None))
        cursor = end
    return out, losses


def _better(f: FragmentInfo, best: FragmentInfo) -> bool:
    """Prefer the fragment reaching further; on a tie, one readable directly from a store."""
    if f.end != best.end:
        return f.end > best.end
    return bool(f.url) and not best.url


def chunk_bounds(
    begin: int, end: int, segs: list[_Segment], framing: Framing, target: int, *, streaming: bool
) -> list[int]:
    """Offsets cutting [begin, end) into chunks of at most `target` bytes (raw: see above)."""
    if framing is Framing.RAW:
        if streaming:
            return [begin, end]
        return sorted({begin, end, *(s.end for s in segs if begin < s.end < end)})
    size = end - begin
    count = max(1, math.ceil(size / target))
    return [begin + (size * i) // count for i in range(count)] + [end]


def chunk_pieces(
    journal: str, lo: int, hi: int, segs: list[_Segment], framing: Framing
) -> list[Piece]:
    """The pieces owning [lo, hi): its parts within each segment."""
    pieces = []
    for seg in segs:
        a, b = max(lo, seg.begin), min(hi, seg.end)
        if b <= a:
            continue
        resync = framing.resyncs and a > seg.begin
        pieces.append(
            Piece(
                journal=journal,
                own_begin=a,
                own_end=b,
                scan_from=a - 1 if resync else seg.begin,
                read_end=seg.end,
                resync=resync,
                fragment=seg.fragment,
            )
        )
    return pieces


def partition_target(total: int, min_partitions: int | None, *, streaming: bool) -> int:
    """Bytes per partition: at least `min_partitions` of them, each at most 128 MiB.

    Batch reads also aim for one partition per driver core (at least 4 MiB each), as Spark's
    file sources do; streams do not, so their plans never depend on the machine.
    """
    if min_partitions:
        return max(1, min(MAX_PARTITION_BYTES, math.ceil(total / min_partitions)))
    if streaming:
        return MAX_PARTITION_BYTES
    cores = os.cpu_count() or 1
    return min(MAX_PARTITION_BYTES, max(MIN_PARTITION_BYTES, math.ceil(total / cores)))


def plan(
    ranges: dict[str, tuple[int, int]],
    listings: dict[str, list[FragmentInfo]],
    framing: Framing,
    *,
    min_partitions: int | None,
    streaming: bool,
    gone: frozenset[str] = frozenset(),
) -> tuple[list[GazettePartition], list[DataLoss]]:
    """Partitions reading every journal's [begin, end), and the data losses found. The
    ranges of journals `gone` (deleted) are lost, but still planned as chunks without pieces,
    so that the other journals' partitions stay as they were planned before."""
    total = sum(end - begin for begin, end in ranges.values() if end > begin)
    target = partition_target(total, min_partitions, streaming=streaming)
    chunks: list[tuple[int, list[Piece]]] = []
    losses: list[DataLoss] = []
    for journal in sorted(ranges):
        begin, end = ranges[journal]
        if end <= begin:
            continue
        segs: list[_Segment]
        lost: list[DataLoss]
        if journal in gone:
            segs, lost = [], [JournalDeleted(journal, begin, end)]
        else:
            segs, lost = segments(journal, begin, end, listings.get(journal, []))
        losses.extend(lost)
        bounds = chunk_bounds(begin, end, segs, framing, target, streaming=streaming)
        first = 0  # Segments are in offset order and chunks too: walk both once.
        for lo, hi in itertools.pairwise(bounds):
            if hi <= lo:
                continue
            while first < len(segs) and segs[first].end <= lo:
                first += 1
            last = first
            while last < len(segs) and segs[last].begin < hi:
                last += 1
            chunks.append((hi - lo, chunk_pieces(journal, lo, hi, segs[first:last], framing)))
    return pack(chunks, target), losses


def pack(chunks: list[tuple[int, list[Piece]]], target: int) -> list[GazettePartition]:
    """Greedily pack chunks (their size and pieces), in order, into partitions of up to
    `target` bytes. A chunk wholly lost (no pieces) still counts, so that the partitions
    after it do not depend on what was lost."""
    out: list[GazettePartition] = []
    current: list[Piece] = []
    size = count = 0
    for chunk_size, pieces in chunks:
        if count and size + chunk_size > target:
            out.append(GazettePartition(current))
            current, size, count = [], 0, 0
        current.extend(pieces)
        size += chunk_size
        count += 1
    if count:
        out.append(GazettePartition(current))
    return out
